package client_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/pkg/client"
)

func newClient(t *testing.T, url, token string, mutate ...func(*client.Config)) *client.Client {
	t.Helper()
	cfg := client.Config{URL: url, Token: token}
	for _, m := range mutate {
		m(&cfg)
	}
	c, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "proxy-operator:8082", "ftp://h:1", "http://", "http://u:p@h:8082", "http://h:8082?x=1", "http://h:8082/#f", "http://h:%zz"} {
		_, err := client.New(client.Config{URL: u})
		if err == nil || !strings.Contains(err.Error(), "discovery URL") || !strings.Contains(err.Error(), fmt.Sprintf("%q", u)) {
			t.Errorf("New(%q): %v, want an error naming the discovery URL", u, err)
		}
	}
	if _, err := client.New(client.Config{URL: "https://proxy-operator:8082/"}); err != nil {
		t.Errorf("a good URL: %v", err)
	}
}

func TestListAndPick(t *testing.T) {
	f := newFleet(t, discovery.Options{})
	c := newClient(t, f.url, testToken)
	ctx := context.Background()

	all, err := c.List(ctx, client.Query{})
	if err != nil || len(all) != 3 || all[0].Ref() != "crawl/p2" || !all[0].Healthy || all[0].EgressIP != "127.0.0.2" {
		t.Fatalf("List: %+v %v", all, err)
	}
	gold, err := c.List(ctx, client.Query{LabelSelector: "tier=gold", Namespace: "crawl"})
	if err != nil || len(gold) != 2 {
		t.Fatalf("List tier=gold: %+v %v", gold, err)
	}
	if strings.Contains(all[0].URL, "@") {
		t.Errorf("a URL without credentials=true carries credentials: %s", all[0].URL)
	}

	p1, err := c.Pick(ctx, client.Query{Key: "session-1"})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if p, err := c.Pick(ctx, client.Query{Key: "session-1"}); err != nil || p.Ref() != p1.Ref() {
			t.Fatalf("pick is not sticky: %s then %s (%v)", p1.Ref(), p.Ref(), err)
		}
	}
	withCreds, err := c.Pick(ctx, client.Query{Domain: "shop.example.com", Credentials: true, LabelSelector: "tier in (gold,silver)"})
	if err != nil || !strings.Contains(withCreds.URL, proxyUser+":"+proxyPass+"@") {
		t.Fatalf("Pick with credentials: %+v %v", withCreds, err)
	}
	// Without a key the domain's site is the key.
	if bySite, err := c.Pick(ctx, client.Query{Key: "example.com"}); err != nil || bySite.Ref() != withCreds.Ref() {
		t.Errorf("pick?domain=shop.example.com gave %s, pick?key=example.com %s (%v)", withCreds.Ref(), bySite.Ref(), err)
	}

	if _, err := c.Pick(ctx, client.Query{LabelSelector: "tier=gold"}); err == nil || !strings.Contains(err.Error(), "neither Key nor Domain") {
		t.Errorf("Pick without key or domain: %v", err)
	}
}

