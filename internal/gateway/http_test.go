package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// A plain-HTTP request leaves through the chosen exit with the exit's own credentials;
// the client's token and hop-by-hop headers stay in the gateway; the response names the
// exit and the address the site really saw.
func TestForwardThroughExit(t *testing.T) {
	exit := startTestExit(t, "crawlers", "exit-a", "127.0.0.21")
	s := startSite(t)
	h := newHarness(t, []*testExit{exit}, nil)

	req, _ := http.NewRequest(http.MethodGet, s.url+"/page", nil)
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "must not pass")
	req.Header.Set("X-Kept", "passes")
	resp, err := h.client("crawler+ns=crawlers", tokenCrawlers).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusOK || body != "hello 127.0.0.21" {
		t.Fatalf("got %s %q, want 200 from the exit's egress address 127.0.0.21", resp.Status, body)
	}
	if got := resp.Header.Get(HeaderEgressProxy); got != "crawlers/exit-a" {
		t.Errorf("%s = %q, want crawlers/exit-a", HeaderEgressProxy, got)
	}
	if got, seen := resp.Header.Get(HeaderEgressIP), resp.Header.Get("X-Seen-From"); got != seen {
		t.Errorf("%s = %q but the site saw %q", HeaderEgressIP, got, seen)
	}
	sh := s.lastHeaders()
	if sh.Get("X-Hop") != "" || sh.Get("Proxy-Authorization") != "" || sh.Get("X-Kept") != "passes" {
		t.Errorf("the site got X-Hop %q, Proxy-Authorization %q, X-Kept %q; want only X-Kept",
			sh.Get("X-Hop"), sh.Get("Proxy-Authorization"), sh.Get("X-Kept"))
	}
	for _, a := range exit.sawAuth() {
		if a != basicAuth(exit.User, exit.Password) {
			t.Errorf("the exit got Proxy-Authorization %q, want its own credentials only", a)
		}
	}
	if strings.Contains(fmt.Sprint(resp.Header), exit.Password) {
		t.Errorf("the client saw the exit's password in %v", resp.Header)
	}
}

// Keep-alive: many requests over one client connection, each answered.
func TestForwardKeepAlive(t *testing.T) {
	exit := startTestExit(t, "crawlers", "exit-a", "127.0.0.21")
	s := startSite(t)
	h := newHarness(t, []*testExit{exit}, nil)
	c := h.client("crawler", tokenCrawlers)
	conns := 0
	for i := 0; i < 20; i++ {
		req, _ := http.NewRequest(http.MethodPost, s.url, strings.NewReader(strings.Repeat("x", i*100)))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if body := readBody(t, resp); body != "hello 127.0.0.21" {
			t.Fatalf("request %d: %q", i, body)
		}
	}
	h.g.mu.Lock()
	conns = len(h.g.conns)
	h.g.mu.Unlock()
	if conns != 1 {
		t.Errorf("20 requests of one client used %d connections, want 1 kept alive", conns)
	}
}

// Every refusal of credentials or options is a 407 with Proxy-Authenticate and a body
// naming what is wrong, for plain HTTP and CONNECT alike.
func TestRefusals407(t *testing.T) {
	exit := startTestExit(t, "crawlers", "exit-a", "127.0.0.21")
	s := startSite(t)
	h := newHarness(t, []*testExit{exit}, nil)
	h.chooser.pools["news"] = []string{exit.ID()}
	for _, tc := range []struct {
		name, user, password string
		status               int
		want                 string
	}{
		{"missing", "", "", 407, "proxy credentials are missing"},
		{"bad token", "crawler", "nope", 407, "not a token the discovery API accepts"},
		{"empty password", "crawler", "", 407, "the proxy password is empty"},
		{"unknown option", "crawler+colour=red", tokenCrawlers, 407, `unknown option "colour"`},
		{"bad value", "crawler+ip=5", tokenCrawlers, 407, "option ip must be 4 or 6"},
		{"foreign namespace", "crawler+ns=other", tokenCrawlers, 407, `may not use namespace "other"`},
		{"unknown pool", "crawler+pool=sports", tokenCrawlers, 407, `option pool: unknown pool "sports"`},
		{"API down", "crawler", "api-down", 503, "could not verify the proxy password now"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, connect := range []bool{false, true} {
				var resp *http.Response
				if connect {
					_, _, resp = rawConnect(t, h.httpAddr, s.addr, tc.user, tc.password)
				} else {
					c := h.client(tc.user, tc.password)
					if tc.user == "" && tc.password == "" {
						c = &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(mustURL(t, "http://"+h.httpAddr))}}
					}
					var err error
					if resp, err = c.Get(s.url); err != nil {
						t.Fatal(err)
					}
				}
				body := readBody(t, resp)
				if resp.StatusCode != tc.status || !strings.Contains(body, tc.want) {
					t.Errorf("CONNECT %v: got %s %q, want %d with %q", connect, resp.Status, body, tc.status, tc.want)
				}
				if tc.status == 407 && resp.Header.Get("Proxy-Authenticate") != `Basic realm="egress-proxies"` {
					t.Errorf("CONNECT %v: Proxy-Authenticate = %q", connect, resp.Header.Get("Proxy-Authenticate"))
				}
			}
		})
	}
	if n := exit.served.Load(); n != 0 {
		t.Errorf("the exit carried %d requests of refused callers", n)
	}
}

// A request that is not an absolute http:// URL is refused naming what the gateway takes.
func TestOriginFormRefused(t *testing.T) {
	h := newHarness(t, nil, nil)
	resp, err := http.Get("http://" + h.httpAddr + "/path")
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 400 || !strings.Contains(body, "send absolute http:// URLs") {
		t.Errorf("got %s %q", resp.Status, body)
	}
}

// What a refused caller wrote in its options makes no metric series.
func TestRefusedOptionsMakeNoSeries(t *testing.T) {
	exit := startTestExit(t, "crawlers", "exit-a", "127.0.0.21")
	s := startSite(t)
	h := newHarness(t, []*testExit{exit}, nil)
	for _, user := range []string{"u+ns=made-up-1", "u+pool=made-up-2", "u+ns=made-up-3+colour=x"} {
		resp, err := h.client(user, tokenCrawlers).Get(s.url)
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
	}
	mfs, _ := h.reg.Gather()
	for _, mf := range mfs {
		if strings.Contains(mf.String(), "made-up") {
			t.Errorf("%s has a series of a refused caller's option: %s", mf.GetName(), mf.String())
		}
	}
	if n := counterValue(t, h.reg, "proxy_operator_gateway_requests_total", "outcome", "auth_failed"); n != 3 {
		t.Errorf("requests auth_failed = %v, want 3", n)
	}
}
