package imagecache

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestSourceReaderKeepsTheSourceError(t *testing.T) {
	boom := errors.New("connection reset by mirror")
	src := NewSourceReader(io.MultiReader(strings.NewReader("0123456789"), iotest.ErrReader(boom)))
	got, err := io.ReadAll(src)
	if err != nil || string(got) != "0123456789" {
		t.Fatalf("the reader handed to libvirt must end cleanly: %q, %v", got, err)
	}
	n, digest, kept := src.Finish()
	sum := sha256.Sum256([]byte("0123456789"))
	if n != 10 || digest != hex.EncodeToString(sum[:]) || !errors.Is(kept, boom) {
		t.Fatalf("finish = %d, %s, %v", n, digest, kept)
	}
	if m, err := src.Read(make([]byte, 4)); m != 0 || err != io.EOF {
		t.Fatalf("a finished reader must read nothing: %d, %v", m, err)
	}
}
