// Package healthtest holds a tiny HTTP forward proxy for tests and benchmarks of the
// health engine: it forwards absolute-form GETs, dials out from a chosen loopback address
// (so a probe target sees a distinct egress IP), and can be switched to fail or to hang.
package healthtest

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
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
}

// New starts a forward proxy whose outgoing connections come from egressIP (a loopback
// address such as 127.0.0.2; empty for the default). It stops when the test ends.
func New(tb testing.TB, egressIP string) *ForwardProxy {
	tb.Helper()
	d := &net.Dialer{}
	if egressIP != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(egressIP)}
	}
	p := &ForwardProxy{transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true, Proxy: nil}}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	u, _ := url.Parse(p.srv.URL)
	port, _ := strconv.Atoi(u.Port())
	p.Host, p.Port = u.Hostname(), int32(port)
	tb.Cleanup(p.Close)
	return p
}

// SetMode switches how the proxy answers from the next request on.
func (p *ForwardProxy) SetMode(m Mode) { p.mode.Store(int32(m)) }

// Close stops the proxy; later connections are refused.
func (p *ForwardProxy) Close() {
	p.srv.CloseClientConnections()
	p.srv.Close()
}

func (p *ForwardProxy) serve(w http.ResponseWriter, r *http.Request) {
	p.Requests.Add(1)
	switch Mode(p.mode.Load()) {
	case Fail:
		http.Error(w, "upstream unreachable", http.StatusBadGateway)
		return
	case Hang:
		<-r.Context().Done()
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
	res, err := p.transport.RoundTrip(out)
	if err != nil {
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
