package gateway

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// An HTTPS request through CONNECT: the gateway never sees inside the TLS; the CONNECT
// 200 names the exit and its egress address, which is the address the site saw.
func TestConnectTunnelHTTPS(t *testing.T) {
	exit := startTestExit(t, "crawlers", "exit-a", "127.0.0.22")
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "tls hello %s", host)
	}))
	defer srv.Close()
	h := newHarness(t, []*testExit{exit}, nil)

	var connectHeader http.Header
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.Proxy = http.ProxyURL(mustURL(t, "http://crawler:"+tokenCrawlers+"@"+h.httpAddr))
	tr.OnProxyConnectResponse = func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
		connectHeader = resp.Header.Clone()
		return nil
	}
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); body != "tls hello 127.0.0.22" {
		t.Fatalf("got %q, want the site to see 127.0.0.22", body)
	}
	if connectHeader.Get(HeaderEgressProxy) != "crawlers/exit-a" || connectHeader.Get(HeaderEgressIP) != "127.0.0.22" {
		t.Errorf("CONNECT 200 headers %v, want %s crawlers/exit-a and %s 127.0.0.22", connectHeader, HeaderEgressProxy, HeaderEgressIP)
	}
	for _, a := range exit.sawAuth() {
		if a != basicAuth(exit.User, exit.Password) {
			t.Errorf("the exit got Proxy-Authorization %q, want its own credentials only", a)
		}
	}
}

// halfCloseServer reads everything until the client's end, then answers how much it read.
func halfCloseServer(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				n, _ := io.Copy(io.Discard, c)
				fmt.Fprintf(c, "read %d bytes", n)
			}()
		}
	}()
	return ln.Addr().String()
}

// A client that half-closes its side still gets the site's answer: the tunnel passes the
// end of one direction on and keeps the other open.
func TestTunnelHalfClose(t *testing.T) {
	exit := startTestExit(t, "crawlers", "exit-a", "127.0.0.22")
	target := halfCloseServer(t)
	h := newHarness(t, []*testExit{exit}, nil)
	c, br, resp := rawConnect(t, h.httpAddr, target, "crawler", tokenCrawlers)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	payload := strings.Repeat("0123456789", 100_000)
	if _, err := io.WriteString(c, payload); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("read %d bytes", len(payload)); string(got) != want {
		t.Errorf("after the half-close the site answered %q, want %q", got, want)
	}
}

// Exits that refuse the connection or answer with their own failure are skipped, for a
// tunnel and for a plain request alike, before the client sees a byte; the Reporter hears
// of each.
func TestRetryOnFailedExits(t *testing.T) {
	for _, connect := range []bool{false, true} {
		t.Run(fmt.Sprintf("connect=%v", connect), func(t *testing.T) {
			down := startTestExit(t, "crawlers", "a-down", "127.0.0.31")
			down.stop()
			own := startTestExit(t, "crawlers", "b-own-error", "127.0.0.32")
			own.failOwn.Store(true)
			good := startTestExit(t, "crawlers", "c-good", "127.0.0.33")
			s := startSite(t)
			h := newHarness(t, []*testExit{down, own, good}, nil)

			if connect {
				c, br, resp := rawConnect(t, h.httpAddr, s.addr, "crawler", tokenCrawlers)
				if resp.StatusCode != 200 || resp.Header.Get(HeaderEgressProxy) != "crawlers/c-good" {
					t.Fatalf("CONNECT: %s through %q, want 200 through crawlers/c-good", resp.Status, resp.Header.Get(HeaderEgressProxy))
				}
				fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", s.addr)
				got, _ := io.ReadAll(br)
				if !strings.Contains(string(got), "hello 127.0.0.33") {
					t.Errorf("through the tunnel: %q", got)
				}
			} else {
				resp, err := h.client("crawler", tokenCrawlers).Get(s.url)
				if err != nil {
					t.Fatal(err)
				}
				if body := readBody(t, resp); resp.StatusCode != 200 || body != "hello 127.0.0.33" {
					t.Fatalf("got %s %q, want 200 from c-good", resp.Status, body)
				}
			}
			unreachable, _ := h.reporter.got()
			if want := "crawlers/a-down crawlers/b-own-error"; strings.Join(unreachable, " ") != want {
				t.Errorf("Reporter.Unreachable heard of %v, want %s", unreachable, want)
			}
			kind := "requests"
			if connect {
				kind = "tunnels"
			}
			if n := counterValue(t, h.reg, "proxy_operator_gateway_"+kind+"_total", "outcome", "retried"); n != 1 {
				t.Errorf("%s retried = %v, want 1", kind, n)
			}
		})
	}
}

