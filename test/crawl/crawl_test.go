//go:build integration

// Package crawl runs real crawlers against the manager binary over envtest (make
// test-integration-crawl): a Scrapy crawl through clients/scrapy's middleware and a Go
// crawl through pkg/client's transport, over three External Proxies that are forward
// proxies on loopback with distinct source addresses, against a local site that bans
// one of them; and (gateway_test.go) the gateway binary beside it, driven by crawlers
// that contain none of the project's code.
package crawl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/pkg/client"
)

const (
	token     = "crawl-t0ken"
	proxyUser = "crawler"
	proxyPass = "Crawl-pw.1"
	pages     = 200
	// the banning site as the Scrapy crawl asks for it
	scrapyHost = "shop.example.com"
)

// candidates are host names of distinct sites; the test takes the Go crawl's banning
// site and the site that bans nobody from those that stick to the banned proxy.
var candidates = []string{"shop.example.net", "shop.example.org", "shop.example.info", "shop.example.io",
	"shop.example.dev", "shop.example.app", "shop.example.eu", "shop.example.de", "shop.example.fr", "shop.example.nl",
	"shop.example.se", "shop.example.it", "shop.example.es", "shop.example.pl", "shop.example.at", "shop.example.be"}

// python is Debian's interpreter, which hack/crawl-deps.sh gives Scrapy and pytest
// (another python3 may come first on PATH); EPO_PYTHON overrides it.
func python() string {
	if p := os.Getenv("EPO_PYTHON"); p != "" {
		return p
	}
	return "/usr/bin/python3"
}

