package client_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/pkg/client"
)

// unreachableReports are the proxies of the unreachable reports the fleet received,
// failing the test on one that carries a domain or another field.
func unreachableReports(t *testing.T, f *fleet) []string {
	t.Helper()
	_, reports := f.received()
	var refs []string
	for _, r := range reports {
		if r["outcome"] != "unreachable" {
			continue
		}
		if len(r) != 2 {
			t.Errorf("an unreachable report with more than proxy and outcome: %v", r)
		}
		refs = append(refs, fmt.Sprint(r["proxy"]))
	}
	return refs
}

// The proxy a site sticks to stops answering (its port closed): the first request gets
// its connection refused, is reported unreachable at once (long before the next flush)
// and goes again through the next proxy, picked with exclude=; the requests after it
// avoid the dead proxy, and every page arrives.
func TestTransportSendsARequestAgainWhenItsProxyDoesNotAnswer(t *testing.T) {
	f := newFleet(t, discovery.Options{})
	c := newClient(t, f.url, testToken)
	dead, err := c.Pick(context.Background(), client.Query{Domain: "shop.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	f.fps[dead.Ref()].Close()
	before, _ := f.received()
	s := newSite(t, "nothing.invalid")
	var fe feedbackErrors
	tr := c.Transport(client.TransportConfig{FlushInterval: time.Hour, OnFeedbackError: fe.add})
	defer tr.Close()
	hc := &http.Client{Transport: tr}
	for i := range 10 {
		if code, body := fetch(t, hc, s.url("shop.example.com", fmt.Sprintf("/page/%d", i))); code != http.StatusOK || body != fmt.Sprintf("shop.example.com /page/%d", i) {
			t.Fatalf("page %d: %d %q", i, code, body)
		}
	}
	st := tr.Stats()
	t.Logf("stats %+v", st)
	if st.Requests != 10 || st.OK != 10 || st.Unreachable != 1 || st.ProxyRetries != 1 || st.Attempts != 11 || st.Retries != 0 {
		t.Errorf("stats %+v: want 10 pages in 11 attempts, the dead proxy met once and its request sent again once", st)
	}
	if n := s.count(dead.EgressIP, "shop.example.com"); n != 0 {
		t.Errorf("%d requests arrived through the dead proxy", n)
	}
	testutil.WaitFor(t, 10*time.Second, "the unreachable report to be sent without waiting for the hourly flush", func() (bool, error) {
		got := unreachableReports(t, f)
		return slices.Equal(got, []string{dead.Ref()}), fmt.Errorf("unreachable reports for %v", got)
	})
	// The request sent again asked for a proxy other than the dead one by exclude=, with
	// the site as the domain (so its cooldowns apply). (While the Transport remembers the
	// dead proxy, the requests after it ask so too, from a discovery API that takes
	// exclude=.)
	picks, _ := f.received()
	picks = picks[len(before):]
	if len(picks) < 2 || len(picks[0]["exclude"]) != 0 || !slices.Equal(picks[1]["exclude"], []string{dead.Ref()}) || picks[1].Get("domain") != "shop.example.com" {
		t.Errorf("the crawl's picks %v: want the second with exclude=%s and domain=shop.example.com", picks, dead.Ref())
	}
	// Discovery took the report and leaves the dead proxy out of its answers.
	testutil.WaitFor(t, 10*time.Second, "discovery to leave the unreachable proxy out", func() (bool, error) {
		l, err := c.List(context.Background(), client.Query{})
		return err == nil && len(l) == 2 && !slices.ContainsFunc(l, func(p client.Proxy) bool { return p.Ref() == dead.Ref() }),
			fmt.Errorf("%d proxies listed, %v", len(l), err)
	})
	if p, err := c.Pick(context.Background(), client.Query{Domain: "shop.example.com"}); err != nil || p.Ref() == dead.Ref() {
		t.Errorf("pick?domain=shop.example.com after the report: %s %v, want another proxy than %s", p.Ref(), err, dead.Ref())
	}
	if errs := fe.get(); len(errs) > 0 {
		t.Errorf("feedback errors: %v", errs)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if st := tr.Stats(); st.Rejected != 0 || st.Reported != st.OK+st.Unreachable {
		t.Errorf("stats %+v: want every report taken, the unreachable one too", st)
	}
}

// With every proxy dead, a request goes through each at most once and fails with an
// error naming them all; MaxProxyRetries bounds the attempts, and a body that cannot be
// read again is not sent twice. Once they are all reported, discovery has none to give.
func TestTransportGivesUpNamingEveryProxyTried(t *testing.T) {
	s := newSite(t, "nothing.invalid")
	u := s.url("news.example.org", "/x")
	for _, tc := range []struct {
		retries        int
		attempts       int64
		body, rewinds  bool
		wantInErrorEnd string
	}{
		{retries: 0, attempts: 3},
		{retries: 1, attempts: 2},
		{retries: 0, attempts: 1, body: true},
		{retries: 0, attempts: 3, body: true, rewinds: true},
	} {
		name := fmt.Sprintf("MaxProxyRetries %d, body %v, GetBody %v", tc.retries, tc.body, tc.rewinds)
		// A fleet of its own: discovery leaves out the proxies reported before.
		f := newFleet(t, discovery.Options{})
		c := newClient(t, f.url, testToken)
		for _, fp := range f.fps {
			fp.Close()
		}
		tr := c.Transport(client.TransportConfig{FlushInterval: time.Hour, MaxProxyRetries: tc.retries})
		var req *http.Request
		switch {
		case tc.rewinds:
			req, _ = http.NewRequest(http.MethodPost, u, strings.NewReader("a=1"))
		case tc.body:
			req, _ = http.NewRequest(http.MethodPost, u, io.NopCloser(strings.NewReader("a=1")))
		default:
			req, _ = http.NewRequest(http.MethodGet, u, nil)
		}
		res, err := (&http.Client{Transport: tr}).Do(req)
		if err == nil {
			res.Body.Close()
			t.Fatalf("%s: %d through dead proxies", name, res.StatusCode)
		}
		st := tr.Stats()
		if st.Attempts != tc.attempts || st.Unreachable != tc.attempts || st.ProxyRetries != tc.attempts-1 {
			t.Errorf("%s: stats %+v, want %d attempts, each reported unreachable", name, st, tc.attempts)
		}
		msg := err.Error()
		i := strings.Index(msg, "egress proxies tried: ")
		if tc.body && !tc.rewinds {
			if !strings.Contains(msg, "its body cannot be read again") || !strings.Contains(msg, u) {
				t.Errorf("%s: %v", name, err)
			}
		} else if i < 0 || !strings.Contains(msg, u) {
			t.Errorf("%s: %v, want the URL and the proxies tried", name, err)
		} else {
			tried := strings.Split(strings.TrimSuffix(msg[i+len("egress proxies tried: "):], ")"), ", ")
			slices.Sort(tried)
			if int64(len(tried)) != tc.attempts || len(slices.Compact(slices.Clone(tried))) != len(tried) {
				t.Errorf("%s: tried %v, want %d distinct proxies: %v", name, tried, tc.attempts, err)
			}
			for _, ref := range tried {
				if f.fps[ref] == nil {
					t.Errorf("%s: %q is no proxy of the fleet", name, ref)
				}
			}
		}
		tr.Close()
		if tc.attempts == 3 {
			_, err := (&http.Client{Transport: tr}).Get(u)
			if client.StatusOf(err) != http.StatusServiceUnavailable || !strings.Contains(err.Error(), "no healthy proxy") {
				t.Errorf("%s: with all three reported, a request: %v; want discovery's 503", name, err)
			}
		}
	}
}

// What fails behind a proxy that answered is the site's: a 502 the proxy answers for an
// http:// URL and a TLS handshake failing through an open tunnel are returned as they
// are, neither retried nor reported. A proxy refusing a CONNECT answered, too: the
// request goes through another proxy, and nothing is reported unreachable.
func TestTransportLeavesFailuresBehindAProxyThatAnsweredToTheSite(t *testing.T) {
	f := newFleet(t, discovery.Options{})
	c := newClient(t, f.url, testToken)
	s := newSite(t, "nothing.invalid")
	sticky, err := c.Pick(context.Background(), client.Query{Domain: "news.example.org"})
	if err != nil {
		t.Fatal(err)
	}
	tr := c.Transport(client.TransportConfig{FlushInterval: time.Hour})
	defer tr.Close()
	hc := &http.Client{Transport: tr}

	// A TLS handshake with a site that speaks plain HTTP, through the tunnel.
	if _, err := hc.Get(strings.Replace(s.url("news.example.org", "/x"), "http://", "https://", 1)); err == nil {
		t.Fatal("a TLS handshake with a plain HTTP site succeeded")
	}
	if st := tr.Stats(); st.Attempts != 1 || st.Unreachable != 0 || st.ProxyRetries != 0 {
		t.Errorf("a failed TLS handshake through an open tunnel: stats %+v, want one attempt, unreported", st)
	}

	// The proxy answers 502 itself.
	f.fps[sticky.Ref()].SetMode(healthtest.Fail)
	if code, _ := fetch(t, hc, s.url("news.example.org", "/y")); code != http.StatusBadGateway {
		t.Errorf("the proxy's 502: got %d", code)
	}
	if st := tr.Stats(); st.Attempts != 2 || st.Unreachable != 0 || st.ProxyRetries != 0 {
		t.Errorf("the proxy's 502: stats %+v, want one more attempt, unreported", st)
	}

	// The proxy refuses the CONNECT to a TLS site: another proxy carries the request.
	tlsSite := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "secure") }))
	t.Cleanup(tlsSite.Close)
	tu, _ := url.Parse(tlsSite.URL)
	tr2 := c.Transport(client.TransportConfig{FlushInterval: time.Hour,
		Base: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}) //nolint:gosec // a test server's certificate
	defer tr2.Close()
	code, body := fetch(t, &http.Client{Transport: tr2}, "https://news.example.org:"+tu.Port()+"/z")
	if st := tr2.Stats(); code != http.StatusOK || body != "secure" || st.Attempts != 2 || st.ProxyRetries != 1 || st.Unreachable != 0 {
		t.Errorf("a refused CONNECT: %d %q, stats %+v; want the page through another proxy, unreported", code, body, st)
	}
	if got := unreachableReports(t, f); len(got) != 0 {
		t.Errorf("unreachable reports %v", got)
	}
}

