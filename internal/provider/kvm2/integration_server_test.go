//go:build integration

package kvm2

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// itImageServer serves one image on loopback, with a Content-Length, at any path, and counts
// the requests. With a gate it sends the first gateAt bytes of a GET and then holds the
// rest back until the gate opens (or the client goes away): an upload that is stuck in
// the middle, for as long as a test needs it to be.
type itImageServer struct {
	*httptest.Server
	size int64
	open func() io.Reader

	gets, heads atomic.Int64
	sent        atomic.Int64 // bytes of the current GET written so far

	gateAt   int64
	gate     chan struct{}
	gateOnce sync.Once
}

// itNewImageServer serves body.
func itNewImageServer(t testing.TB, body []byte) *itImageServer {
	return itStartImageServer(t, int64(len(body)), func() io.Reader { return bytes.NewReader(body) }, 0)
}

// itNewPatternServer serves size bytes of a repeating non-zero pattern, generated on the
// fly; with gateAt > 0 the body stops after gateAt bytes until openGate.
func itNewPatternServer(t testing.TB, size, gateAt int64) *itImageServer {
	return itStartImageServer(t, size, func() io.Reader { return io.LimitReader(&itPatternReader{}, size) }, gateAt)
}

func itStartImageServer(t testing.TB, size int64, open func() io.Reader, gateAt int64) *itImageServer {
	s := &itImageServer{size: size, open: open, gateAt: gateAt, gate: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.openGate()
		s.Server.CloseClientConnections()
		s.Server.Close()
	})
	return s
}

// openGate lets a held-back body continue.
func (s *itImageServer) openGate() { s.gateOnce.Do(func() { close(s.gate) }) }

func (s *itImageServer) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Length", strconv.FormatInt(s.size, 10))
	w.Header().Set("Content-Type", "application/octet-stream")
	if r.Method == http.MethodHead {
		s.heads.Add(1)
		return
	}
	s.gets.Add(1)
	s.sent.Store(0)
	body := s.open()
	out := &itCountingWriter{w: w, n: &s.sent}
	if s.gateAt > 0 {
		if _, err := io.CopyN(out, body, s.gateAt); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		select {
		case <-s.gate:
		case <-r.Context().Done():
			return
		}
	}
	_, _ = io.Copy(out, body)
}

type itCountingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c *itCountingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// itPatternReader yields a repeating pattern with no zero bytes, so nothing along the way
// can store it sparse or compress it away. The stream is the same however it is read.
type itPatternReader struct{ off int }

var itPattern = func() []byte {
	b := make([]byte, 64<<10)
	for i := range b {
		b[i] = byte(i%251) + 1
	}
	return b
}()

func (r *itPatternReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m := copy(p[n:], itPattern[r.off:])
		n += m
		r.off = (r.off + m) % len(itPattern)
	}
	return n, nil
}