// After MaxAttempts failed exits the client gets a 502 naming the exits tried.
func TestRetriesAreBounded(t *testing.T) {
	var exits []*testExit
	for i := range 4 {
		e := startTestExit(t, "crawlers", fmt.Sprintf("e%d", i), fmt.Sprintf("127.0.0.4%d", i))
		e.failOwn.Store(true)
		exits = append(exits, e)
	}
	s := startSite(t)
	h := newHarness(t, exits, func(c *Config) { c.MaxAttempts = 2 })
	resp, err := h.client("crawler", tokenCrawlers).Get(s.url)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 502 || !strings.Contains(body, "tried 2 exits (crawlers/e0, crawlers/e1)") {
		t.Errorf("got %s %q, want 502 naming the two exits tried", resp.Status, body)
	}
	_, _, cresp := rawConnect(t, h.httpAddr, s.addr, "crawler", tokenCrawlers)
	if body := readBody(t, cresp); cresp.StatusCode != 502 || !strings.Contains(body, "tried 2 exits") {
		t.Errorf("CONNECT: got %s %q, want 502 naming the two exits tried", cresp.Status, body)
	}
	if n := counterValue(t, h.reg, "proxy_operator_gateway_requests_total", "outcome", "exit_failed"); n != 1 {
		t.Errorf("requests exit_failed = %v, want 1", n)
	}
}

// A site's own 502, relayed by the exit, is the site's answer: the client gets it, no
// other exit is tried, and the exit is not reported.
func TestSiteFailureIsNotRetried(t *testing.T) {
	exits := []*testExit{startTestExit(t, "crawlers", "a", "127.0.0.51"), startTestExit(t, "crawlers", "b", "127.0.0.52")}
	s := startSite(t)
	s.status.Store(http.StatusBadGateway)
	h := newHarness(t, exits, nil)
	resp, err := h.client("crawler", tokenCrawlers).Get(s.url)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 502 || body != "hello 127.0.0.51" {
		t.Errorf("got %s %q, want the site's own 502 through the first exit", resp.Status, body)
	}
	if u, _ := h.reporter.got(); len(u) != 0 {
		t.Errorf("Reporter.Unreachable heard of %v for a site's failure", u)
	}
	if n := exits[1].served.Load(); n != 0 {
		t.Errorf("the second exit carried %d requests; a site's 502 must not be retried", n)
	}
}

// An exit that refuses the credentials the gateway holds for it (407) has failed: the
// next exit carries the request, and the client never sees the exit's 407.
func TestExitRefusingItsCredentials(t *testing.T) {
	wrong := startTestExit(t, "crawlers", "a-wrong-password", "127.0.0.121")
	good := startTestExit(t, "crawlers", "b-good", "127.0.0.122")
	s := startSite(t)
	h := newHarness(t, []*testExit{wrong, good}, nil)
	h.chooser.exits[0].Password = "stale"
	// A soft session whose exit is the one with the stale password, for both requests.
	session := ""
	for i := 0; session == ""; i++ {
		if id := fmt.Sprintf("s%d", i); cmpScore(id, h.chooser.exits[0], h.chooser.exits[1]) < 0 {
			session = id
		}
	}
	user := "crawler+session=" + session
	resp, err := h.client(user, tokenCrawlers).Get(s.url)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 200 || body != "hello 127.0.0.122" {
		t.Errorf("plain HTTP: %s %q, want 200 from b-good", resp.Status, body)
	}
	_, _, cresp := rawConnect(t, h.httpAddr, s.addr, user, tokenCrawlers)
	if cresp.StatusCode != 200 || cresp.Header.Get(HeaderEgressProxy) != "crawlers/b-good" {
		t.Errorf("CONNECT: %s through %q, want 200 through b-good", cresp.Status, cresp.Header.Get(HeaderEgressProxy))
	}
	if u, _ := h.reporter.got(); strings.Join(u, " ") != "crawlers/a-wrong-password crawlers/a-wrong-password" {
		t.Errorf("Reporter.Unreachable heard %v, want the exit with the stale password twice", u)
	}
}

// A request with a body is sent once: its exit's own failure is the client's 502 naming
// the exit, and the exit is reported.
func TestRequestWithBodyIsNotRetried(t *testing.T) {
	own := startTestExit(t, "crawlers", "a-own-error", "127.0.0.141")
	own.failOwn.Store(true)
	good := startTestExit(t, "crawlers", "b-good", "127.0.0.142")
	s := startSite(t)
	h := newHarness(t, []*testExit{own, good}, nil)
	resp, err := h.client("crawler", tokenCrawlers).Post(s.url, "text/plain", strings.NewReader("a body"))
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 502 || !strings.Contains(body, own.Address+" answered 502 Bad Gateway itself (exit crawlers/a-own-error;") {
		t.Errorf("got %s %q, want 502 naming the exit's own failure", resp.Status, body)
	}
	if good.served.Load() != 0 {
		t.Errorf("a request with a body was sent again through another exit")
	}
	if u, _ := h.reporter.got(); strings.Join(u, " ") != "crawlers/a-own-error" {
		t.Errorf("Reporter.Unreachable heard %v", u)
	}
}
