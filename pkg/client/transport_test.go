package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/pkg/client"
)

// feedbackErrors collects what a Transport could not report.
type feedbackErrors struct {
	mu   sync.Mutex
	errs []error
}

func (e *feedbackErrors) add(err error) { e.mu.Lock(); e.errs = append(e.errs, err); e.mu.Unlock() }
func (e *feedbackErrors) get() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.errs...)
}

func fetch(t *testing.T, hc *http.Client, u string) (int, string) {
	t.Helper()
	res, err := hc.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// A crawl of a site that bans the proxy its pages stick to: the banned request goes
// again through another proxy, every page arrives, the ban is reported, the proxy cools
// for that site (and discovery leaves it out there), and it still carries another site.
func TestTransportRecoversFromABan(t *testing.T) {
	f := newFleet(t, discovery.Options{})
	c := newClient(t, f.url, testToken)
	ctx := context.Background()
	sticky, err := c.Pick(ctx, client.Query{Domain: "shop.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	other := siteStickingTo(t, c, sticky.Ref())
	s := newSite(t, "example.com", sticky.EgressIP)

	var fe feedbackErrors
	tr := c.Transport(client.TransportConfig{FlushInterval: 20 * time.Millisecond, OnFeedbackError: fe.add})
	hc := &http.Client{Transport: tr}
	for i := range 30 {
		host := []string{"shop.example.com", "www.shop.example.com"}[i%2]
		code, body := fetch(t, hc, s.url(host, fmt.Sprintf("/page/%d", i)))
		if code != http.StatusOK || body != fmt.Sprintf("%s /page/%d", host, i) {
			t.Fatalf("page %d on %s: %d %q", i, host, code, body)
		}
	}
	// The ban is reported within a flush: discovery then leaves the proxy out for the site.
	testutil.WaitFor(t, 10*time.Second, "discovery to leave the banned proxy out for example.com", func() (bool, error) {
		l, err := c.List(ctx, client.Query{Domain: "www.shop.example.com"})
		return err == nil && len(l) == 2, fmt.Errorf("%d proxies, %v", len(l), err)
	})
	for i := range 20 {
		host := []string{"shop.example.com", other}[i%2]
		if code, _ := fetch(t, hc, s.url(host, fmt.Sprintf("/more/%d", i))); code != http.StatusOK {
			t.Fatalf("more/%d on %s: %d", i, host, code)
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	st := tr.Stats()
	t.Logf("stats %+v", st)
	if st.Requests != 50 || st.OK != 50 || st.Banned < 1 || st.Retries != st.Banned || st.Attempts != st.Requests+st.Retries || st.Rejected != 0 ||
		st.Reported != st.OK+st.Banned {
		t.Errorf("stats %+v: want 50 requests, all ok in the end, each ban retried once, every report taken", st)
	}
	if errs := fe.get(); len(errs) != 0 {
		t.Errorf("feedback errors: %v", errs)
	}
	cd := f.cooldowns(sticky.Name)
	if len(cd) != 1 || cd[0].Site != "example.com" || cd[0].Bans != 1 || time.Until(cd[0].Until.Time) < 4*time.Minute {
		t.Errorf("%s's cooldowns: %+v, want one 5 min ban for example.com", sticky.Name, cd)
	}
	// The banned proxy was sent only the requests it was banned for on the banning site,
	// and still carried every page of the other site, which sticks to it.
	if n := s.count(sticky.EgressIP, "shop.example.com") + s.count(sticky.EgressIP, "www.shop.example.com"); int64(n) != st.Banned {
		t.Errorf("the banned proxy was sent %d requests for the banning site, %d bans seen", n, st.Banned)
	}
	if got := s.count(sticky.EgressIP, other); got != 10 {
		t.Errorf("the banned proxy %s carried %d of the 10 pages of %s, which does not ban it", sticky.Ref(), got, other)
	}
}

// A site that bans every proxy: the request goes through MaxBanRetries other proxies,
// then the ban answer is returned as it is. A body that cannot be read again is not
// retried.
func TestTransportRetriesAreBounded(t *testing.T) {
	f := newFleet(t, discovery.Options{})
	c := newClient(t, f.url, testToken)
	s := newSite(t, "example.com", "127.0.0.2", "127.0.0.3", "127.0.0.4")
	tr := c.Transport(client.TransportConfig{MaxBanRetries: 1, FlushInterval: time.Hour})
	defer tr.Close()
	hc := &http.Client{Transport: tr}
	if code, body := fetch(t, hc, s.url("shop.example.com", "/")); code != http.StatusForbidden || !strings.Contains(body, "forbidden") {
		t.Errorf("got %d %q, want the site's 403", code, body)
	}
	if st := tr.Stats(); st.Attempts != 2 || st.Retries != 1 || st.Banned != 2 {
		t.Errorf("stats %+v, want 2 attempts", st)
	}

	req, _ := http.NewRequest(http.MethodPost, s.url("shop.example.com", "/form"), io.NopCloser(strings.NewReader("a=1")))
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if st := tr.Stats(); res.StatusCode != http.StatusForbidden || st.Attempts != 3 {
		t.Errorf("a body without GetBody: %d, stats %+v; want one attempt", res.StatusCode, st)
	}

	none := c.Transport(client.TransportConfig{MaxBanRetries: -1, FlushInterval: time.Hour})
	defer none.Close()
	if code, _ := fetch(t, &http.Client{Transport: none}, s.url("shop.example.com", "/")); code != http.StatusForbidden || none.Stats().Attempts != 1 {
		t.Errorf("MaxBanRetries -1: %d, stats %+v", code, none.Stats())
	}
}

// 429 is reported throttled with its Retry-After and returned, not retried; with
// BanStatus 404 the site's 404 is a ban, sent again through another proxy.
func TestTransportReportsThrottles(t *testing.T) {
	f := newFleet(t, discovery.Options{})
	c := newClient(t, f.url, testToken)
	s := newSite(t, "nothing.invalid")
	tr := c.Transport(client.TransportConfig{FlushInterval: time.Hour, BanStatus: []int{http.StatusNotFound}})
	hc := &http.Client{Transport: tr}
	start := time.Now()
	if code, _ := fetch(t, hc, s.url("news.example.org", "/throttle")); code != http.StatusTooManyRequests {
		t.Fatalf("got %d, want the site's 429", code)
	}
	if code, _ := fetch(t, hc, s.url("news.example.org", "/ok")); code != http.StatusOK {
		t.Fatalf("got %d", code)
	}
	if code, _ := fetch(t, hc, s.url("news.example.net", "/404")); code != http.StatusNotFound {
		t.Fatalf("got %d, want the site's 404", code)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if st := tr.Stats(); st.Throttled != 1 || st.OK != 1 || st.Banned != 3 || st.Attempts != 5 || st.Reported != 5 {
		t.Errorf("stats %+v", st)
	}
	p, err := c.Pick(context.Background(), client.Query{Key: "example.org"})
	if err != nil {
		t.Fatal(err)
	}
	cds := f.cooldowns(p.Name)
	i := slices.IndexFunc(cds, func(c v1alpha1.ProxyCooldown) bool { return c.Site == "example.org" })
	if i < 0 || cds[i].LastOutcome != "throttled" || cds[i].Bans != 0 ||
		cds[i].Until.Time.Before(start.Add(6*time.Second)) || cds[i].Until.Time.After(time.Now().Add(8*time.Second)) {
		t.Errorf("%s's cooldowns after a 429 with Retry-After: 7: %+v", p.Name, cds)
	}
	for _, px := range []string{"p2", "p3", "p4"} {
		if !slices.ContainsFunc(f.cooldowns(px), func(c v1alpha1.ProxyCooldown) bool { return c.Site == "example.net" && c.Bans == 1 }) {
			t.Errorf("%s is not cooling for example.net after three 404s as bans: %+v", px, f.cooldowns(px))
		}
	}
}

// A saturated site is an error naming the request and carrying the Retry-After; a host
// that is no site (an IP address) is picked by key and not reported; a proxy that does
// not answer is an error naming the request and the proxy.
func TestTransportErrors(t *testing.T) {
	f := newFleet(t, discovery.Options{})
	c := newClient(t, f.url, testToken)
	s := newSite(t, "nothing.invalid")
	tr := c.Transport(client.TransportConfig{FlushInterval: time.Hour})
	defer tr.Close()
	hc := &http.Client{Transport: tr}

	f.setCooldown("p2", "example.com", time.Now().Add(90*time.Second))
	f.setCooldown("p3", "example.com", time.Now().Add(200*time.Second))
	_, err := hc.Get(s.url("shop.example.com", "/page/1"))
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusServiceUnavailable || ae.RetryAfter < 30*time.Second || ae.RetryAfter > 90*time.Second ||
		!strings.Contains(err.Error(), s.url("shop.example.com", "/page/1")) || !strings.Contains(err.Error(), "saturated") {
		t.Errorf("saturated site: %v", err)
	}

	code, body := fetch(t, hc, s.url("127.0.0.1", "/ip"))
	if code != http.StatusOK || body != "127.0.0.1 /ip" || tr.Stats().OK != 1 {
		t.Errorf("an IP host: %d %q, stats %+v", code, body, tr.Stats())
	}
	tr.Close()
	if st := tr.Stats(); st.Reported != 0 || st.Rejected != 0 {
		t.Errorf("an IP host was reported: %+v", st)
	}

	tr2 := c.Transport(client.TransportConfig{FlushInterval: time.Hour, MaxProxyRetries: -1})
	defer tr2.Close()
	p, _ := c.Pick(context.Background(), client.Query{Domain: "news.example.org"})
	f.fps[p.Ref()].Close()
	_, err = (&http.Client{Transport: tr2}).Get(s.url("news.example.org", "/x"))
	if err == nil || !strings.Contains(err.Error(), s.url("news.example.org", "/x")) || !strings.Contains(err.Error(), "egress proxy "+p.Ref()) ||
		!strings.Contains(err.Error(), "egress proxies tried: "+p.Ref()+")") {
		t.Errorf("a dead proxy without retries: %v", err)
	}
	if st := tr2.Stats(); st.Attempts != 1 || st.Unreachable != 1 || st.ProxyRetries != 0 {
		t.Errorf("a dead proxy without retries: stats %+v, want one attempt, reported unreachable", st)
	}
}

// Until discovery leaves a banned proxy out, the Transport itself avoids it for the host
// that banned it, for BanMemory: a crawl faster than the feedback sees the ban once.
func TestTransportRemembersBans(t *testing.T) {
	for _, tc := range []struct {
		memory time.Duration
		bans   int64
	}{{0, 1}, {time.Nanosecond, 20}} {
		f := newFleet(t, discovery.Options{})
		c := newClient(t, f.url, testToken)
		sticky, err := c.Pick(context.Background(), client.Query{Domain: "shop.example.com"})
		if err != nil {
			t.Fatal(err)
		}
		s := newSite(t, "example.com", sticky.EgressIP)
		// No report reaches discovery during the crawl.
		tr := c.Transport(client.TransportConfig{FlushInterval: time.Hour, BanMemory: tc.memory})
		hc := &http.Client{Transport: tr}
		for i := range 20 {
			if code, _ := fetch(t, hc, s.url("shop.example.com", fmt.Sprintf("/%d", i))); code != http.StatusOK {
				t.Fatalf("page %d: %d", i, code)
			}
		}
		if st := tr.Stats(); st.Banned != tc.bans || st.Retries != tc.bans {
			t.Errorf("BanMemory %s: stats %+v, want %d bans, each retried", tc.memory, st, tc.bans)
		}
		if n := int64(s.count(sticky.EgressIP, "shop.example.com")); n != tc.bans {
			t.Errorf("BanMemory %s: %d requests through the banned proxy, want %d", tc.memory, n, tc.bans)
		}
		tr.Close()
	}
}
