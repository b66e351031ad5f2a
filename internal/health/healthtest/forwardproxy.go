// Package healthtest holds a tiny HTTP forward proxy for tests and benchmarks of the
// health engine: it forwards absolute-form GETs and tunnels CONNECTs, dials out from a
// chosen loopback address (so a probe target sees a distinct egress IP), can be switched
// to fail or to hang, and, like tinyproxy, can demand basic auth and refuse sources.
package healthtest

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// Mode is how the proxy answers.
type Mode int32

const (
	// Forward relays the request to its target.
	Forward Mode = iota
	// Fail answers 502 Bad Gateway without contacting the target, as a proxy whose
	// upstream is unreachable does.
	Fail
	// Hang never answers; the client's timeout ends the request.
	Hang
)

// ForwardProxy is a running forward proxy on loopback.
type ForwardProxy struct {
	srv *httptest.Server
	// Host and Port are where clients reach it.
	Host string
	Port int32
	// Requests counts the requests it received, answered or not.
	Requests atomic.Int64

	mode      atomic.Int32
	transport *http.Transport
	dialer    *net.Dialer
	// stopped ends with Close: every forward and tunnel in flight is cut, and a request
	// that reaches the handler after it loses its connection unanswered.
	stopped context.Context
	stop    context.CancelFunc

	mu      sync.Mutex
	auth    *Auth
	sources []netip.Prefix
	hosts   map[string]string
}

// Auth is the basic-auth a proxy demands. A request without Proxy-Authorization is
// answered 407 Proxy Authentication Required; one with wrong credentials WrongStatus,
// which is 401 Unauthorized when zero, as tinyproxy 1.11 answers (squid answers 407).
type Auth struct {
	Username, Password string
	WrongStatus        int
}

// New starts a forward proxy on 127.0.0.1 whose outgoing connections come from egressIP
// (a loopback address such as 127.0.0.2; empty for the default). It stops when the test
// ends.
func New(tb testing.TB, egressIP string) *ForwardProxy {
	tb.Helper()
	return Listen(tb, "127.0.0.1:0", egressIP)
}

// Listen is New on the address addr ("[::1]:3128", or a port of 0 for a free one): an
// IPv6 proxy, or a second proxy on the port of another one.
func Listen(tb testing.TB, addr, egressIP string) *ForwardProxy {
	tb.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatalf("healthtest: listen on %s: %v", addr, err)
	}
	d := &net.Dialer{}
	if egressIP != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(egressIP)}
	}
	p := &ForwardProxy{dialer: d}
	p.stopped, p.stop = context.WithCancel(context.Background())
	p.transport = &http.Transport{DialContext: p.dial, DisableKeepAlives: true, Proxy: nil}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(p.serve))
	_ = p.srv.Listener.Close()
	p.srv.Listener = l
	p.srv.Start()
	u, _ := url.Parse(p.srv.URL)
	port, _ := strconv.Atoi(u.Port())
	p.Host, p.Port = u.Hostname(), int32(port)
	tb.Cleanup(p.Close)
	return p
}

// Resolve makes the proxy connect to ip whenever a request names host, as a resolver
// would: sites with names of their own (shop.example.com) served on loopback.
func (p *ForwardProxy) Resolve(host, ip string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hosts == nil {
		p.hosts = map[string]string{}
	}
	p.hosts[host] = ip
}

// dial connects to addr from the proxy's egress address, through the names Resolve set.
func (p *ForwardProxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if host, port, err := net.SplitHostPort(addr); err == nil {
		p.mu.Lock()
		ip, ok := p.hosts[host]
		p.mu.Unlock()
		if ok {
			addr = net.JoinHostPort(ip, port)
		}
	}
	return p.dialer.DialContext(ctx, network, addr)
}

// SetMode switches how the proxy answers from the next request on.
func (p *ForwardProxy) SetMode(m Mode) { p.mode.Store(int32(m)) }

// RequireAuth makes the proxy demand a (nil: no longer demand any credentials).
func (p *ForwardProxy) RequireAuth(a *Auth) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.auth = a
}

// AllowSources makes the proxy serve only clients whose address is in one of nets,
// answering others 403 Access denied as tinyproxy does for a source no Allow line lists.
// No nets: every source is served.
func (p *ForwardProxy) AllowSources(nets ...netip.Prefix) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sources = nets
}

