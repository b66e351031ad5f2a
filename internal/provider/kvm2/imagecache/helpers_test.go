package imagecache

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"go.opentelemetry.io/otel/trace/noop"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

const (
	testImageSize = 3<<20 + 12345
	waitLong      = testutil.WaitLong
)

func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("unexpected error: %v", err))
	}
	return v
}

func wantClass(t testing.TB, err, class error) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", class)
	}
	if provider.Class(err) != class {
		t.Fatalf("error %q has class %v, want %v", err, provider.Class(err), class)
	}
}

// noHosts is a Hosts for tests that never reach a libvirt host.
type noHosts struct{}

func (noHosts) Pooled(context.Context, string) (Storage, error) {
	return nil, errors.New("this test reaches no host")
}

func (noHosts) DialFresh(context.Context, string) (Storage, func(), error) {
	return nil, nil, errors.New("this test reaches no host")
}

func (noHosts) Transfer() time.Duration { return time.Minute }

// logLines collects log lines as funcr renders them (JSON).
type logLines struct {
	mu    sync.Mutex
	lines []string
}

// find returns the lines containing every one of parts.
func (l *logLines) find(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// newTestCache is a cache of a kvm2 provider with config cfg (none when nil) that reaches
// no host, logging up to V(2) into the returned lines.
func newTestCache(t testing.TB, cfg *provider.KVMConfig) (*Cache, *logLines) {
	if cfg == nil {
		cfg = &provider.KVMConfig{}
	}
	logs := &logLines{}
	log := funcr.NewJSON(func(obj string) {
		logs.mu.Lock()
		logs.lines = append(logs.lines, obj)
		logs.mu.Unlock()
	}, funcr.Options{Verbosity: 2})
	c := New(Config{Type: "kvm2", KVM: cfg, Hosts: noHosts{}, Log: log, Tracer: noop.NewTracerProvider().Tracer("test"),
		VolumeXML: func(string, uint64) (string, error) { return "", errors.New("this test makes no volume") },
		Failed:    func(_ logr.Logger, _ string, err error) error { return err }})
	t.Cleanup(c.Close)
	return c, logs
}

// testBody is size bytes of an image body.
func testBody(size int) []byte {
	body := make([]byte, size)
	for i := range body {
		body[i] = byte(i*7 + i/251)
	}
	return body
}

// lengthServer answers the length lookup in one of the modes TestImageLengthLookup sets
// (serveOK, serveHead405, serveChunked, or a status code) and counts HEADs and GETs.
type lengthServer struct {
	*httptest.Server
	mode        atomic.Value // string
	heads, gets atomic.Int32
}

const (
	serveOK      = "ok"      // Content-Length and the whole body
	serveChunked = "chunked" // no Content-Length
	serveHead405 = "head405" // HEAD answers 405, GET is fine
)

func newLengthServer(t testing.TB) *lengthServer {
	s := &lengthServer{}
	s.setMode(serveOK)
	body := testBody(testImageSize)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			s.heads.Add(1)
		} else {
			s.gets.Add(1)
		}
		mode := s.mode.Load().(string)
		if code, err := strconv.Atoi(mode); err == nil {
			http.Error(w, http.StatusText(code), code)
			return
		}
		switch {
		case mode == serveHead405 && r.Method == http.MethodHead:
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		case mode == serveChunked:
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			if r.Method == http.MethodGet {
				w.Write(body)
			}
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			w.Write(body)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *lengthServer) setMode(m string) { s.mode.Store(m) }
