package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A header that does not end within HeaderTimeout gets 408, one larger than
// MaxHeaderBytes 431, a connection that sends nothing 408; each names the limit, and
// none reaches an exit.
func TestHeaderLimits(t *testing.T) {
	exit := startTestExit(t, "crawlers", "a", "127.0.0.91")
	h := newHarness(t, []*testExit{exit}, func(c *Config) {
		c.HeaderTimeout = 300 * time.Millisecond
		c.MaxHeaderBytes = 4096
	})
	answer := func(send string) (*http.Response, string) {
		c, err := net.Dial("tcp", h.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		io.WriteString(c, send)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("reading the answer to %.40q: %v", send, err)
		}
		return resp, readBody(t, resp)
	}
	resp, body := answer("GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\nX-Slow: ")
	if resp.StatusCode != 408 || !strings.Contains(body, "the request header did not end within 300ms") {
		t.Errorf("slow header: %s %q", resp.Status, body)
	}
	resp, body = answer("")
	if resp.StatusCode != 408 || !strings.Contains(body, "no request arrived within 300ms") {
		t.Errorf("silent connection: %s %q", resp.Status, body)
	}
	resp, body = answer(fmt.Sprintf("GET http://example.test/ HTTP/1.1\r\nHost: example.test\r\nX-Big: %s\r\n\r\n", strings.Repeat("b", 8000)))
	if resp.StatusCode != 431 || !strings.Contains(body, "the request header is larger than 4096 bytes") {
		t.Errorf("oversized header: %s %q", resp.Status, body)
	}
	resp, body = answer("NOT A REQUEST\r\n\r\n")
	if resp.StatusCode != 400 || !strings.Contains(body, "malformed request") {
		t.Errorf("garbage: %s %q", resp.Status, body)
	}
	if n := exit.served.Load(); n != 0 {
		t.Errorf("the exit carried %d requests", n)
	}
	if n := counterValue(t, h.reg, "proxy_operator_gateway_requests_total", "outcome", "bad_request"); n != 3 {
		t.Errorf("requests bad_request = %v, want 3 (slow, oversized, garbage)", n)
	}
}

// A plain-HTTP answer of 403, or 429 with Retry-After, reaches Reporter.Banned with the
// exit and the site; a 429 without Retry-After does not.
func TestBansReported(t *testing.T) {
	exit := startTestExit(t, "crawlers", "a", "127.0.0.92")
	s := startSite(t)
	h := newHarness(t, []*testExit{exit}, nil)
	c := h.client("crawler", tokenCrawlers)
	for _, tc := range []struct {
		status     int
		retryAfter string
	}{{403, ""}, {429, ""}, {429, "30"}} {
		s.status.Store(int32(tc.status))
		s.mu.Lock()
		s.extra.Set("Retry-After", tc.retryAfter)
		s.mu.Unlock()
		resp, err := c.Get(s.url)
		if err != nil {
			t.Fatal(err)
		}
		readBody(t, resp)
		if resp.StatusCode != tc.status || resp.Header.Get(HeaderEgressProxy) != "crawlers/a" {
			t.Errorf("got %s through %q, want the site's %d with the identity headers", resp.Status, resp.Header.Get(HeaderEgressProxy), tc.status)
		}
	}
	_, banned := h.reporter.got()
	if want := "crawlers/a 127.0.0.1 403 0s|crawlers/a 127.0.0.1 429 30s"; strings.Join(banned, "|") != want {
		t.Errorf("Reporter.Banned heard %q, want %q", banned, want)
	}
}