func TestCrawlersRecoverFromABan(t *testing.T) {
	env, root := startCrawlEnv(t)
	ctx := context.Background()

	// Three forward proxies demanding basic auth, dialling out from 127.0.0.2, .3 and .4.
	startProxies(t, env, "egress", 2, append([]string{scrapyHost}, candidates...)...)
	disc, tokenFile := startManager(t, env, root)
	c, err := client.New(client.Config{URL: "http://" + disc, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, c, client.Query{Namespace: "default"}, 3)

	// The site bans the proxy its crawl sticks to; the Go crawl's banning site and the
	// friendly site are two others that stick to the same proxy.
	sticky, err := c.Pick(ctx, client.Query{Domain: scrapyHost})
	if err != nil {
		t.Fatal(err)
	}
	var stickers []string
	for _, h := range candidates {
		p, err := c.Pick(ctx, client.Query{Domain: h})
		if err != nil {
			t.Fatal(err)
		}
		if p.Ref() == sticky.Ref() {
			stickers = append(stickers, h)
		}
	}
	if len(stickers) < 2 {
		t.Fatalf("only %v of %v stick to %s", stickers, candidates, sticky.Ref())
	}
	goHost, friendlyHost := stickers[0], stickers[1]
	s := newSite(t, sticky.EgressIP, friendlyHost)
	t.Logf("the site answers 403 to %s (%s) on every host but %s; Scrapy crawls %s, Go crawls %s",
		sticky.EgressIP, sticky.Ref(), friendlyHost, scrapyHost, goHost)

	// The Scrapy crawl.
	start := time.Now()
	scrapy := runScrapy(t, root, disc, tokenFile, s.urls(scrapyHost, "/scrapy/", pages))
	for _, u := range s.urls(scrapyHost, "/scrapy/", pages) {
		if got, ok := scrapy.Pages[u]; !ok || got.status != http.StatusOK || !strings.HasSuffix(u, got.body) {
			t.Errorf("scrapy: %s: %v (fetched %v)", u, got, ok)
		}
	}
	if len(scrapy.Errors) > 0 {
		t.Errorf("scrapy errors: %v", scrapy.Errors)
	}
	st := scrapy.Stats
	sBanned, sRetries := st["egress_proxies/banned"], st["egress_proxies/retries"]
	t.Logf("scrapy: %d pages in %s, %v picks, %v bans seen, %v retries, %v ok, %v reports taken",
		len(scrapy.Pages), time.Since(start).Round(time.Millisecond), st["egress_proxies/picks"], sBanned, sRetries, st["egress_proxies/ok"], st["egress_proxies/reported"])
	if sBanned < 1 || sRetries != sBanned || st["egress_proxies/rejected"] != 0 || st["egress_proxies/feedback_errors"] != 0 {
		t.Errorf("scrapy stats %v: want at least one ban, each retried, every report taken", st)
	}

	// The Go crawl: the banning site's pages, then the friendly site's.
	start = time.Now()
	tr := c.Transport(client.TransportConfig{Query: client.Query{Namespace: "default"}, OnFeedbackError: func(err error) { t.Errorf("go crawl feedback: %v", err) }})
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	crawl(t, hc, s.urls(goHost, "/go/", pages))
	crawl(t, hc, s.urls(friendlyHost, "/go/", 20))
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	gs := tr.Stats()
	t.Logf("go: %d pages in %s, %d attempts, %d bans seen, %d retries, %d ok, %d reports taken",
		gs.Requests, time.Since(start).Round(time.Millisecond), gs.Attempts, gs.Banned, gs.Retries, gs.OK, gs.Reported)
	if gs.OK != pages+20 || gs.Banned < 1 || gs.Retries != gs.Banned || gs.Reported != gs.OK+gs.Banned {
		t.Errorf("go stats %+v: want every page, at least one ban, each retried, every report taken", gs)
	}

	// Afterwards the banned proxy cools for both banning sites, in its status, and
	// discovery leaves it out for them; it still carried every page of the friendly site.
	bannedSites := []string{"example.com", strings.TrimPrefix(goHost, "shop.")}
	var px v1alpha1.Proxy
	testutil.WaitFor(t, 30*time.Second, fmt.Sprintf("%s's status.cooldowns to hold bans for %v", sticky.Ref(), bannedSites), func() (bool, error) {
		if err := env.Client.Get(ctx, ctrlclient.ObjectKey{Namespace: sticky.Namespace, Name: sticky.Name}, &px); err != nil {
			return false, err
		}
		for _, site := range bannedSites {
			i := slices.IndexFunc(px.Status.Cooldowns, func(cd v1alpha1.ProxyCooldown) bool { return cd.Site == site })
			if i < 0 || px.Status.Cooldowns[i].Bans < 1 || px.Status.Cooldowns[i].LastOutcome != "banned" || !px.Status.Cooldowns[i].Until.After(time.Now()) {
				return false, fmt.Errorf("cooldowns %+v", px.Status.Cooldowns)
			}
		}
		return true, nil
	})
	t.Logf("%s status.cooldowns: %+v", sticky.Ref(), px.Status.Cooldowns)
	if slices.ContainsFunc(px.Status.Cooldowns, func(cd v1alpha1.ProxyCooldown) bool { return cd.Site == strings.TrimPrefix(friendlyHost, "shop.") }) {
		t.Errorf("%s cools for the friendly site %s: %+v", sticky.Ref(), friendlyHost, px.Status.Cooldowns)
	}
	for _, h := range []string{scrapyHost, goHost} {
		if p, err := c.Pick(ctx, client.Query{Domain: h}); err != nil || p.Ref() == sticky.Ref() {
			t.Errorf("pick?domain=%s after the bans: %s %v, want another proxy than %s", h, p.Ref(), err, sticky.Ref())
		}
	}
	if p, err := c.Pick(ctx, client.Query{Domain: friendlyHost}); err != nil || p.Ref() != sticky.Ref() {
		t.Errorf("pick?domain=%s: %s %v, want the banned proxy %s, which that site does not ban", friendlyHost, p.Ref(), err, sticky.Ref())
	}
	if n := s.count(sticky.EgressIP, friendlyHost); n != 20 {
		t.Errorf("the banned proxy carried %d of the friendly site's 20 pages", n)
	}
	for _, h := range []string{scrapyHost, goHost} {
		t.Logf("%s: %d requests through the banned proxy, %d through the others", h, s.count(sticky.EgressIP, h), s.total(h)-s.count(sticky.EgressIP, h))
	}
}

// startCrawlEnv checks that Debian's Scrapy is there, starts envtest with the Secret of
// the proxies' basic auth (default/proxy-auth), and returns it with the repository's root.
func startCrawlEnv(t *testing.T) (*testenv.Env, string) {
	t.Helper()
	if out, err := exec.Command(python(), "-c", "import scrapy").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import scrapy (run hack/crawl-deps.sh): %v\n%s", python(), err, out)
	}
	env := testenv.StartT(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "proxy-auth", Namespace: "default",
		Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}},
		Data: map[string][]byte{"username": []byte(proxyUser), "password": []byte(proxyPass)}}
	if err := env.Client.Create(context.Background(), sec); err != nil {
		t.Fatal(err)
	}
	return env, root
}

