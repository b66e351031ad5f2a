package discovery

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// tokenAuth checks "Authorization: Bearer <token>" against a token kept in a file (a
// mounted Secret). The file is read when the server is built, which fails if it is empty
// or unreadable, and re-read every reload interval, so a rotated Secret takes effect
// without a restart; a re-read that fails keeps the previous token and logs why. A file
// that does not exist yet (an optional Secret not created so far) is no error: until it
// appears every protected request is refused with 503, never served openly.
type tokenAuth struct {
	path   string
	digest atomic.Pointer[[sha256.Size]byte]
}

func newTokenAuth(path string) (*tokenAuth, error) {
	a := &tokenAuth{path: path}
	if err := a.load(); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return a, nil
}

// load reads the token file. Only the digest is kept: comparing digests of equal length
// in constant time leaks neither the token's bytes nor its length.
func (a *tokenAuth) load() error {
	b, err := os.ReadFile(a.path)
	if err != nil {
		return fmt.Errorf("reading discovery token file: %w", err)
	}
	tok := bytes.TrimSpace(b)
	if len(tok) == 0 {
		return fmt.Errorf("discovery token file %s is empty", a.path)
	}
	d := sha256.Sum256(tok)
	a.digest.Store(&d)
	return nil
}

// reloadLoop re-reads the token file every interval until ctx ends.
func (a *tokenAuth) reloadLoop(ctx context.Context, interval time.Duration, log logr.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			had := a.digest.Load() != nil
			err := a.load()
			switch {
			case err == nil && !had:
				log.Info("discovery token file present; serving callers that send it", "path", a.path)
			case err != nil && had:
				log.Error(err, "keeping the previous discovery token")
			}
		}
	}
}

const authRealm = `Bearer realm="egress-proxies-operator"`

func (a *tokenAuth) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get("Authorization")
		tok, ok := strings.CutPrefix(h, "Bearer ")
		if !ok || tok == "" {
			w.Header().Set("WWW-Authenticate", authRealm)
			writeError(w, &apiError{status: http.StatusUnauthorized, Message: "missing bearer token"})
			return
		}
		want := a.digest.Load()
		if want == nil {
			writeError(w, &apiError{status: http.StatusServiceUnavailable,
				Message: fmt.Sprintf("no discovery token is configured yet: %s does not exist (create the Secret it is mounted from)", a.path)})
			return
		}
		got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
		if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", authRealm+`, error="invalid_token"`)
			writeError(w, &apiError{status: http.StatusUnauthorized, Message: "invalid bearer token"})
			return
		}
		next.ServeHTTP(w, r)
	})
}
