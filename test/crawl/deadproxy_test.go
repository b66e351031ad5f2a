//go:build integration

package crawl

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
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
	if st["egress_proxies/unreachable"] < 1 || st["egress_proxies/proxy_retries"] != st["egress_proxies/unreachable"] ||
		st["egress_proxies/rejected"] != 0 || st["egress_proxies/feedback_errors"] != 0 {
		t.Errorf("scrapy stats %v: want the dead proxy reported unreachable, each of its failures sent through another proxy, every report taken", st)
	}
	checkExcluded(t, "scrapy", took)

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
	if gs.OK != deadProxyPages || gs.Unreachable < 1 || gs.ProxyRetries != gs.Unreachable || gs.Attempts != gs.Requests+gs.ProxyRetries ||
		gs.Rejected != 0 || gs.Reported != gs.OK+gs.Unreachable {
		t.Errorf("go stats %+v: want every page, the dead proxy reported unreachable, each of its failures sent through another proxy, every report taken", gs)
	}
	if len(feedbackErrs) > 0 {
		t.Errorf("go feedback errors: %v", feedbackErrs)
	}
	checkExcluded(t, "go", took)
}

// maxExclusion is the longest discovery may take to stop handing a proxy out after it
// died: the contract is about a second after the report; this leaves room for a loaded
// machine, and is well under the probe's own time to find the proxy unhealthy.
const maxExclusion = 10 * time.Second

// checkExcluded fails the test when took, as exclusion says it, is over maxExclusion.
func checkExcluded(t *testing.T, crawl, took string) {
	t.Helper()
	if d, err := time.ParseDuration(took); err != nil || d > maxExclusion {
		t.Errorf("%s: discovery stopped handing the dead proxy out after %s, want at most %s", crawl, took, maxExclusion)
	}
}

// killHalfway finds the proxy host's pages stick to and stops it when the request that
// makes half of deadProxyPages reaches the site (that request and those after it wait at
// the site until it is stopped, so the crawl goes on after the kill however fast it is);
// the channel then gets how long after the kill discovery's list for q stopped holding it
// (or a note that it did not within a minute). Read it with exclusion.
func killHalfway(t *testing.T, c *client.Client, s *site, fps map[string]*healthtest.ForwardProxy, host string, q client.Query) (client.Proxy, <-chan string) {
	t.Helper()
	q.Domain = host
	sticky, err := c.Pick(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	killed := make(chan time.Time, 1)
	var once sync.Once
	done := make(chan struct{})
	s.mu.Lock()
	s.onRequest = func(h string) {
		if h != host || s.total(host) < deadProxyPages/2 {
			return
		}
		once.Do(func() {
			go func() {
				fps[sticky.Name].Close()
				killed <- time.Now()
				close(done)
			}()
		})
		select {
		case <-done:
		case <-time.After(30 * time.Second): // the test's checks say what became of it
		}
	}
	s.mu.Unlock()
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	excluded := make(chan string, 1)
	go func() {
		var at time.Time
		select {
		case at = <-killed:
		case <-stop:
			return
		}
		for time.Since(at) < time.Minute { // discovery leaves it out
			l, err := c.List(context.Background(), q)
			if err == nil && !slices.ContainsFunc(l, func(p client.Proxy) bool { return p.Ref() == sticky.Ref() }) {
				excluded <- time.Since(at).Round(time.Millisecond).String()
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
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