// startProxies starts three forward proxies demanding basic auth, dialling out from
// 127.0.0.<first> and the next two addresses, resolving hosts to the site, and publishes
// them as External Proxies <crawl>-<n> labelled crawl=<crawl>, by name.
func startProxies(t *testing.T, env *testenv.Env, crawl string, first int, hosts ...string) map[string]*healthtest.ForwardProxy {
	t.Helper()
	fps := map[string]*healthtest.ForwardProxy{}
	for i := first; i < first+3; i++ {
		fp := healthtest.New(t, "127.0.0."+strconv.Itoa(i))
		fp.RequireAuth(&healthtest.Auth{Username: proxyUser, Password: proxyPass})
		for _, h := range hosts {
			fp.Resolve(h, "127.0.0.1")
		}
		name := crawl + "-" + strconv.Itoa(i)
		fps[name] = fp
		px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"crawl": crawl}},
			Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: fp.Host, Port: fp.Port,
				Proxy: &v1alpha1.ProxyConfig{BasicAuth: &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "proxy-auth"}}}}}
		if err := env.Client.Create(context.Background(), px); err != nil {
			t.Fatal(err)
		}
	}
	return fps
}

// waitHealthy waits for discovery to hand out n healthy proxies for q.
func waitHealthy(t *testing.T, c *client.Client, q client.Query, n int) {
	t.Helper()
	testutil.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d External Proxies (%+v) to be handed out healthy", n, q), func() (bool, error) {
		l, err := c.List(context.Background(), q)
		return err == nil && len(l) == n, fmt.Errorf("%d proxies, %v", len(l), err)
	}, testutil.Every(200*time.Millisecond))
}

// crawl fetches every URL with 8 workers and checks each answer is the page.
func crawl(t *testing.T, hc *http.Client, urls []string) {
	t.Helper()
	work := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for u := range work {
				res, err := hc.Get(u)
				if err != nil {
					t.Errorf("go crawl: %v", err)
					continue
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK || !strings.HasSuffix(u, string(b)) {
					t.Errorf("go crawl: %s: %d %q", u, res.StatusCode, b)
				}
			}
		}()
	}
	for _, u := range urls {
		work <- u
	}
	close(work)
	wg.Wait()
}

// startManager runs the manager binary against env, probing every second through the
// proxies with its own /v1/whoami, and returns the discovery API's address and the token
// file.
func startManager(t *testing.T, env *testenv.Env, root string) (string, string) {
	t.Helper()
	return startManagerWithProviders(t, env, "providers: []\n")
}

