package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

func threeExits(t *testing.T) []*testExit {
	return []*testExit{
		startTestExit(t, "crawlers", "a", "127.0.0.71"),
		startTestExit(t, "crawlers", "b", "127.0.0.72"),
		startTestExit(t, "crawlers", "c", "127.0.0.73"),
	}
}

func egressOf(t *testing.T, c *http.Client, url string) (string, *http.Response) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	return strings.TrimPrefix(body, "hello "), resp
}

// A session's requests all leave through one exit; without a session each request moves
// to the next distinct egress address.
func TestSessionStickyAndRotation(t *testing.T) {
	exits := threeExits(t)
	s := startSite(t)
	h := newHarness(t, exits, nil)

	seen := map[string]int{}
	for i := 0; i < 30; i++ {
		ip, _ := egressOf(t, h.client("crawler+session=cart-1", tokenCrawlers), s.url)
		seen[ip]++
	}
	if len(seen) != 1 {
		t.Errorf("30 requests of one session left from %v, want one address", seen)
	}

	c := h.client("crawler", tokenCrawlers)
	var order []string
	for i := 0; i < 6; i++ {
		ip, _ := egressOf(t, c, s.url)
		order = append(order, ip)
	}
	counts := map[string]int{}
	for i, ip := range order {
		counts[ip]++
		if i > 0 && order[i-1] == ip {
			t.Errorf("requests %d and %d without a session both left from %s: %v", i-1, i, ip, order)
		}
	}
	if len(counts) != 3 {
		t.Errorf("6 requests without a session left from %v, want each of the 3 addresses twice", counts)
	}
	if n := counterValue(t, h.reg, "proxy_operator_gateway_sessions_live", "", ""); n != 1 {
		t.Errorf("sessions live = %v, want 1", n)
	}
}

// A soft session whose exit goes down moves to another exit without failing a request; a
// strict one fails with 502 naming its exit.
func TestSessionExitDown(t *testing.T) {
	exits := threeExits(t)
	s := startSite(t)
	h := newHarness(t, exits, nil)
	first, resp := egressOf(t, h.client("crawler+session=s1", tokenCrawlers), s.url)
	exitID := resp.Header.Get(HeaderEgressProxy)
	for _, e := range exits {
		if e.ID() == exitID {
			e.stop()
		}
	}

	moved, resp := egressOf(t, h.client("crawler+session=s1", tokenCrawlers), s.url)
	if resp.StatusCode != 200 || moved == first {
		t.Errorf("soft session after its exit %s stopped: %s from %s, want 200 from another address", exitID, resp.Status, moved)
	}

	resp, err := h.client("crawler+session=s1+strict", tokenCrawlers).Get(s.url)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 502 || resp.Header.Get(HeaderEgressProxy) != exitID || !strings.Contains(body, exitID) {
		t.Errorf("strict session: %s %s=%q %q, want 502 naming %s", resp.Status, HeaderEgressProxy, resp.Header.Get(HeaderEgressProxy), body, exitID)
	}
	_, _, cresp := rawConnect(t, h.httpAddr, s.addr, "crawler+session=s1+strict", tokenCrawlers)
	if cresp.StatusCode != 502 || cresp.Header.Get(HeaderEgressProxy) != exitID {
		t.Errorf("strict session's CONNECT: %s naming %q, want 502 naming %s", cresp.Status, cresp.Header.Get(HeaderEgressProxy), exitID)
	}

	// The Chooser already knows the exit is unavailable: no connection is tried.
	h.chooser.setDown(exitID, true)
	resp, err = h.client("crawler+session=s1+strict", tokenCrawlers).Get(s.url)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 502 || !strings.Contains(body, fmt.Sprintf("its exit %s is unavailable", exitID)) {
		t.Errorf("strict session, exit down in the health view: %s %q", resp.Status, body)
	}
}

// A site saturated for the pool gets 503 with Retry-After and a body naming the site.
func TestSaturatedSite(t *testing.T) {
	s := startSite(t)
	h := newHarness(t, threeExits(t), nil)
	h.chooser.saturated = map[string]bool{"127.0.0.1": true}
	resp, err := h.client("crawler", tokenCrawlers).Get(s.url)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "30" || !strings.Contains(body, "saturated for site 127.0.0.1") {
		t.Errorf("got %s Retry-After %q %q", resp.Status, resp.Header.Get("Retry-After"), body)
	}
	if n := counterValue(t, h.reg, "proxy_operator_gateway_requests_total", "outcome", "saturated"); n != 1 {
		t.Errorf("requests saturated = %v, want 1", n)
	}
}

// The Chooser hears the site, the options and the failed exits; and an exit outside the
// caller's namespaces is never used, even when a Chooser offers one.
func TestChoiceRequestAndNamespaceGuard(t *testing.T) {
	mine := startTestExit(t, "crawlers", "mine", "127.0.0.81")
	s := startSite(t)
	h := newHarness(t, []*testExit{mine}, nil)
	if _, resp := egressOf(t, h.client("crawler+ns=crawlers+ip=4", tokenCrawlers), s.url); resp.StatusCode != 200 {
		t.Fatalf("got %s", resp.Status)
	}
	got := h.chooser.calls[len(h.chooser.calls)-1]
	if got.Site != "127.0.0.1" || got.Namespace != "crawlers" || got.Family != FamilyIPv4 || got.Identity.Name != "crawler" {
		t.Errorf("ChoiceRequest %+v", got)
	}

	foreign := startTestExit(t, "other", "theirs", "127.0.0.82")
	h2 := newHarness(t, nil, func(c *Config) { c.Chooser = &leakyChooser{exit: foreign.Exit} })
	resp, err := h2.client("crawler", tokenCrawlers).Get(s.url)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 502 || !strings.Contains(body, "outside the namespaces crawler may use") {
		t.Errorf("a chooser offering another namespace's exit: %s %q", resp.Status, body)
	}
	if foreign.served.Load() != 0 {
		t.Errorf("the foreign exit carried a request")
	}
}

// No eligible exit: 502 naming the site, namespace and pool.
func TestNoExit(t *testing.T) {
	s := startSite(t)
	h := newHarness(t, threeExits(t), nil)
	resp, err := h.client("crawler+ip=6", tokenCrawlers).Get(s.url)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 502 || !strings.Contains(body, `no exit for site 127.0.0.1 (namespace "", pool "")`) {
		t.Errorf("got %s %q", resp.Status, body)
	}
	if n := counterValue(t, h.reg, "proxy_operator_gateway_requests_total", "outcome", "no_exit"); n != 1 {
		t.Errorf("requests no_exit = %v, want 1", n)
	}
}