// sources are the egress addresses the site saw requests for host from.
func (s *site) sources(host string) []string {
	var srcs []string
	for _, ip := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		if s.count(ip, host) > 0 {
			srcs = append(srcs, ip)
		}
	}
	return srcs
}

// By default a site's pages all go through one proxy; with a Spread they go through
// several, each pick keyed by the site and a spread index and still carrying domain=,
// so a proxy cooling for the site carries none of them.
func TestTransportSpreadsASiteWhenAsked(t *testing.T) {
	f := newFleet(t, discovery.Options{})
	c := newClient(t, f.url, testToken)
	hosts := map[string]client.Spread{
		"news.example.org":  {},
		"news.example.net":  {PerRequest: true},
		"news.example.info": {Keys: 4},
		"news.example.io":   {Worker: "crawler-0"},
		"news.example.dev":  {Worker: "crawler-0", Keys: 3},
	}
	keys := map[string]string{ // what each pick's key looks like
		"news.example.org": `^$`, "news.example.net": `^example\.net#u[0-9a-z]+$`, "news.example.info": `^example\.info#[0-3]$`,
		"news.example.io": `^example\.io@crawler-0$`, "news.example.dev": `^example\.dev@crawler-0#[0-2]$`,
	}
	s := newSite(t, "nothing.invalid")
	for host, spread := range hosts {
		tr := c.Transport(client.TransportConfig{FlushInterval: time.Hour, Spread: spread})
		hc := &http.Client{Transport: tr}
		for i := range 30 {
			if code, _ := fetch(t, hc, s.url(host, fmt.Sprintf("/page/%d?q=%d", i, i))); code != http.StatusOK {
				t.Fatalf("%s page %d: %d", host, i, code)
			}
		}
		tr.Close()
		srcs := s.sources(host)
		t.Logf("%s with %+v: through %v", host, spread, srcs)
		switch {
		case (spread.PerRequest || spread.Keys > 1) && len(srcs) < 2:
			t.Errorf("%s with %+v went through %v, want at least 2 proxies", host, spread, srcs)
		case !spread.PerRequest && spread.Keys <= 1 && len(srcs) != 1:
			t.Errorf("%s with %+v went through %v, want one proxy", host, spread, srcs)
		}
	}
	picks, _ := f.received()
	for _, q := range picks {
		re, ok := keys[q.Get("domain")]
		if !ok {
			t.Errorf("a pick without the host as domain: %v", q)
			continue
		}
		if !regexp.MustCompile(re).MatchString(q.Get("key")) {
			t.Errorf("pick %v: key %q, want %s", q, q.Get("key"), re)
		}
	}

	// A proxy cooling for the site carries none of its pages, spread or not.
	cooling, err := c.Pick(context.Background(), client.Query{Key: "example.app#0"})
	if err != nil {
		t.Fatal(err)
	}
	f.setCooldown(cooling.Name, "example.app", time.Now().Add(time.Hour))
	tr := c.Transport(client.TransportConfig{FlushInterval: time.Hour, Spread: client.Spread{PerRequest: true}})
	defer tr.Close()
	for i := range 30 {
		if code, _ := fetch(t, &http.Client{Transport: tr}, s.url("news.example.app", fmt.Sprintf("/%d", i))); code != http.StatusOK {
			t.Fatalf("news.example.app page %d: %d", i, code)
		}
	}
	if srcs := s.sources("news.example.app"); len(srcs) != 2 || slices.Contains(srcs, cooling.EgressIP) {
		t.Errorf("news.example.app went through %v with %s (%s) cooling for it; want the two others", srcs, cooling.Ref(), cooling.EgressIP)
	}
}