// startManagerWithProviders is startManager with providers as the providers config.
func startManagerWithProviders(t *testing.T, env *testenv.Env, providersConfig string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "manager")
	if err := testutil.BuildManager(bin); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kubeconfig := write("kubeconfig", string(env.KubeConfig))
	providers := write("providers.yaml", providersConfig)
	tokenFile := write("token", token+"\n")
	disc := testutil.FreeAddr(t)
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--providers-config", providers,
		"--health-probe-bind-address", testutil.FreeAddr(t), "--metrics-bind-address", "0",
		"--discovery-bind-address", disc, "--discovery-token-file", tokenFile,
		"--proxy-probe-url", "http://"+disc+"/v1/whoami", "--proxy-check-interval", "1s")
	var stderr testutil.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("manager stderr:\n%s", stderr.String())
		}
	})
	return disc, tokenFile
}

type page struct {
	status int
	body   string
}

func (p *page) UnmarshalJSON(b []byte) error {
	var v [2]any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	f, _ := v[0].(float64)
	p.status = int(f)
	p.body, _ = v[1].(string)
	return nil
}

type scrapyResult struct {
	Pages  map[string]page    `json:"pages"`
	Errors []string           `json:"errors"`
	Stats  map[string]float64 `json:"-"`
	Raw    map[string]any     `json:"stats"`
}

// runScrapy crawls urls with testdata/scrapy_crawl.py and clients/scrapy's middleware.
func runScrapy(t *testing.T, root, disc, tokenFile string, urls []string) scrapyResult {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "result.json")
	cfg, _ := json.Marshal(map[string]any{"discovery": "http://" + disc, "tokenFile": tokenFile, "urls": urls, "out": out})
	cfgFile := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfgFile, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python(), filepath.Join(root, "test/crawl/testdata/scrapy_crawl.py"), cfgFile)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "PYTHONPATH=" + filepath.Join(root, "clients/scrapy"), "PYTHONDONTWRITEBYTECODE=1"}
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Run(); err != nil {
		t.Fatalf("scrapy crawl: %v\n%s", err, logs.String())
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("scrapy crawl wrote no result: %v\n%s", err, logs.String())
	}
	var r scrapyResult
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	r.Stats = map[string]float64{}
	for k, v := range r.Raw {
		if f, ok := v.(float64); ok {
			r.Stats[k] = f
		}
	}
	if testing.Verbose() || t.Failed() {
		lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
		t.Logf("scrapy's last log lines:\n%s", strings.Join(lines[max(0, len(lines)-8):], "\n"))
	}
	return r
}

// site answers every page with its host and path, and 403 to requests from the banned
// source address for any host but the friendly one; it counts requests by source and host.
type site struct {
	port             string
	banned, friendly string
	mu               sync.Mutex
	seen             map[[2]string]int
	// onRequest, when set, is called with each request's host once it is counted.
	onRequest func(host string)
}

func newSite(t *testing.T, banned, friendly string) *site {
	t.Helper()
	s := &site{banned: banned, friendly: friendly, seen: map[[2]string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, s.port, _ = net.SplitHostPort(ln.Addr().String())
	srv := &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return s
}

func (s *site) serve(w http.ResponseWriter, r *http.Request) {
	src, _, _ := net.SplitHostPort(r.RemoteAddr)
	host, _, _ := net.SplitHostPort(r.Host)
	s.mu.Lock()
	s.seen[[2]string{src, host}]++
	hook := s.onRequest
	s.mu.Unlock()
	if hook != nil {
		hook(host)
	}
	if src == s.banned && host != s.friendly {
		http.Error(w, "Access denied", http.StatusForbidden)
		return
	}
	_, _ = io.WriteString(w, host+":"+s.port+r.URL.Path)
}

func (s *site) urls(host, prefix string, n int) []string {
	u := make([]string, n)
	for i := range u {
		u[i] = "http://" + host + ":" + s.port + prefix + strconv.Itoa(i)
	}
	return u
}

func (s *site) count(src, host string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[[2]string{src, host}]
}

func (s *site) total(host string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, v := range s.seen {
		if k[1] == host {
			n += v
		}
	}
	return n
}