// Every error names the request and the status, and carries the API's words.
func TestAPIErrorsNameTheURLAndStatus(t *testing.T) {
	f := newFleet(t, discovery.Options{})
	ctx := context.Background()
	cases := []struct {
		name   string
		c      *client.Client
		call   func(*client.Client) error
		status int
		want   []string
	}{
		{"bad selector", newClient(t, f.url, testToken), func(c *client.Client) error {
			_, err := c.List(ctx, client.Query{LabelSelector: "tier==="})
			return err
		}, 400, []string{"discovery GET " + f.url + "/v1/proxies?labelSelector=tier%3D%3D%3D", "400 Bad Request", "invalid label selector"}},
		{"no token", newClient(t, f.url, ""), func(c *client.Client) error {
			_, err := c.Pick(ctx, client.Query{Key: "k"})
			return err
		}, 401, []string{"/v1/proxies/pick?key=k", "401 Unauthorized"}},
		{"public suffix as domain", newClient(t, f.url, testToken), func(c *client.Client) error {
			_, err := c.Pick(ctx, client.Query{Domain: "co.uk"})
			return err
		}, 400, []string{"domain=co.uk", "400 Bad Request", "co.uk"}},
		{"wrong token on feedback", newClient(t, f.url, "nope"), func(c *client.Client) error {
			_, err := c.Feedback(ctx, []client.Report{{Proxy: "crawl/p2", Domain: "example.com", Outcome: client.OK}})
			return err
		}, 401, []string{"discovery POST " + f.url + "/v1/feedback", "401 Unauthorized"}},
	}
	for _, tc := range cases {
		before := f.feedbackPosts.Load()
		err := tc.call(tc.c)
		if got := client.StatusOf(err); got != tc.status {
			t.Errorf("%s: status %d (%v), want %d", tc.name, got, err, tc.status)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
		if n := f.feedbackPosts.Load() - before; n > 1 {
			t.Errorf("%s: sent %d times; a refused request is not sent again", tc.name, n)
		}
	}

	// Nothing listening: the error names the request.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	_, err := newClient(t, dead.URL, "").List(ctx, client.Query{})
	if err == nil || !strings.Contains(err.Error(), dead.URL+"/v1/proxies") || client.StatusOf(err) != 0 {
		t.Errorf("unreachable API: %v", err)
	}
}

// Feedback goes in batches of at most 1,000; a rejected report is reported with its index
// in the whole slice and spoils nothing.
func TestFeedbackBatchesAndRejections(t *testing.T) {
	f := newFleet(t, discovery.Options{})
	c := newClient(t, f.url, testToken)
	reports := make([]client.Report, 1500)
	for i := range reports {
		reports[i] = client.Report{Proxy: "crawl/p2", Domain: fmt.Sprintf("s%d.example.com", i), Outcome: client.OK}
	}
	reports[10] = client.Report{Proxy: f.proxies[1].Spec.Address + ":1", Domain: "example.com", Outcome: client.Banned}
	reports[1200] = client.Report{Proxy: "crawl/gone", Domain: "example.com", Outcome: client.Banned}
	reports[1300] = client.Report{Proxy: "crawl/p3", Domain: "shop.example.com", Outcome: client.Throttled, RetryAfter: 1500 * time.Millisecond}
	reports[1400] = client.Report{Proxy: "http://" + proxyUser + ":" + proxyPass + "@" + f.proxies[2].Spec.Address + ":" + fmt.Sprint(f.proxies[2].Spec.Port), Domain: "www.shop.example.com", Outcome: client.Banned}
	start := time.Now()
	res, err := c.Feedback(context.Background(), reports)
	if err != nil {
		t.Fatal(err)
	}
	if res.Accepted != 1498 || len(res.Rejected) != 2 || res.Rejected[0].Index != 10 || res.Rejected[1].Index != 1200 ||
		!strings.Contains(res.Rejected[1].Error, `unknown proxy "crawl/gone"`) {
		t.Fatalf("result %+v", res)
	}
	if n := f.feedbackPosts.Load(); n != 2 {
		t.Errorf("%d requests for 1,500 reports, want 2", n)
	}
	cd := f.cooldowns("p3")
	if len(cd) != 1 || cd[0].Site != "example.com" || cd[0].LastOutcome != "throttled" ||
		cd[0].Until.Time.Before(start.Add(time.Second)) || cd[0].Until.Time.After(time.Now().Add(3*time.Second)) {
		t.Errorf("p3's cooldowns after a 1.5 s throttle: %+v", cd)
	}
	if cd := f.cooldowns("p4"); len(cd) != 1 || cd[0].Bans != 1 || cd[0].LastOutcome != "banned" {
		t.Errorf("p4's cooldowns after a ban reported by its credentialed URL: %+v", cd)
	}
}

// A draining replica answers 503 with Retry-After: 1; the batch goes again, after that
// second, and the Service's next replica takes it.
func TestFeedbackRetriesThroughADrainingReplica(t *testing.T) {
	draining := newFleet(t, discovery.Options{})
	draining.srv.Drain()
	live := newFleet(t, discovery.Options{})
	var n atomic.Int64
	service := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		target := live.url
		if n.Add(1) == 1 {
			target = draining.url
		}
		httputilProxy(w, r, target)
	}))
	t.Cleanup(service.Close)

	c := newClient(t, service.URL, testToken)
	start := time.Now()
	res, err := c.Feedback(context.Background(), []client.Report{{Proxy: "crawl/p2", Domain: "shop.example.com", Outcome: client.Banned}})
	if err != nil || res.Accepted != 1 {
		t.Fatalf("Feedback: %+v %v", res, err)
	}
	if el := time.Since(start); el < time.Second {
		t.Errorf("sent again after %s, before the answer's Retry-After of 1s", el)
	}
	if draining.feedbackPosts.Load() != 1 || live.feedbackPosts.Load() != 1 {
		t.Errorf("draining replica got %d posts, live %d; want 1 each", draining.feedbackPosts.Load(), live.feedbackPosts.Load())
	}
	if cd := live.cooldowns("p2"); len(cd) != 1 || cd[0].Site != "example.com" {
		t.Errorf("the live replica's p2 cooldowns: %+v", cd)
	}
	if cd := draining.cooldowns("p2"); len(cd) != 0 {
		t.Errorf("the draining replica took the report: %+v", cd)
	}
}

