//go:build integration

package crawl

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/pkg/client"
)

// deadProxyPages is how many pages each crawl of TestCrawlersSurviveADeadProxy fetches;
// the proxy its site sticks to is killed once half of them reached the site.
const deadProxyPages = 100

// A crawl through each client loses one of its three proxies halfway: the proxy its site
// sticks to stops (its connections closed, its port refusing). Every page still arrives:
// the requests it failed are reported unreachable and sent through another proxy, picked
// with exclude=. The test logs the pages, the retries, the reports and how long after the
// kill discovery stopped handing the dead proxy out.
func TestCrawlersSurviveADeadProxy(t *testing.T) {
	env, root := startCrawlEnv(t)
	disc, tokenFile := startManager(t, env, root)
	c, err := client.New(client.Config{URL: "http://" + disc, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	s := newSite(t, "", "") // bans nobody

	// The Scrapy crawl, over three proxies (127.0.0.2 to .4), before the Go crawl's exist.
	const scrapySite, goSite = "shop.example.com", "shop.example.net"
	fps := startProxies(t, env, "scrapy", 2, scrapySite)
	waitHealthy(t, c, client.Query{LabelSelector: "crawl=scrapy"}, 3)
	dead, excluded := killHalfway(t, c, s, fps, scrapySite, client.Query{LabelSelector: "crawl=scrapy"})
	start := time.Now()
	scrapy := runScrapy(t, root, disc, tokenFile, s.urls(scrapySite, "/scrapy/", deadProxyPages))
	elapsed := time.Since(start)
	for _, u := range s.urls(scrapySite, "/scrapy/", deadProxyPages) {
		if got, ok := scrapy.Pages[u]; !ok || got.status != http.StatusOK || !strings.HasSuffix(u, got.body) {
			t.Errorf("scrapy: %s: %v (fetched %v)", u, got, ok)
		}
	}
	if len(scrapy.Errors) > 0 {
		t.Errorf("scrapy errors: %v", scrapy.Errors)
	}
	st := scrapy.Stats
	took := exclusion(t, excluded)
	t.Logf("scrapy: %d of %d pages in %s, %d through the dead %s before it died; %v picks, %v unreachable reported, %v retries through another proxy, %v reports taken, %v refused; discovery stopped handing %s out %s after the kill",
		len(scrapy.Pages), deadProxyPages, elapsed.Round(time.Millisecond), s.count(dead.EgressIP, scrapySite), dead.Ref(),
		st["egress_proxies/picks"], st["egress_proxies/unreachable"], st["egress_proxies/proxy_retries"],
		st["egress_proxies/reported"], st["egress_proxies/rejected"], dead.Ref(), took)
	if st["egress_proxies/unreachable"] < 1 || st["egress_proxies/proxy_retries"] != st["egress_proxies/unreachable"] {
		t.Errorf("scrapy stats %v: want the dead proxy reported unreachable, each of its failures sent through another proxy", st)
	}

	// The Go crawl, over three proxies of its own (127.0.0.5 to .7).
	fps = startProxies(t, env, "go", 5, goSite)
	goQuery := client.Query{LabelSelector: "crawl=go"}
	waitHealthy(t, c, goQuery, 3)
	dead, excluded = killHalfway(t, c, s, fps, goSite, goQuery)
	start = time.Now()
	var feedbackErrs []string
	tr := c.Transport(client.TransportConfig{Query: goQuery, OnFeedbackError: func(err error) { feedbackErrs = append(feedbackErrs, err.Error()) }})
	crawl(t, &http.Client{Transport: tr, Timeout: 30 * time.Second}, s.urls(goSite, "/go/", deadProxyPages))
	elapsed = time.Since(start)
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	gs := tr.Stats()
	took = exclusion(t, excluded)
	t.Logf("go: %d of %d pages in %s, %d through the dead %s before it died; %d attempts, %d unreachable reported, %d retries through another proxy, %d reports taken, %d refused; discovery stopped handing %s out %s after the kill",
		gs.OK, deadProxyPages, elapsed.Round(time.Millisecond), s.count(dead.EgressIP, goSite), dead.Ref(),
		gs.Attempts, gs.Unreachable, gs.ProxyRetries, gs.Reported, gs.Rejected, dead.Ref(), took)
	if gs.OK != deadProxyPages || gs.Unreachable < 1 || gs.ProxyRetries != gs.Unreachable || gs.Attempts != gs.Requests+gs.ProxyRetries {
		t.Errorf("go stats %+v: want every page, the dead proxy reported unreachable, each of its failures sent through another proxy", gs)
	}
	if len(feedbackErrs) > 0 {
		t.Logf("go feedback errors: %v", feedbackErrs)
	}
}

// killHalfway finds the proxy host's pages stick to and, once half of deadProxyPages
// reached the site, stops it; the channel then gets how long after the kill discovery's
// list for q stopped holding it (or a note that it did not within a minute). Read it with
// exclusion.
func killHalfway(t *testing.T, c *client.Client, s *site, fps map[string]*healthtest.ForwardProxy, host string, q client.Query) (client.Proxy, <-chan string) {
	t.Helper()
	q.Domain = host
	sticky, err := c.Pick(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	excluded := make(chan string, 1)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	wait := func(d time.Duration) bool {
		select {
		case <-stop:
			return false
		case <-time.After(d):
			return true
		}
	}
	go func() {
		for s.total(host) < deadProxyPages/2 { // the crawl is halfway
			if !wait(2 * time.Millisecond) {
				return
			}
		}
		fps[sticky.Name].Close()
		killed := time.Now()
		for time.Since(killed) < time.Minute { // discovery leaves it out
			l, err := c.List(context.Background(), q)
			if err == nil && !slices.ContainsFunc(l, func(p client.Proxy) bool { return p.Ref() == sticky.Ref() }) {
				excluded <- time.Since(killed).Round(time.Millisecond).String()
				return
			}
			if !wait(20 * time.Millisecond) {
				return
			}
		}
		excluded <- "not within a minute"
	}()
	return sticky, excluded
}

// exclusion is what killHalfway's channel says, waiting at most 90 s for it (the kill
// waits for the crawl to be halfway, the exclusion at most a minute).
func exclusion(t *testing.T, excluded <-chan string) string {
	t.Helper()
	select {
	case took := <-excluded:
		return took
	case <-time.After(90 * time.Second):
		t.Errorf("the proxy was not killed halfway, or its exclusion not measured, within 90 s of the crawl's end")
		return "unknown"
	}
}
