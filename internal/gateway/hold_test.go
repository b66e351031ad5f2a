package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// testDemand records what the gateway tells its DemandRecorder.
type testDemand struct {
	mu  sync.Mutex
	got []PoolDemand
}

func (d *testDemand) Record(p PoolDemand) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, p)
}

func (d *testDemand) all() []PoolDemand {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]PoolDemand(nil), d.got...)
}

// heldRequests is the held gauge of crawlers/news.
func heldRequests(t testing.TB, reg *prometheus.Registry) float64 {
	return counterValue(t, reg, "proxy_operator_gateway_held_requests", "pool", "news")
}

// waitCount is how many waits of crawlers/news ended with outcome.
func waitCount(t testing.TB, reg *prometheus.Registry, outcome string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "proxy_operator_gateway_activation_wait_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == "crawlers" && labels["pool"] == "news" && labels["outcome"] == outcome {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

// eventually waits up to 20 s for cond, saying what it waited for.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 20s for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// zeroHarness is a gateway whose pool crawlers/news exists with no exit yet.
func zeroHarness(t *testing.T, tune func(*Config)) (*harness, *testDemand) {
	t.Helper()
	rec := &testDemand{}
	h := newHarness(t, nil, func(c *Config) {
		c.ActivationTimeout = time.Minute
		c.Demand = rec
		if tune != nil {
			tune(c)
		}
	})
	h.chooser.zero = map[string]string{"news": "crawlers"}
	h.chooser.pools["news"] = []string{}
	return h, rec
}

// TestHeldUntilAnExitAppears: a CONNECT, a plain-HTTP request and a SOCKS5 tunnel for a
// pool at zero are held (the held gauge and the DemandRecorder say so at once) until an
// exit of the pool appears; then all three are served through it and the waits are
// counted as served and logged.
func TestHeldUntilAnExitAppears(t *testing.T) {
	h, rec := zeroHarness(t, nil)
	st := startSite(t)
	exit := startTestExit(t, "crawlers", "news-0", "127.0.0.3")

	type answer struct {
		what string
		err  error
	}
	answers := make(chan answer, 3)
	go func() { // CONNECT
		c, err := net.Dial("tcp", h.httpAddr)
		if err != nil {
			answers <- answer{"connect", err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: %s\r\n\r\n", st.addr, st.addr, basicAuth("me+pool=news", tokenCrawlers))
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err == nil && (resp.StatusCode != 200 || resp.Header.Get(HeaderEgressProxy) != "crawlers/news-0") {
			err = fmt.Errorf("CONNECT answered %s via %q", resp.Status, resp.Header.Get(HeaderEgressProxy))
		}
		answers <- answer{"connect", err}
	}()
	go func() { // plain HTTP
		resp, err := h.client("me+pool=news", tokenCrawlers).Get(st.url + "/x")
		if err == nil {
			body := readBody(t, resp)
			if resp.StatusCode != 200 || resp.Header.Get(HeaderEgressProxy) != "crawlers/news-0" || !strings.Contains(body, "hello 127.0.0.3") {
				err = fmt.Errorf("GET answered %s via %q: %q", resp.Status, resp.Header.Get(HeaderEgressProxy), body)
			}
		}
		answers <- answer{"http", err}
	}()
	go func() { // SOCKS5
		c, br, _ := socksGreet(t, h.socksAddr, socksMethodUser)
		socksAuth(t, c, br, "me+pool=news", tokenCrawlers)
		host, port, _ := net.SplitHostPort(st.addr)
		ip := net.ParseIP(host).To4()
		var p int
		fmt.Sscan(port, &p)
		c.SetDeadline(time.Now().Add(30 * time.Second))
		c.Write(append([]byte{5, 1, 0, 1}, append(ip, byte(p>>8), byte(p))...))
		reply := make([]byte, 10)
		_, err := io.ReadFull(br, reply)
		if err == nil && reply[1] != socksSucceeded {
			err = fmt.Errorf("SOCKS5 reply %#x", reply[1])
		}
		answers <- answer{"socks", err}
	}()

	eventually(t, "three requests held for crawlers/news", func() bool { return heldRequests(t, h.reg) == 3 })
	got := rec.all()
	if len(got) == 0 || got[0] != (PoolDemand{Namespace: "crawlers", Pool: "news", Held: 1}) {
		t.Fatalf("the first held request was not recorded at once as held demand of crawlers/news: %+v", got)
	}
	select {
	case a := <-answers:
		t.Fatalf("%s answered while the pool had no exit: %v", a.what, a.err)
	default:
	}

	h.chooser.addToPool("news", exit.Exit)
	h.g.ExitsChanged()
	for range 3 {
		select {
		case a := <-answers:
			if a.err != nil {
				t.Errorf("%s: %v", a.what, a.err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("held requests were not served within 20s of the exit appearing")
		}
	}
	eventually(t, "the held gauge back at 0", func() bool { return heldRequests(t, h.reg) == 0 })
	if n := waitCount(t, h.reg, holdServed); n != 3 {
		t.Errorf("activation waits served: %d, want 3", n)
	}
	if !h.logs.contains(`"msg"="held request ended" "namespace"="crawlers" "pool"="news" "outcome"="served" "waited"=`) {
		t.Errorf("no log line of the held requests' end: %v", h.logs.lines)
	}
	if last := rec.all(); last[len(last)-1].Held != 0 {
		t.Errorf("the last demand record still holds requests: %+v", last[len(last)-1])
	}
}

// TestHeldTimesOut: past the activation timeout, HTTP gets 503 with Retry-After and a body
// naming the pool, SOCKS5 the reply of a saturated pool (0x02).
func TestHeldTimesOut(t *testing.T) {
	h, _ := zeroHarness(t, func(c *Config) { c.ActivationTimeout = 300 * time.Millisecond })
	st := startSite(t)
	start := time.Now()
	resp, err := h.client("me+pool=news", tokenCrawlers).Get(st.url)
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "10" ||
		!strings.Contains(body, "pool crawlers/news has no exit ready: waited 300ms") {
		t.Fatalf("after the timeout: %s, Retry-After %q, %q", resp.Status, resp.Header.Get("Retry-After"), body)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Errorf("answered after %s, before the activation timeout", waited)
	}
	c, br, _ := socksGreet(t, h.socksAddr, socksMethodUser)
	socksAuth(t, c, br, "me+pool=news", tokenCrawlers)
	c.Write([]byte{5, 1, 0, 3, 11, 'e', 'x', 'a', 'm', 'p', 'l', 'e', '.', 'c', 'o', 'm', 0, 80})
	reply := make([]byte, 10)
	if _, err := io.ReadFull(br, reply); err != nil || reply[1] != socksNotAllowed {
		t.Fatalf("SOCKS5 after the timeout: %v, reply %#x, want %#x", err, reply[1], socksNotAllowed)
	}
	if n := waitCount(t, h.reg, holdTimeout); n != 2 {
		t.Errorf("activation waits timed out: %d, want 2", n)
	}
	if n := counterValue(t, h.reg, "proxy_operator_gateway_requests_total", "outcome", outcomeNoExit); n != 1 {
		t.Errorf("requests counted no_exit: %v, want 1", n)
	}
}

// TestHeldClientGone: a client closing its connection while held ends the hold and its
// demand.
func TestHeldClientGone(t *testing.T) {
	h, rec := zeroHarness(t, nil)
	c, err := net.Dial("tcp", h.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nProxy-Authorization: %s\r\n\r\n", basicAuth("me+pool=news", tokenCrawlers))
	eventually(t, "the CONNECT held", func() bool { return heldRequests(t, h.reg) == 1 })
	c.Close()
	eventually(t, "the hold to end after the client closed", func() bool { return waitCount(t, h.reg, holdClientGone) == 1 })
	if g := heldRequests(t, h.reg); g != 0 {
		t.Errorf("held gauge %v after the client left, want 0", g)
	}
	got := rec.all()
	if len(got) != 2 || got[0].Held != 1 || got[1].Held != 0 {
		t.Errorf("demand records %+v, want held 1 then 0", got)
	}
	if n := counterValue(t, h.reg, "proxy_operator_gateway_tunnels_total", "outcome", outcomeClientGone); n != 1 {
		t.Errorf("tunnels counted client_gone: %v, want 1", n)
	}
}

// TestHeldPerPoolBound: beyond MaxHeldPerPool a request is refused at once with 503 and
// Retry-After; the held ones go on waiting.
func TestHeldPerPoolBound(t *testing.T) {
	h, _ := zeroHarness(t, func(c *Config) { c.MaxHeldPerPool = 2 })
	for range 2 {
		c, err := net.Dial("tcp", h.httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nProxy-Authorization: %s\r\n\r\n", basicAuth("me+pool=news", tokenCrawlers))
	}
	eventually(t, "two CONNECTs held", func() bool { return heldRequests(t, h.reg) == 2 })
	_, _, resp := rawConnect(t, h.httpAddr, "example.com:443", "me+pool=news", tokenCrawlers)
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "10" ||
		!strings.Contains(body, "pool crawlers/news has no exit ready and already holds 2 requests") {
		t.Fatalf("the third: %s, Retry-After %q, %q", resp.Status, resp.Header.Get("Retry-After"), body)
	}
	if n := waitCount(t, h.reg, holdFull); n != 1 {
		t.Errorf("waits refused as full: %d, want 1", n)
	}
	if g := heldRequests(t, h.reg); g != 2 {
		t.Errorf("held gauge %v, want the 2 still held", g)
	}
}

// TestHoldingOffAnswersAtOnce: with ActivationTimeout 0 a pool with no exit gets its 502
// at once, as before holding existed.
func TestHoldingOffAnswersAtOnce(t *testing.T) {
	h, rec := zeroHarness(t, func(c *Config) { c.ActivationTimeout = 0 })
	_, _, resp := rawConnect(t, h.httpAddr, "example.com:443", "me+pool=news", tokenCrawlers)
	if body := readBody(t, resp); resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "no eligible exit") {
		t.Fatalf("%s %q, want 502 naming no eligible exit", resp.Status, body)
	}
	if n := waitCount(t, h.reg, holdTimeout) + waitCount(t, h.reg, holdServed); n != 0 || len(rec.all()) != 0 {
		t.Errorf("a request was held with holding off: waits %d, demand %+v", n, rec.all())
	}
}

// TestHeldEndsOnShutdown: a draining gateway answers its held requests 503 at once, for
// the crawler to try another replica.
func TestHeldEndsOnShutdown(t *testing.T) {
	h, _ := zeroHarness(t, nil)
	done := make(chan *http.Response, 1)
	go func() {
		_, _, resp := rawConnect(t, h.httpAddr, "example.com:443", "me+pool=news", tokenCrawlers)
		done <- resp
	}()
	eventually(t, "the CONNECT held", func() bool { return heldRequests(t, h.reg) == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.g.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown waited for the held request: %v", err)
	}
	resp := <-done
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("held request at shutdown: %s, Retry-After %q", resp.Status, resp.Header.Get("Retry-After"))
	}
	if n := waitCount(t, h.reg, holdShutdown); n != 1 {
		t.Errorf("waits ended by shutdown: %d, want 1", n)
	}
}

// TestMeasureDemand: a pool's demand is its open tunnels plus live sessions, and its
// requests per second, those naming it and those its exits carried without naming it; a
// pool whose demand ended is measured once at zero, then no more.
func TestMeasureDemand(t *testing.T) {
	exit := startTestExit(t, "crawlers", "news-0", "127.0.0.3")
	exit.Exit.Pool = "news"
	h := newHarness(t, []*testExit{exit}, nil)
	h.chooser.pools["news"] = []string{exit.ID()}
	st := startSite(t)
	h.g.MeasureDemand() // starts the interval
	c, _, resp := rawConnect(t, h.httpAddr, st.addr, "me+pool=news+session=s1", tokenCrawlers)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	r2, err := h.client("me+pool=news", tokenCrawlers).Get(st.url)
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, r2)
	r3, err := h.client("me", tokenCrawlers).Get(st.url) // no pool named: its exit's pool
	if err != nil {
		t.Fatal(err)
	}
	readBody(t, r3)
	h.g.demand.mu.Lock()
	requests := h.g.demand.pools[poolKey{"crawlers", "news"}].requests
	h.g.demand.mu.Unlock()
	if requests != 3 {
		t.Errorf("requests counted for crawlers/news: %d, want the tunnel and both requests", requests)
	}
	got := h.g.MeasureDemand()
	if len(got) != 1 || got[0].Namespace != "crawlers" || got[0].Pool != "news" || got[0].Sessions != 2 || got[0].RequestsPerSecond <= 0 {
		t.Fatalf("demand with one tunnel of one session and a request: %+v, want crawlers/news with 2 sessions and a rate", got)
	}
	if v := counterValue(t, h.reg, "proxy_operator_gateway_pool_sessions", "pool", "news"); v != 2 {
		t.Errorf("proxy_operator_gateway_pool_sessions %v, want 2", v)
	}
	c.Close()
	eventually(t, "the tunnel to close", func() bool { return counterValue(t, h.reg, "proxy_operator_gateway_tunnels_open", "", "") == 0 })
	h.g.sessions.mu.Lock()
	clear(h.g.sessions.m) // the session's sesstime is over
	h.g.sessions.mu.Unlock()
	if got := h.g.MeasureDemand(); len(got) != 1 || got[0] != (PoolDemand{Namespace: "crawlers", Pool: "news"}) {
		t.Fatalf("demand after it ended: %+v, want crawlers/news once at zero", got)
	}
	if got := h.g.MeasureDemand(); len(got) != 0 {
		t.Fatalf("demand measured again after its zero: %+v", got)
	}
}