// refuse answers and returns true when the request's source or credentials are refused.
func (p *ForwardProxy) refuse(w http.ResponseWriter, r *http.Request) bool {
	p.mu.Lock()
	auth, sources := p.auth, p.sources
	p.mu.Unlock()
	if len(sources) > 0 {
		ap, err := netip.ParseAddrPort(r.RemoteAddr)
		allowed := false
		for _, n := range sources {
			allowed = allowed || (err == nil && n.Contains(ap.Addr().Unmap()))
		}
		if !allowed {
			statusLine(w, http.StatusForbidden, "Access denied")
			return true
		}
	}
	if auth == nil {
		return false
	}
	got := r.Header.Get("Proxy-Authorization")
	if got == "" {
		w.Header().Set("Proxy-Authenticate", `Basic realm="healthtest"`)
		statusLine(w, http.StatusProxyAuthRequired, "Proxy Authentication Required")
		return true
	}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte(auth.Username+":"+auth.Password))
	if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		code := auth.WrongStatus
		if code == 0 {
			code = http.StatusUnauthorized
		}
		statusLine(w, code, http.StatusText(code))
		return true
	}
	return false
}

// statusLine answers code with tinyproxy's words for it as the page (net/http writes
// the standard reason phrase in the status line).
func statusLine(w http.ResponseWriter, code int, text string) {
	http.Error(w, text, code)
}

// Close stops the proxy as a killed process stops: its forwards and tunnels in flight
// are cut, its connections closed, and later connections refused. It returns without
// waiting for the targets of those forwards to answer.
//
// The order matters: httptest.Server.Close waits for every handler still running, and a
// connection accepted between closing the clients' connections and closing the listener
// would otherwise be served and wait on its target (a target that waits for the proxy's
// death waits forever).
func (p *ForwardProxy) Close() {
	p.stop()
	_ = p.srv.Listener.Close()
	p.srv.CloseClientConnections()
	p.srv.Close()
}

func (p *ForwardProxy) serve(w http.ResponseWriter, r *http.Request) {
	if p.stopped.Err() != nil {
		panic(http.ErrAbortHandler) // closes the connection without an answer
	}
	// The forward ends with the client's request or with Close, whichever comes first.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(p.stopped, cancel)()
	r = r.WithContext(ctx)
	p.Requests.Add(1)
	switch Mode(p.mode.Load()) {
	case Fail:
		http.Error(w, "upstream unreachable", http.StatusBadGateway)
		return
	case Hang:
		<-r.Context().Done()
		// Never an answer: returning would send net/http's empty 200 on a connection that
		// Close has not cut yet.
		panic(http.ErrAbortHandler)
	}
	if p.refuse(w, r) {
		return
	}
	if r.Method == http.MethodConnect {
		p.tunnel(w, r)
		return
	}
	if r.URL.Host == "" { // origin-form: not a proxy request
		http.Error(w, "forward proxy: want an absolute URL", http.StatusBadRequest)
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, r.URL.String(), nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out.Header = r.Header.Clone()
	out.Header.Del("Proxy-Connection")
	out.Header.Del("Proxy-Authorization")
	res, err := p.transport.RoundTrip(out)
	if err != nil {
		if p.stopped.Err() != nil {
			panic(http.ErrAbortHandler) // a killed proxy answers nothing
		}
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer res.Body.Close()
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.StatusCode)
	_, _ = io.Copy(w, res.Body)
}

// tunnel answers a CONNECT: it dials the target and copies bytes both ways.
func (p *ForwardProxy) tunnel(w http.ResponseWriter, r *http.Request) {
	up, err := p.dial(r.Context(), "tcp", r.Host)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer up.Close()
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "forward proxy: cannot take over the connection", http.StatusInternalServerError)
		return
	}
	down, buf, err := hj.Hijack()
	if err != nil {
		return
	}
	defer down.Close()
	// A hijacked connection is no longer the server's: Close cuts it here.
	defer context.AfterFunc(p.stopped, func() { _ = down.Close(); _ = up.Close() })()
	if _, err := io.WriteString(down, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, buf); closeWrite(up); done <- struct{}{} }()
	go func() { _, _ = io.Copy(down, up); closeWrite(down); done <- struct{}{} }()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
}
