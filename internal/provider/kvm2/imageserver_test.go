package kvm2

import (
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Behaviours of the image server.
const (
	serveOK       = "ok"        // Content-Length and the whole body
	serveChunked  = "chunked"   // no Content-Length
	serveZero     = "zero"      // Content-Length: 0
	serveHead405  = "head405"   // HEAD answers 405, GET is fine
	serveShort    = "short"     // declares the full length, sends half, closes
	serveStall    = "stall"     // sends half and then nothing until the client gives up
	serveGated    = "gated"     // sends half, waits for gate, sends the rest
	serveDripping = "dripping"  // sends one piece per value on drip
	serveGzip     = "gzip-only" // gzip when asked for it, otherwise 406
)

// imageServer is an HTTP mirror whose behaviour a test switches: a status code (as a
// decimal string) or one of the serve* modes. It records what it was asked.
type imageServer struct {
	*httptest.Server
	body   []byte
	digest string

	mu     sync.Mutex
	mode   string
	accept []string // Accept-Encoding of every request
	gate   chan struct{}
	drip   chan int // serveDripping: how many bytes to send next

	heads, gets atomic.Int32
	halfSent    chan struct{} // receives once per GET that sent half the body and waits
	releaseOnce sync.Once
}

// release lets every gated or stalled GET finish.
func (s *imageServer) release() { s.releaseOnce.Do(func() { close(s.gate) }) }

func newImageServer(t testing.TB, size int) *imageServer {
	t.Helper()
	body := make([]byte, size)
	for i := range body {
		body[i] = byte(i*7 + i/251)
	}
	copy(body, qcow2Header(uint64(size)*4))
	sum := sha256.Sum256(body)
	s := &imageServer{body: body, digest: hex.EncodeToString(sum[:]), mode: serveOK,
		gate: make(chan struct{}), drip: make(chan int), halfSent: make(chan struct{}, 16)}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	t.Cleanup(s.release) // before Close, which waits for the handlers
	return s
}

// qcow2Header is the start of a qcow2 file of virtual size size: what a pool refresh reads.
func qcow2Header(size uint64) []byte {
	h := make([]byte, 32)
	copy(h, "QFI\xfb")
	h[7] = 3
	for i := 0; i < 8; i++ {
		h[24+i] = byte(size >> (56 - 8*i))
	}
	return h
}

func (s *imageServer) url() string { return s.URL + "/images/debian-13-generic-amd64.qcow2?sig=t0ken" }

func (s *imageServer) setMode(m string) {
	s.mu.Lock()
	s.mode = m
	s.mu.Unlock()
}

func (s *imageServer) acceptEncodings() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.accept...)
}

func (s *imageServer) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	mode := s.mode
	s.accept = append(s.accept, r.Header.Get("Accept-Encoding"))
	s.mu.Unlock()
	if r.Method == http.MethodHead {
		s.heads.Add(1)
	} else {
		s.gets.Add(1)
	}
	if code, err := strconv.Atoi(mode); err == nil {
		http.Error(w, http.StatusText(code), code)
		return
	}
	half := len(s.body) / 2
	switch mode {
	case serveHead405:
		if r.Method == http.MethodHead {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
	case serveChunked:
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		if r.Method == http.MethodGet {
			w.Write(s.body)
		}
		return
	case serveZero:
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return
	case serveGzip:
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			http.Error(w, "gzip only", http.StatusNotAcceptable)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Set("Content-Length", strconv.Itoa(len(s.body)))
		gz := gzip.NewWriter(w)
		gz.Write(s.body)
		gz.Close()
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(s.body)))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	switch mode {
	case serveShort:
		w.Write(s.body[:half])
		// Returning with less than the declared length written makes the server close
		// the connection: the client reads a body that ends early.
	case serveStall, serveGated:
		w.Write(s.body[:half])
		w.(http.Flusher).Flush()
		s.halfSent <- struct{}{}
		select {
		case <-r.Context().Done():
			return
		case <-s.gate:
		}
		w.Write(s.body[half:])
	case serveDripping:
		for off := 0; off < len(s.body); {
			select {
			case <-r.Context().Done():
				return
			case n := <-s.drip:
				n = min(n, len(s.body)-off)
				w.Write(s.body[off : off+n])
				w.(http.Flusher).Flush()
				off += n
			}
		}
	default:
		w.Write(s.body)
	}
}