// A replica that keeps answering 503: the client gives up after FeedbackAttempts, each
// wait capped by MaxRetryWait, with an error naming the request, the status and the count.
func TestFeedbackGivesUp(t *testing.T) {
	f := newFleet(t, discovery.Options{})
	f.srv.Drain()
	c := newClient(t, f.url, testToken, func(c *client.Config) {
		c.FeedbackAttempts = 3
		c.MaxRetryWait = 20 * time.Millisecond
	})
	_, err := c.Feedback(context.Background(), []client.Report{{Proxy: "crawl/p2", Domain: "example.com", Outcome: client.OK}})
	if client.StatusOf(err) != http.StatusServiceUnavailable || !strings.Contains(err.Error(), "gave up after 3 attempts") ||
		!strings.Contains(err.Error(), "POST "+f.url+"/v1/feedback") || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("err %v", err)
	}
	if n := f.feedbackPosts.Load(); n != 3 {
		t.Errorf("%d attempts, want 3", n)
	}

	// A cancelled context stops the waiting.
	c = newClient(t, f.url, testToken, func(c *client.Config) { c.FeedbackAttempts = 100 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = c.Feedback(ctx, []client.Report{{Proxy: "crawl/p2", Domain: "example.com", Outcome: client.OK}})
	if !errors.Is(err, context.DeadlineExceeded) || client.StatusOf(err) != http.StatusServiceUnavailable {
		t.Errorf("cancelled: %v", err)
	}
}

// httputilProxy relays r to target, as a Service would.
func httputilProxy(w http.ResponseWriter, r *http.Request, target string) {
	u, _ := url.Parse(target)
	httputil.NewSingleHostReverseProxy(u).ServeHTTP(w, r)
}

// Over https the client trusts the CA Config.TLS gives; without it the error names the URL.
func TestTLS(t *testing.T) {
	f := newFleet(t, discovery.Options{})
	ts := httptest.NewTLSServer(f.srv.Handler())
	t.Cleanup(ts.Close)
	pool := x509.NewCertPool()
	pool.AddCert(ts.Certificate())
	c := newClient(t, ts.URL, testToken, func(c *client.Config) { c.TLS = &tls.Config{RootCAs: pool} })
	if l, err := c.List(context.Background(), client.Query{}); err != nil || len(l) != 3 {
		t.Fatalf("List over TLS: %v %v", l, err)
	}
	_, err := newClient(t, ts.URL, testToken).List(context.Background(), client.Query{})
	if err == nil || !strings.Contains(err.Error(), ts.URL+"/v1/proxies") || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("an untrusted certificate: %v", err)
	}
}
