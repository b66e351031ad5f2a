package client

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// tokenFileMaxAge is how long a token read from Config.TokenFile is used before the file
// is read again even though it looks unchanged, as client-go's cached file token source
// does every minute.
const tokenFileMaxAge = time.Minute

// tokenFile is Config.TokenFile. The kubelet rotates a projected ServiceAccount token by
// writing a new file and swapping a symlink to it, so a changed modification time, size
// or file (inode) means a new token; checking them costs one stat per API call.
type tokenFile struct {
	path string

	mu     sync.Mutex
	token  string
	info   os.FileInfo // the file the token was read from
	readAt time.Time
}

func newTokenFile(path string) (*tokenFile, error) {
	f := &tokenFile{path: path}
	if _, err := f.get(); err != nil {
		return nil, err
	}
	return f, nil
}

// get returns the token, reading the file again when it changed or tokenFileMaxAge has
// passed. A file that cannot be read, or is empty, after a token was read once leaves
// that token in use (a rotation is atomic, so this is a passing state or the token has
// simply not changed); before, it is an error naming the file.
func (f *tokenFile) get() (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	info, err := os.Stat(f.path)
	if err == nil && f.info != nil && os.SameFile(info, f.info) && info.ModTime().Equal(f.info.ModTime()) &&
		info.Size() == f.info.Size() && time.Since(f.readAt) < tokenFileMaxAge {
		return f.token, nil
	}
	var b []byte
	if err == nil {
		b, err = os.ReadFile(f.path)
	}
	token := strings.TrimSpace(string(b))
	if err == nil && token == "" {
		err = errors.New("the file is empty")
	}
	switch {
	case err == nil:
		f.token, f.info, f.readAt = token, info, time.Now()
	case f.token == "":
		return "", fmt.Errorf("discovery token file %s: %w", f.path, err)
	}
	return f.token, nil
}
