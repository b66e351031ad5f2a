//go:build e2e

package e2e

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// imageServer serves one file with its Content-Length, paced so that a full download
// takes about pace, which leaves time to watch the download's progress.
type imageServer struct {
	path     string
	size     int64
	rate     int64 // bytes per second
	requests atomic.Int64
	complete atomic.Int64 // downloads sent to the end
	sent     atomic.Int64 // bytes written, all requests
}

func newImageServer(t *testing.T, path string, pace time.Duration) *imageServer {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("guest image: %v", err)
	}
	rate := fi.Size() / int64(pace/time.Second)
	if rate < 1<<20 {
		rate = 1 << 20
	}
	return &imageServer{path: path, size: fi.Size(), rate: rate}
}

func (s *imageServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	f, err := os.Open(s.path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(s.size, 10))
	if r.Method == http.MethodHead {
		return
	}
	// Chunks of a tenth of a second's worth, each sent on its own schedule.
	chunk := s.rate / 10
	buf := make([]byte, chunk)
	start := time.Now()
	var n int64
	for {
		m, rerr := io.ReadFull(f, buf)
		if m > 0 {
			if _, werr := w.Write(buf[:m]); werr != nil {
				return
			}
			n += int64(m)
			s.sent.Add(int64(m))
			if due := start.Add(time.Duration(n * int64(time.Second) / s.rate)); time.Until(due) > 0 {
				select {
				case <-r.Context().Done():
					return
				case <-time.After(time.Until(due)):
				}
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return
		}
	}
	if n == s.size {
		s.complete.Add(1)
	}
}
