//go:build integration

package crawl

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/pkg/client"
)

// The gateway's sites: each theme has a registrable domain of its own, so a ban or a
// cooldown of one never touches another. example.com is the site over TLS too (the only
// name httptest's certificate holds).
const (
	gwClientsHost  = "example.com"
	gwSessionHost  = "session.example.org"
	gwRotateHost   = "rotate.example.info"
	gwBanHost      = "ban.example.net"
	gwThrottleHost = "throttle.example.se"
	gwFriendlyHost = "friendly.example.io"
	gwKillHost     = "kill.example.dev"
	gwRefuseHost   = "refuse.example.eu"
	// gwHeaderTimeout is the gateway's --header-timeout: short, so the slow-header check
	// costs seconds.
	gwHeaderTimeout = 3 * time.Second
	// gwForeignNS holds one exit of its own and a ServiceAccount whose token may use it
	// alone.
	gwForeignNS = "gwa"
)

var gwHosts = []string{gwClientsHost, "www." + gwClientsHost, gwSessionHost, gwRotateHost, gwBanHost, gwThrottleHost, gwFriendlyHost, gwKillHost, gwRefuseHost}

// gwEnv is one environment for every theme of TestGateway: envtest, the manager binary
// (discovery and health checks), three External exits in default (gw-2 to gw-4, forward
// proxies demanding basic auth and dialling out from 127.0.0.2 to .4), one in gwa (gw-5,
// from 127.0.0.5), the gateway binary, and a site over HTTP and HTTPS.
type gwEnv struct {
	env  *testenv.Env
	root string
	c    *client.Client
	gw   *gatewayProc
	site *gwSite
	fps  map[string]*healthtest.ForwardProxy // by Proxy name, in default
	// saToken is a ServiceAccount token of gwa that may use gwa alone.
	saToken string
	// seen collects every response (headers and body) and every curl -v output the
	// clients received, for the search for the exits' password.
	seenMu sync.Mutex
	seen   []string
}

// TestGateway runs the gateway binary beside the manager binary over envtest and drives
// it with crawlers that contain none of the project's code: curl, Python requests,
// Debian's Scrapy, Go's net/http and headless chromium. Each theme is a subtest over the
// one environment; the killed exit comes last, since it takes an exit away.
func TestGateway(t *testing.T) {
	start := time.Now()
	g := startGatewayEnv(t)
	t.Logf("environment up in %s", time.Since(start).Round(time.Millisecond))
	for _, theme := range []struct {
		name string
		f    func(*testing.T, *gwEnv)
	}{
		{"Clients", gatewayClients},
		{"IdentityHeaders", gatewayIdentityHeaders},
		{"Refusals", gatewayRefusals},
		{"SessionSurvivesRestart", gatewaySession},
		{"RotationSpreads", gatewayRotation},
		{"PlainHTTPBan", gatewayBan},
		{"KilledExit", gatewayKilledExit},
		{"NoExitPasswordSeen", gatewayNoPasswordSeen},
	} {
		s := time.Now()
		t.Run(theme.name, func(t *testing.T) { theme.f(t, g) })
		t.Logf("%s: %s", theme.name, time.Since(s).Round(time.Millisecond))
	}
	t.Logf("TestGateway in all: %s", time.Since(start).Round(time.Millisecond))
}

func startGatewayEnv(t *testing.T) *gwEnv {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("%s: %v (run hack/crawl-deps.sh)", chromiumPath, err)
	}
	env, root := startCrawlEnv(t)
	g := &gwEnv{env: env, root: root}
	g.fps = startProxies(t, env, "gw", 2, gwHosts...)
	ctx := context.Background()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gwForeignNS}}); err != nil {
		t.Fatal(err)
	}
	foreign := healthtest.New(t, "127.0.0.5")
	foreign.RequireAuth(&healthtest.Auth{Username: proxyUser, Password: proxyPass})
	for _, h := range gwHosts {
		foreign.Resolve(h, "127.0.0.1")
	}
	if err := env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "proxy-auth", Namespace: gwForeignNS,
		Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}},
		Data: map[string][]byte{"username": []byte(proxyUser), "password": []byte(proxyPass)}}); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "gw-5", Namespace: gwForeignNS},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: foreign.Host, Port: foreign.Port,
			Proxy: &v1alpha1.ProxyConfig{BasicAuth: &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "proxy-auth"}}}}}); err != nil {
		t.Fatal(err)
	}
	g.saToken = testenv.CrawlerToken(t, context.Background(), env, gwForeignNS)

	disc, tokenFile := startManager(t, env, root)
	c, err := client.New(client.Config{URL: "http://" + disc, Token: token})
	if err != nil {
		t.Fatal(err)
	}
	g.c = c
	g.site = newGwSite(t)
	waitHealthy(t, c, client.Query{Namespace: "default"}, 3)
	waitHealthy(t, c, client.Query{Namespace: gwForeignNS}, 1)
	waitEgress(t, env)

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	g.gw = &gatewayProc{bin: buildGateway(t, dir), kubeconfig: kubeconfig, tokenFile: tokenFile,
		listen: testutil.FreeAddr(t), socks: testutil.FreeAddr(t), probe: testutil.FreeAddr(t), metrics: testutil.FreeAddr(t)}
	g.gw.start(t)
	t.Cleanup(func() { g.gw.kill(t) })
	return g
}

// waitEgress waits for the health checks to have written every exit's egress address,
// which X-Egress-IP carries.
func waitEgress(t *testing.T, env *testenv.Env) {
	t.Helper()
	testutil.WaitFor(t, 2*time.Minute, "the four exits' status.egressIP (127.0.0.<n> of gw-<n>)", func() (bool, error) {
		var l v1alpha1.ProxyList
		if err := env.Client.List(context.Background(), &l); err != nil {
			return false, err
		}
		var got []string
		for _, p := range l.Items {
			if strings.HasPrefix(p.Name, "gw-") && p.Status.EgressIP == "127.0.0."+strings.TrimPrefix(p.Name, "gw-") {
				got = append(got, p.Name)
			}
		}
		return len(got) == 4, fmt.Errorf("right egress addresses on %v", got)
	}, testutil.Every(200*time.Millisecond))
}

// buildGateway builds cmd/gateway into dir.
func buildGateway(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "gateway")
	if err := testutil.BuildGateway(bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// gatewayProc is the gateway binary; start and stop keep its addresses, so a restart
// serves on the same ports.
type gatewayProc struct {
	bin, kubeconfig, tokenFile    string
	listen, socks, probe, metrics string
	// args are further flags.
	args   []string
	cmd    *exec.Cmd
	exited chan error
	stderr *testutil.SyncBuffer
	logs   []*testutil.SyncBuffer
}

func (p *gatewayProc) start(t *testing.T) {
	t.Helper()
	p.cmd = exec.Command(p.bin, append([]string{"--kubeconfig", p.kubeconfig, "--listen-address", p.listen, "--socks-listen-address", p.socks,
		"--health-probe-bind-address", p.probe, "--metrics-bind-address", p.metrics, "--discovery-token-file", p.tokenFile,
		"--header-timeout", gwHeaderTimeout.String(), "--shutdown-grace", "5s"}, p.args...)...)
	p.stderr = &testutil.SyncBuffer{}
	p.logs = append(p.logs, p.stderr)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.exited = make(chan error, 1)
	go func(cmd *exec.Cmd, exited chan error) { exited <- cmd.Wait() }(p.cmd, p.exited)
	testutil.WaitFor(t, 2*time.Minute, "the gateway's /readyz to answer 200", func() (bool, error) {
		select {
		case err := <-p.exited:
			p.exited <- err
			t.Fatalf("the gateway exited before it was ready: %v\n%s", err, p.stderr.String())
		default:
		}
		res, err := http.Get("http://" + p.probe + "/readyz")
		if err != nil {
			return false, err
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK, fmt.Errorf("/readyz %d", res.StatusCode)
	}, testutil.Every(100*time.Millisecond))
}

// stop sends SIGTERM and waits for the gateway to drain and exit 0.
func (p *gatewayProc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("the gateway exited with %v after SIGTERM\n%s", err, p.stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("the gateway did not exit within a minute of SIGTERM\n%s", p.stderr.String())
	}
	p.cmd = nil
}

func (p *gatewayProc) kill(t *testing.T) {
	if p.cmd != nil {
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	if t.Failed() {
		for i, l := range p.logs {
			t.Logf("gateway run %d stderr:\n%s", i+1, l.String())
		}
	}
}

// proxyURL is the gateway's HTTP proxy URL for the user name options and password.
func (g *gwEnv) proxyURL(user, password string) *url.URL {
	return &url.URL{Scheme: "http", User: url.UserPassword(user, password), Host: g.gw.listen}
}

func (g *gwEnv) record(s ...string) {
	g.seenMu.Lock()
	defer g.seenMu.Unlock()
	g.seen = append(g.seen, s...)
}

// gwSite answers every page with "<host> <path> from <source address>" and the header
// X-Site-Saw naming the source, over HTTP and HTTPS, and answers the status ban sets
// to a source for a host. It records each path's source and counts requests by host.
type gwSite struct {
	httpPort, httpsPort string
	caFile              string
	pool                *x509.CertPool
	mu                  sync.Mutex
	byHost              map[string]int
	byPath              map[string]string
	bans                map[[2]string]int
	// hold, when set, is called with each request's path and source before it is
	// answered.
	hold func(path, src string)
}

func newGwSite(t *testing.T) *gwSite {
	t.Helper()
	s := &gwSite{byHost: map[string]int{}, byPath: map[string]string{}, bans: map[[2]string]int{}}
	plain := httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(plain.Close)
	secure := httptest.NewTLSServer(http.HandlerFunc(s.serve))
	t.Cleanup(secure.Close)
	_, s.httpPort, _ = net.SplitHostPort(plain.Listener.Addr().String())
	_, s.httpsPort, _ = net.SplitHostPort(secure.Listener.Addr().String())
	s.pool = x509.NewCertPool()
	s.pool.AddCert(secure.Certificate())
	s.caFile = filepath.Join(t.TempDir(), "site-ca.pem")
	if err := os.WriteFile(s.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: secure.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *gwSite) serve(w http.ResponseWriter, r *http.Request) {
	src, _, _ := net.SplitHostPort(r.RemoteAddr)
	host, _, _ := net.SplitHostPort(r.Host)
	s.mu.Lock()
	s.byHost[host]++
	s.byPath[r.URL.Path] = src
	code := s.bans[[2]string{src, host}]
	hold := s.hold
	s.mu.Unlock()
	if hold != nil {
		hold(r.URL.Path, src)
	}
	w.Header().Set("X-Site-Saw", src)
	if code != 0 {
		w.Header().Set("Retry-After", "60")
		http.Error(w, "banned", code)
		return
	}
	fmt.Fprintf(w, "%s %s from %s", host, r.URL.Path, src)
}

func (s *gwSite) setHold(f func(path, src string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold = f
}

func (s *gwSite) ban(src, host string, code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bans[[2]string{src, host}] = code
}

// source is the address the site saw the request for path come from ("" if none came).
func (s *gwSite) source(path string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byPath[path]
}

// hostTotal is how many requests for host the site saw.
func (s *gwSite) hostTotal(host string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byHost[host]
}

func (s *gwSite) httpURL(host, path string) string {
	return "http://" + host + ":" + s.httpPort + path
}

func (s *gwSite) httpsURL(host, path string) string {
	return "https://" + host + ":" + s.httpsPort + path
}

// pathSeq makes paths unique across the run, so the site's record of each is the
// request's own.
var pathSeq struct {
	sync.Mutex
	n int
}

func uniquePath(prefix string) string {
	pathSeq.Lock()
	defer pathSeq.Unlock()
	pathSeq.n++
	return "/" + prefix + "/" + strconv.Itoa(pathSeq.n)
}

// answer is what a client received for one URL.
type answer struct {
	URL     string              `json:"url"`
	Status  int                 `json:"status"`
	Body    string              `json:"body"`
	Headers map[string][]string `json:"headers"`
	// Connect holds the headers of the CONNECT answer, where the client shows them.
	Connect http.Header `json:"-"`
	// SOCKS: the answer came through a SOCKS5 tunnel, where the gateway adds no header.
	SOCKS bool `json:"-"`
}

func (a answer) header(name string) string {
	for k, v := range a.Headers {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// checkPage checks a page's answer: 200, the site's body, and (when the client shows
// them) X-Egress-IP naming the source the site saw.
func (g *gwEnv) checkPage(t *testing.T, who string, a answer) {
	t.Helper()
	u, err := url.Parse(a.URL)
	if err != nil {
		t.Fatalf("%s: %v", who, err)
	}
	src := g.site.source(u.Path)
	if a.Status != http.StatusOK || a.Body != fmt.Sprintf("%s %s from %s", u.Hostname(), u.Path, src) || src == "" {
		t.Errorf("%s: %s: %d %q, the site saw it from %q", who, a.URL, a.Status, a.Body, src)
	}
	viaHTTPProxy := u.Scheme == "http" && !a.SOCKS
	if ip := a.header("X-Egress-IP"); viaHTTPProxy && ip != src {
		t.Errorf("%s: %s: X-Egress-IP %q, the site saw %q", who, a.URL, ip, src)
	}
	if p := a.header("X-Egress-Proxy"); viaHTTPProxy && p != exitOf(src) {
		t.Errorf("%s: %s: X-Egress-Proxy %q, the site saw %s (%s)", who, a.URL, p, src, exitOf(src))
	}
	if a.Connect != nil && (a.Connect.Get("X-Egress-IP") != src || a.Connect.Get("X-Egress-Proxy") != exitOf(src)) {
		t.Errorf("%s: %s: CONNECT answer's X-Egress-Proxy %q, X-Egress-IP %q; the site saw %s (%s)", who, a.URL,
			a.Connect.Get("X-Egress-Proxy"), a.Connect.Get("X-Egress-IP"), src, exitOf(src))
	}
}

// exitOf names the Proxy whose forward proxy dials out from src (gw-<n> from 127.0.0.<n>).
func exitOf(src string) string {
	n := strings.TrimPrefix(src, "127.0.0.")
	if n == src {
		return "?"
	}
	if n == "5" {
		return gwForeignNS + "/gw-5"
	}
	return "default/gw-" + n
}

// Every client reaches both sites through the gateway, with a session, over plain HTTP
// and over HTTPS through CONNECT (curl also over SOCKS5), and gets the site's pages.
func gatewayClients(t *testing.T, g *gwEnv) {
	user := "clients+ns=default+session=c1"
	h := func(p string) string { return g.site.httpURL("www."+gwClientsHost, uniquePath(p)) }
	s := func(p string) string { return g.site.httpsURL(gwClientsHost, uniquePath(p)) }

	t.Run("curl", func(t *testing.T) {
		for _, a := range g.curl(t, []string{"-x", g.proxyURL(user, token).String()}, h("curl"), s("curl")) {
			g.checkPage(t, "curl", a)
		}
		for _, a := range g.curl(t, []string{"--socks5-hostname", g.gw.socks, "--proxy-user", user + ":" + token}, h("curl-socks"), s("curl-socks")) {
			a.SOCKS = true
			g.checkPage(t, "curl --socks5-hostname", a)
		}
	})
	t.Run("python-requests", func(t *testing.T) {
		for _, a := range g.pythonRequests(t, g.proxyURL(user, token).String(), h("requests"), s("requests")) {
			g.checkPage(t, "requests", a)
		}
	})
	t.Run("scrapy", func(t *testing.T) {
		for _, a := range g.scrapy(t, g.proxyURL(user, token).String(), h("scrapy"), s("scrapy")) {
			g.checkPage(t, "scrapy", a)
		}
	})
	t.Run("go", func(t *testing.T) {
		hc := g.goClient(user, token, false)
		for _, u := range []string{h("go"), s("go")} {
			g.checkPage(t, "go", g.goGet(t, hc, u))
		}
	})
	t.Run("chromium", func(t *testing.T) {
		for _, a := range g.chromium(t, user, token, h("chromium"), s("chromium")) {
			g.checkPage(t, "chromium", a)
		}
	})
}

// The identity headers of plain-HTTP answers and of CONNECT answers name the exit the
// site saw, for every exit: the site's recorded source is the exit's egress address,
// and the header names the Proxy whose forward proxy dials out from it, at the address
// and port in its spec.
func gatewayIdentityHeaders(t *testing.T, g *gwEnv) {
	hc := g.goClient("ident+ns=default", token, false)
	byExit := map[string]int{}
	for i := range 12 {
		u := g.site.httpURL("www."+gwClientsHost, uniquePath("ident"))
		if i%2 == 1 {
			u = g.site.httpsURL(gwClientsHost, uniquePath("ident"))
		}
		a := g.goGet(t, hc, u)
		g.checkPage(t, "go", a)
		name := a.header("X-Egress-Proxy")
		if strings.HasPrefix(u, "https:") {
			if a.Connect == nil {
				t.Fatalf("%s: Go's OnProxyConnectResponse saw no CONNECT answer", u)
			}
			name = a.Connect.Get("X-Egress-Proxy")
		}
		byExit[name]++
	}
	for name := range byExit {
		ns, n, _ := strings.Cut(name, "/")
		var px v1alpha1.Proxy
		if err := g.env.Client.Get(context.Background(), ctrlclient.ObjectKey{Namespace: ns, Name: n}, &px); err != nil {
			t.Errorf("X-Egress-Proxy %q names no Proxy: %v", name, err)
			continue
		}
		fp := g.fps[n]
		if fp == nil || px.Spec.Address != fp.Host || px.Spec.Port != fp.Port {
			t.Errorf("X-Egress-Proxy %q: spec %s:%d is not the forward proxy that dials out from %s", name, px.Spec.Address, px.Spec.Port, px.Status.EgressIP)
		}
	}
	if len(byExit) != 3 {
		t.Errorf("12 requests without a session went through %v, want the three exits of default", byExit)
	}
	// Over SOCKS5 the success reply's bound address is the exit's egress address.
	for range 3 {
		path := uniquePath("ident-socks")
		bound, resp, err := socksGet(g.gw.socks, "ident+ns=default", token, gwRotateHost, g.site.httpPort, path)
		g.record(resp)
		if src := g.site.source(path); err != nil || bound != src || !strings.HasSuffix(resp, fmt.Sprintf("%s %s from %s", gwRotateHost, path, src)) {
			t.Errorf("SOCKS5 %s: BND.ADDR %s, %v, the site saw %q; answer %q", path, bound, err, src, resp)
		}
		byExit["socks5 "+bound]++
	}
	t.Logf("12 requests (6 plain, 6 CONNECT) by exit, and 3 SOCKS5 tunnels by bound address: %v", byExit)
}

// Bad user names, an unknown pool, a namespace the token may not use, an oversized and
// a slow request header each get a refusal naming what is wrong, and change nothing: no
// request reaches the site, no feedback is recorded, no Proxy's cooldowns or
// unreachable status change.
func gatewayRefusals(t *testing.T, g *gwEnv) {
	before := g.proxyStates(t)
	reportsBefore := g.feedbackReports(t)
	u := g.site.httpURL(gwRefuseHost, "/refused")
	for _, c := range []struct {
		name, user, password string
		extra                []string
		status               int
		want                 string
	}{
		{"unknown option", "me+colour=red", token, nil, 407, `unknown option "colour"`},
		{"option without value", "me+pool", token, nil, 407, `pool`},
		{"bad session id", "me+session=a/b", token, nil, 407, `session`},
		{"strict and soft", "me+session=a+strict+soft", token, nil, 407, `strict`},
		{"unknown pool", "me+pool=nosuch", token, nil, 407, `unknown pool "nosuch"`},
		{"wrong password", "me", "not-a-token", nil, 407, "not a token the discovery API accepts"},
		{"foreign namespace", "me+ns=default", g.saToken, nil, 407, `may not use namespace "default"`},
		{"unknown pool of the ServiceAccount", "me+pool=nosuch", g.saToken, nil, 407, `unknown pool "nosuch"`},
		{"oversized header", "me", token, []string{"-H", "X-Big: " + strings.Repeat("x", 40<<10)}, 431, "the request header is larger than 32768 bytes"},
	} {
		args := append([]string{"-x", g.proxyURL(c.user, c.password).String()}, c.extra...)
		a := g.curl(t, args, u)[0]
		if a.Status != c.status || !strings.Contains(a.Body, c.want) {
			t.Errorf("%s (%s): %d %q; want %d naming %s", c.name, c.user, a.Status, a.Body, c.status, c.want)
		}
		if c.status == 407 && a.header("Proxy-Authenticate") == "" {
			t.Errorf("%s: 407 without Proxy-Authenticate", c.name)
		}
		t.Logf("%s: %d %s", c.name, a.Status, strings.TrimSpace(a.Body))
	}
	// Over SOCKS5 a refused user name fails the RFC 1929 authentication.
	out, err := exec.Command("curl", "-sS", "--max-time", "60", "--socks5-hostname", g.gw.socks, "--proxy-user", "me+colour=red:"+token, u).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "rejected by the SOCKS5 server") {
		t.Errorf("curl --socks5-hostname with a bad user name: %v %s; want the RFC 1929 authentication refused", err, out)
	}
	g.record(string(out))

	// The ServiceAccount's token may use its own namespace, and gets its exit alone.
	a := g.curl(t, []string{"-x", g.proxyURL("me", g.saToken).String()}, g.site.httpURL(gwRefuseHost, uniquePath("own-namespace")))[0]
	g.checkPage(t, "curl with gwa's token", a)
	if p := a.header("X-Egress-Proxy"); p != gwForeignNS+"/gw-5" {
		t.Errorf("gwa's token went through %q, want its namespace's exit gwa/gw-5", p)
	}

	// Slow headers: a request header that does not end, and a connection that sends nothing.
	var wg sync.WaitGroup
	for _, c := range []struct{ send, want string }{
		{"GET " + u + " HTTP/1.1\r\nHost: " + gwRefuseHost + "\r\nX-Slow: ", "408 Request Timeout"},
		{"", "408 Request Timeout"},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			resp, err := rawExchange(g.gw.listen, c.send, gwHeaderTimeout+time.Minute)
			took := time.Since(start)
			if err != nil || !strings.HasPrefix(resp, "HTTP/1.1 "+c.want) || !strings.Contains(resp, "within "+gwHeaderTimeout.String()) {
				t.Errorf("a slow request header (%q): %v %q; want %s naming the %s limit", c.send, err, resp, c.want, gwHeaderTimeout)
			}
			if took < gwHeaderTimeout {
				t.Errorf("refused after %s, before the header timeout %s", took, gwHeaderTimeout)
			}
			_, body, _ := strings.Cut(resp, "\r\n\r\n")
			t.Logf("slow header (sent %d bytes): refused after %s: %s", len(c.send), took.Round(time.Millisecond), strings.TrimSpace(body))
		}()
	}
	wg.Wait()

	if n := g.site.hostTotal(gwRefuseHost); n != 1 {
		t.Errorf("the site saw %d requests for %s, want only the one of gwa's token", n, gwRefuseHost)
	}
	if after := g.feedbackReports(t); after != reportsBefore {
		t.Errorf("the gateway took %v feedback reports during the refusals (%v before)", after-reportsBefore, reportsBefore)
	}
	if after := g.proxyStates(t); !slices.Equal(before, after) {
		t.Errorf("the refusals changed the Proxies' cooldowns or unreachable status:\nbefore %v\nafter  %v", before, after)
	}
}

// socksGet opens a SOCKS5 tunnel (RFC 1928, RFC 1929 user name and password) to
// host:port through the gateway's SOCKS5 listener, sends a GET of path over it, and
// returns the success reply's bound address and the whole answer.
func socksGet(socks, user, password, host, port, path string) (string, string, error) {
	c, err := net.Dial("tcp", socks)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	p, _ := strconv.Atoi(port)
	msgs := [][]byte{{5, 1, 2}, append(append(append([]byte{1, byte(len(user))}, user...), byte(len(password))), password...),
		append(append([]byte{5, 1, 0, 3, byte(len(host))}, host...), byte(p>>8), byte(p))}
	want := []int{2, 2, 10}
	var reply []byte
	for i, m := range msgs {
		if _, err := c.Write(m); err != nil {
			return "", "", err
		}
		reply = make([]byte, want[i])
		if _, err := io.ReadFull(c, reply); err != nil {
			return "", "", fmt.Errorf("SOCKS5 step %d: %w", i+1, err)
		}
		if ok := []byte{2, 0, 0}; reply[1] != ok[i] {
			return "", "", fmt.Errorf("SOCKS5 step %d answered %v", i+1, reply)
		}
	}
	if reply[3] != 1 {
		return "", "", fmt.Errorf("SOCKS5 reply %v: want an IPv4 bound address", reply)
	}
	bound := net.IP(reply[4:8]).String()
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n\r\n", path, host, port); err != nil {
		return bound, "", err
	}
	b, err := io.ReadAll(c)
	return bound, string(b), err
}

// rawExchange writes send to addr and reads until the gateway closes the connection.
func rawExchange(addr, send string, deadline time.Duration) (string, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(deadline))
	if send != "" {
		if _, err := io.WriteString(conn, send); err != nil {
			return "", err
		}
	}
	b, err := io.ReadAll(conn)
	return string(b), err
}

// proxyStates is each Proxy's cooldowns and unreachable status, as text.
func (g *gwEnv) proxyStates(t *testing.T) []string {
	t.Helper()
	var l v1alpha1.ProxyList
	if err := g.env.Client.List(context.Background(), &l); err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, p := range l.Items {
		b, _ := json.Marshal([]any{p.Status.Cooldowns, p.Status.Unreachable})
		s = append(s, p.Namespace+"/"+p.Name+" "+string(b))
	}
	slices.Sort(s)
	return s
}

// feedbackReports is the gateway's proxy_operator_feedback_reports_total, summed.
func (g *gwEnv) feedbackReports(t *testing.T) float64 {
	t.Helper()
	return g.metricSum(t, "proxy_operator_feedback_reports_total")
}

// metricSum sums the gateway's samples whose line starts with prefix (a metric's name,
// or its name and the start of its labels).
func (g *gwEnv) metricSum(t *testing.T, prefix string) float64 {
	t.Helper()
	res, err := http.Get("http://" + g.gw.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var sum float64
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, prefix) {
			f, _ := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
			sum += f
		}
	}
	return sum
}

// 100 requests of one session leave through one exit, and after the gateway is stopped
// and started again on the same port the session still leaves through it.
func gatewaySession(t *testing.T, g *gwEnv) {
	user := "sess+ns=default+session=s-100"
	hc := g.goClient(user, token, true)
	sources := func(n int, via string) map[string]int {
		got := map[string]int{}
		for range n {
			a := g.goGet(t, hc, g.site.httpURL(gwSessionHost, uniquePath(via)))
			g.checkPage(t, via, a)
			got[g.site.source(strings.TrimPrefix(a.URL, g.site.httpURL(gwSessionHost, "")))]++
		}
		return got
	}
	first := sources(100, "session")
	if len(first) != 1 {
		t.Fatalf("100 requests of one session left from %v, want one address", first)
	}
	// and over CONNECT, through curl
	for _, a := range g.curl(t, []string{"--cacert", g.site.caFile, "-x", g.proxyURL(user, token).String()},
		g.site.httpsURL(gwClientsHost, uniquePath("session-tls"))) {
		first[g.site.source(strings.TrimPrefix(a.URL, g.site.httpsURL(gwClientsHost, "")))]++
	}
	if len(first) != 1 {
		t.Fatalf("the session's CONNECT left from another address: %v", first)
	}
	start := time.Now()
	g.gw.stop(t)
	if log := g.gw.stderr.String(); !strings.Contains(log, "gateway draining") || !strings.Contains(log, "gateway drained") {
		t.Errorf("the stopped gateway's log lacks \"gateway draining\" or \"gateway drained\":\n%s", log)
	}
	g.gw.start(t)
	t.Logf("gateway stopped and ready again on %s in %s", g.gw.listen, time.Since(start).Round(time.Millisecond))
	hc.CloseIdleConnections()
	after := sources(20, "session-restarted")
	if len(after) != 1 || !sameKeys(first, after) {
		t.Errorf("after the restart the session left from %v, before from %v", after, first)
	}
	t.Logf("session s-100: %v before the restart, %v after", first, after)
}

func sameKeys(a, b map[string]int) bool {
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return len(a) == len(b)
}

// Requests without a session rotate over the three egress addresses, evenly: plain
// requests on one keep-alive connection, and tunnels each on a connection of its own.
func gatewayRotation(t *testing.T, g *gwEnv) {
	const n = 90
	for _, c := range []struct {
		name string
		tls  bool
	}{{"plain HTTP", false}, {"CONNECT", true}} {
		hc := g.goClient("rot+ns=default", token, !c.tls)
		got := map[string]int{}
		for range n {
			p := uniquePath("rotate")
			u := g.site.httpURL(gwRotateHost, p)
			if c.tls {
				u = g.site.httpsURL(gwClientsHost, p)
			}
			a := g.goGet(t, hc, u)
			g.checkPage(t, "go", a)
			got[g.site.source(p)]++
		}
		t.Logf("%d %s requests without a session, by source address: %v", n, c.name, got)
		if len(got) != 3 {
			t.Errorf("%s: %v, want the three exits' addresses", c.name, got)
		}
		for src, k := range got {
			if k < n/3-3 || k > n/3+3 {
				t.Errorf("%s: %s carried %d of %d, want about %d", c.name, src, k, n, n/3)
			}
		}
	}
}

// A site's 403 to one exit, and another site's 429 with Retry-After to another exit,
// seen over plain HTTP, stop that exit for that site within seconds, and only for that
// site: each lands in the exit's status.cooldowns as banned (throttled for the 429).
func gatewayBan(t *testing.T, g *gwEnv) {
	hc := g.goClient("ban+ns=default", token, false)
	cases := []struct {
		host, site, src, outcome string
		code                     int
	}{
		{gwBanHost, "example.net", "127.0.0.3", "banned", http.StatusForbidden},
		{gwThrottleHost, "example.se", "127.0.0.4", "throttled", http.StatusTooManyRequests},
	}
	for _, c := range cases {
		g.site.ban(c.src, c.host, c.code)
		var first, last time.Time
		bans, clean := 0, 0
		deadline := time.Now().Add(2 * time.Minute)
		for clean < 30 {
			if time.Now().After(deadline) {
				t.Fatalf("waited 2 min for 30 requests in a row to %s to avoid %s; %d %ds seen", c.host, c.src, bans, c.code)
			}
			p := uniquePath("ban")
			a := g.goGet(t, hc, g.site.httpURL(c.host, p))
			src := g.site.source(p)
			if src != c.src {
				clean++
				if a.Status != http.StatusOK {
					t.Errorf("%s through %s: %d %q", p, src, a.Status, a.Body)
				}
				continue
			}
			clean = 0
			bans++
			last = time.Now()
			if first.IsZero() {
				first = last
			}
			if a.Status != c.code || a.header("X-Egress-IP") != c.src {
				t.Errorf("the banned exit's answer: %d %v; want the site's %d with X-Egress-IP %s", a.Status, a.Headers, c.code, c.src)
			}
		}
		took := last.Sub(first)
		t.Logf("%s: %d requests reached the site through %s, the last %s after the first %d; then 30 in a row avoided it",
			c.host, bans, c.src, took.Round(time.Millisecond), c.code)
		if took > 10*time.Second {
			t.Errorf("%s: the banned exit kept being chosen for %s after the first %d", c.host, took, c.code)
		}
	}
	// Not for another site: the friendly site still rotates over all three.
	got := map[string]int{}
	for range 30 {
		p := uniquePath("friendly")
		g.checkPage(t, "go", g.goGet(t, hc, g.site.httpURL(gwFriendlyHost, p)))
		got[g.site.source(p)]++
	}
	t.Logf("%s afterwards, by source: %v", gwFriendlyHost, got)
	for _, c := range cases {
		if got[c.src] < 5 {
			t.Errorf("the friendly site got %v; want %s, banned by %s alone, among them", got, c.src, c.host)
		}
		name := strings.TrimPrefix(exitOf(c.src), "default/")
		testutil.WaitFor(t, time.Minute, fmt.Sprintf("%s's status.cooldowns to hold %s for %s", name, c.outcome, c.site), func() (bool, error) {
			var px v1alpha1.Proxy
			if err := g.env.Client.Get(context.Background(), ctrlclient.ObjectKey{Namespace: "default", Name: name}, &px); err != nil {
				return false, err
			}
			if slices.ContainsFunc(px.Status.Cooldowns, func(cd v1alpha1.ProxyCooldown) bool { return cd.Site == "example.io" }) {
				t.Fatalf("%s cools for the friendly site: %+v", name, px.Status.Cooldowns)
			}
			i := slices.IndexFunc(px.Status.Cooldowns, func(cd v1alpha1.ProxyCooldown) bool { return cd.Site == c.site })
			return i >= 0 && string(px.Status.Cooldowns[i].LastOutcome) == c.outcome, fmt.Errorf("cooldowns %+v", px.Status.Cooldowns)
		})
	}
}

// An exit killed under a crawl costs it no failed request. 8 workers, with and without
// a session, fetch 100 pages over plain HTTP and HTTPS; a plain request of the session
// is then held at the site, having come through the session's exit, while that exit is
// killed (ForwardProxy.Close: its connections cut, its port refusing); then 100 more
// pages. The held request is sent again (no byte of its answer had reached the
// crawler), the session moves, and the rotation skips the dead exit. A
// tunnel already open through an exit when it dies is cut with it: the gateway has
// passed its bytes on and cannot replay them, so the kill falls between tunnels.
func gatewayKilledExit(t *testing.T, g *gwEnv) {
	const pages = 100
	sessionClient, rotatingClient := g.goClient("kill+ns=default+session=k1", token, false), g.goClient("kill+ns=default", token, false)
	// The session's exit, from one request.
	p := uniquePath("kill-probe")
	g.checkPage(t, "go", g.goGet(t, sessionClient, g.site.httpURL(gwKillHost, p)))
	victim := g.site.source(p)
	fp := g.fps[strings.TrimPrefix(exitOf(victim), "default/")]
	retriedBefore := g.retried(t)

	failed := 0
	crawlPages := func(phase string) {
		var done sync.WaitGroup
		var mu sync.Mutex
		work := make(chan int)
		for w := range 8 {
			done.Add(1)
			go func() {
				defer done.Done()
				hc := sessionClient
				if w%2 == 1 {
					hc = rotatingClient
				}
				for i := range work {
					path := uniquePath("kill")
					u := g.site.httpURL(gwKillHost, path)
					if i%2 == 1 {
						u = g.site.httpsURL(gwClientsHost, path)
					}
					a, err := goGetErr(hc, u)
					if err != nil || a.Status != http.StatusOK {
						mu.Lock()
						failed++
						mu.Unlock()
						t.Errorf("%s, %s: %v %d %q", phase, u, err, a.Status, a.Body)
					}
				}
			}()
		}
		for i := range pages {
			work <- i
		}
		close(work)
		done.Wait()
	}
	crawlPages("before the kill")

	arrived, killed := make(chan struct{}), make(chan struct{})
	var arrivedOnce sync.Once
	g.site.setHold(func(path, src string) {
		if strings.HasPrefix(path, "/kill-held/") && src == victim {
			arrivedOnce.Do(func() { close(arrived) })
			select {
			case <-killed:
			case <-time.After(time.Minute):
			}
		}
	})
	defer g.site.setHold(nil)
	heldPath := uniquePath("kill-held")
	heldDone := make(chan answer, 1)
	go func() {
		a, err := goGetErr(sessionClient, g.site.httpURL(gwKillHost, heldPath))
		if err != nil {
			a.Body = err.Error()
		}
		heldDone <- a
	}()
	select {
	case <-arrived:
	case <-time.After(time.Minute):
		t.Fatalf("waited a minute for the held request %s to reach the site through %s", heldPath, victim)
	}
	// The kill: ForwardProxy.Close cuts the exit's connections, then closes its port and
	// waits for its handlers. The site answers the held request once the port refuses.
	killedAt := time.Now()
	closed := make(chan struct{})
	go func() { fp.Close(); close(closed) }()
	addr := net.JoinHostPort(fp.Host, strconv.Itoa(int(fp.Port)))
	testutil.WaitFor(t, time.Minute, "the killed exit's port "+addr+" to refuse connections", func() (bool, error) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil, errors.New("it still accepts")
	}, testutil.Every(5*time.Millisecond))
	close(killed)
	var held answer
	select {
	case held = <-heldDone:
	case <-time.After(2 * time.Minute):
		t.Fatalf("waited 2 min for the held request %s to be answered after its exit died", heldPath)
	}
	heldTook := time.Since(killedAt)
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatalf("waited a minute for the killed exit's handlers to end")
	}
	// Its connection cut before any byte of the answer came, the gateway sends the
	// request again: through another exit, or through the same one on a new connection
	// if that got in before the port closed (a race the test leaves open; the crawler
	// gets its page either way).
	if src := g.site.source(heldPath); held.Status != http.StatusOK || held.header("X-Egress-IP") != src {
		t.Errorf("the request held while its exit %s died: %d %q, X-Egress-IP %q, the site saw it last from %s; want 200 naming that source",
			victim, held.Status, held.Body, held.header("X-Egress-IP"), src)
	}

	crawlPages("after the kill")
	after := 0
	g.site.mu.Lock()
	for path, src := range g.site.byPath {
		if strings.HasPrefix(path, "/kill/") && src == victim {
			after++
		}
	}
	g.site.mu.Unlock()
	retried := g.retried(t) - retriedBefore
	t.Logf("%d pages and the held one, %d failed; %s (%s) killed with a request held at the site, answered through %s %s later; %d of the pages went through %s before it died; %v requests and tunnels carried by a later exit (outcome retried)",
		2*pages, failed, exitOf(victim), victim, held.header("X-Egress-Proxy"), heldTook.Round(time.Millisecond), after, victim, retried)
	if retried < 1 {
		t.Errorf("no request or tunnel was retried after the kill")
	}
	// The session moved, and stays on its new exit.
	p = uniquePath("kill-after")
	g.checkPage(t, "go", g.goGet(t, sessionClient, g.site.httpURL(gwKillHost, p)))
	if src := g.site.source(p); src == victim {
		t.Errorf("the session still leaves from the killed exit's %s", src)
	}
	// The same session made strict does not move: 502 naming its exit.
	a := g.curl(t, []string{"-x", g.proxyURL("kill+ns=default+session=k1+strict", token).String()}, g.site.httpURL(gwKillHost, uniquePath("kill-strict")))[0]
	if a.Status != http.StatusBadGateway || a.header("X-Egress-Proxy") != exitOf(victim) || !strings.Contains(a.Body, exitOf(victim)) {
		t.Errorf("the strict session of the killed exit: %d %v %q; want 502 naming %s in X-Egress-Proxy and the body", a.Status, a.Headers, a.Body, exitOf(victim))
	}
	t.Logf("the strict session k1: %d, X-Egress-Proxy %s: %s", a.Status, a.header("X-Egress-Proxy"), strings.TrimSpace(a.Body))
}

// retried is the gateway's requests and tunnels in default carried by a later exit.
func (g *gwEnv) retried(t *testing.T) float64 {
	t.Helper()
	n := 0.0
	for _, m := range []string{"proxy_operator_gateway_requests_total", "proxy_operator_gateway_tunnels_total"} {
		n += g.metricSum(t, m+`{namespace="default",outcome="retried"`)
	}
	return n
}

// No answer, header or curl -v output any client received holds an exit's password,
// in clear or in a Basic credential.
func gatewayNoPasswordSeen(t *testing.T, g *gwEnv) {
	basic := base64.StdEncoding.EncodeToString([]byte(proxyUser + ":" + proxyPass))
	g.seenMu.Lock()
	defer g.seenMu.Unlock()
	if len(g.seen) < 100 {
		t.Fatalf("only %d answers were collected", len(g.seen))
	}
	for _, s := range g.seen {
		if strings.Contains(s, proxyPass) || strings.Contains(s, basic) {
			t.Errorf("a client saw an exit's password: %q", s)
		}
	}
	t.Logf("searched %d answers and outputs for the exits' password", len(g.seen))
}

// curl fetches each URL with args (its proxy options), -v, the site's CA (--cacert),
// and returns the answers; headers are those of the last response, Connect those of a
// CONNECT answer.
func (g *gwEnv) curl(t *testing.T, args []string, urls ...string) []answer {
	t.Helper()
	var out []answer
	dir := t.TempDir()
	for i, u := range urls {
		hdr, body := filepath.Join(dir, strconv.Itoa(i)+".h"), filepath.Join(dir, strconv.Itoa(i)+".b")
		cmd := exec.Command("curl", append([]string{"-sS", "-v", "--max-time", "60", "--cacert", g.site.caFile, "-D", hdr, "-o", body}, append(args, u)...)...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
		verbose, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("curl %v %s: %v\n%s", args[:min(len(args), 2)], u, err, verbose)
			continue
		}
		h, _ := os.ReadFile(hdr)
		b, _ := os.ReadFile(body)
		g.record(string(verbose), string(h), string(b))
		a := answer{URL: u, Body: string(b), Headers: map[string][]string{}}
		// -D holds every response: a CONNECT answer first, then the site's.
		for _, block := range strings.Split(strings.TrimSpace(strings.ReplaceAll(string(h), "\r\n", "\n")), "\n\n") {
			lines := strings.Split(block, "\n")
			f := strings.Fields(lines[0])
			if len(f) < 2 {
				continue
			}
			hs := http.Header{}
			for _, l := range lines[1:] {
				if k, v, ok := strings.Cut(l, ":"); ok {
					hs.Add(strings.TrimSpace(k), strings.TrimSpace(v))
				}
			}
			if strings.Contains(lines[0], "onnection established") || (strings.HasPrefix(u, "https") && a.Connect == nil && hs.Get("X-Egress-Proxy") != "") {
				a.Connect = hs
				continue
			}
			a.Status, _ = strconv.Atoi(f[1])
			a.Headers = hs
		}
		out = append(out, a)
	}
	return out
}

// pythonRequests fetches each URL with Debian's python3 and requests, proxies={...}.
func (g *gwEnv) pythonRequests(t *testing.T, proxy string, urls ...string) []answer {
	t.Helper()
	const script = `
import json, sys, requests
cfg = json.load(open(sys.argv[1]))
out = []
for u in cfg["urls"]:
    r = requests.get(u, proxies={"http": cfg["proxy"], "https": cfg["proxy"]}, verify=cfg["ca"], timeout=60)
    out.append({"url": u, "status": r.status_code, "body": r.text, "headers": {k: [v] for k, v in r.headers.items()}})
json.dump(out, open(cfg["out"], "w"))
`
	return g.runPython(t, []string{"-c", script}, map[string]any{"proxy": proxy, "urls": urls, "ca": g.site.caFile})
}

// scrapy crawls each URL with Debian's Scrapy, a spider of a few lines setting nothing
// but meta['proxy'].
func (g *gwEnv) scrapy(t *testing.T, proxy string, urls ...string) []answer {
	t.Helper()
	const spider = `
import json, scrapy

class Gateway(scrapy.Spider):
    name = "gateway"
    custom_settings = {"ROBOTSTXT_OBEY": False, "RETRY_ENABLED": False, "HTTPERROR_ALLOW_ALL": True,
                       "TELNETCONSOLE_ENABLED": False, "LOG_LEVEL": "INFO", "DOWNLOAD_TIMEOUT": 60}

    def start_requests(self):
        self.cfg = json.load(open(self.config))
        for u in self.cfg["urls"]:
            yield scrapy.Request(u, meta={"proxy": self.cfg["proxy"]}, dont_filter=True, cb_kwargs={"url": u})

    def parse(self, response, url):
        yield {"url": url, "status": response.status, "body": response.text,
               "headers": {k.decode(): [v.decode() for v in vs] for k, vs in response.headers.items()}}
`
	dir := t.TempDir()
	file := filepath.Join(dir, "gateway_spider.py")
	if err := os.WriteFile(file, []byte(spider), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.json")
	b, _ := json.Marshal(map[string]any{"proxy": proxy, "urls": urls})
	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.json")
	cmd := exec.Command(python(), "-m", "scrapy", "runspider", file, "-a", "config="+cfg, "-O", out)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "PYTHONDONTWRITEBYTECODE=1"}
	logs, err := cmd.CombinedOutput()
	g.record(string(logs))
	if err != nil {
		t.Fatalf("scrapy runspider: %v\n%s", err, logs)
	}
	var got []answer
	if b, err = os.ReadFile(out); err == nil {
		err = json.Unmarshal(b, &got)
	}
	if err != nil || len(got) != len(urls) {
		t.Fatalf("scrapy wrote %d answers (%v), want %d\n%s", len(got), err, len(urls), logs)
	}
	g.record(string(b))
	return got
}

// runPython runs Debian's python3 with args and a JSON config file (its "out" added),
// and reads the answers it wrote.
func (g *gwEnv) runPython(t *testing.T, args []string, cfg map[string]any) []answer {
	t.Helper()
	dir := t.TempDir()
	cfg["out"] = filepath.Join(dir, "out.json")
	b, _ := json.Marshal(cfg)
	cfgFile := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfgFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python(), append(args, cfgFile)...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "PYTHONDONTWRITEBYTECODE=1"}
	logs, err := cmd.CombinedOutput()
	g.record(string(logs))
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", python(), args[:1], err, logs)
	}
	var got []answer
	if b, err = os.ReadFile(cfg["out"].(string)); err == nil {
		err = json.Unmarshal(b, &got)
	}
	if err != nil {
		t.Fatalf("python wrote no answers: %v\n%s", err, logs)
	}
	g.record(string(b))
	return got
}

// goClient is net/http with http.ProxyURL and the site's CA; the CONNECT answers' headers
// are kept (OnProxyConnectResponse) for goGet. Without keepAlive each request opens a
// connection of its own.
func (g *gwEnv) goClient(user, password string, keepAlive bool) *http.Client {
	tr := &http.Transport{Proxy: http.ProxyURL(g.proxyURL(user, password)), TLSClientConfig: &tls.Config{RootCAs: g.site.pool},
		DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: 8,
		OnProxyConnectResponse: func(_ context.Context, _ *url.URL, req *http.Request, res *http.Response) error {
			connects.Store(req.Host, res.Header.Clone()) // the CONNECT's Host is the target's host:port
			g.record(fmt.Sprint(res.Header))
			return nil
		}}
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// connects holds the last CONNECT answer's headers by target; goGet takes it for an
// HTTPS URL when the connection is new (DisableKeepAlives in the HTTPS clients of the
// identity and rotation themes).
var connects sync.Map

func (g *gwEnv) goGet(t *testing.T, hc *http.Client, u string) answer {
	t.Helper()
	a, err := goGetErr(hc, u)
	if err != nil {
		t.Fatalf("go: %s: %v", u, err)
	}
	g.record(fmt.Sprint(a.Headers), a.Body)
	return a
}

func goGetErr(hc *http.Client, u string) (answer, error) {
	var connect http.Header
	ctx := context.Background()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return answer{}, err
	}
	res, err := hc.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if req.URL.Scheme == "https" {
		if v, ok := connects.Load(req.URL.Host); ok {
			connect = v.(http.Header)
		}
	}
	return answer{URL: u, Status: res.StatusCode, Body: string(b), Headers: res.Header, Connect: connect}, err
}

// chromiumPath is Debian's chromium, which hack/crawl-deps.sh installs.
const chromiumPath = "/usr/bin/chromium"

// chromium loads each URL in headless chromium whose --proxy-server is the gateway, and
// answers the gateway's 407 through the Fetch domain's authRequired with the user name
// and password, as Playwright does (chromium takes no credentials in --proxy-server). The
// site's certificate is not in chromium's store: it runs with --ignore-certificate-errors.
func (g *gwEnv) chromium(t *testing.T, user, password string, urls ...string) []answer {
	t.Helper()
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]), chromedp.ExecPath(chromiumPath), chromedp.NoSandbox,
		chromedp.UserDataDir(t.TempDir()), chromedp.ProxyServer("http://"+g.gw.listen), chromedp.Flag("ignore-certificate-errors", true))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	cctx, cancelTab := chromedp.NewContext(actx)
	defer cancelTab()

	var mu sync.Mutex
	auths := 0
	// Fetch.enable with handleAuthRequests pauses every request: each is continued, and
	// each proxy challenge is answered with the credentials.
	setup := chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		paused := cdp.Events(cctx, tg, fetch.RequestPaused)
		challenged := cdp.Events(cctx, tg, fetch.AuthRequired)
		go func() {
			for e, err := range paused {
				if err != nil {
					return
				}
				_, _ = cdp.Call(cctx, tg, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: e.RequestID})
			}
		}()
		go func() {
			for e, err := range challenged {
				if err != nil {
					return
				}
				resp := &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseCancelAuth}
				if e.AuthChallenge != nil && e.AuthChallenge.Source == fetch.AuthChallengeSourceProxy {
					mu.Lock()
					auths++
					mu.Unlock()
					resp = &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseProvideCredentials, Username: user, Password: password}
				}
				_, _ = cdp.Call(cctx, tg, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{RequestID: e.RequestID, AuthChallengeResponse: resp})
			}
		}()
		handle := true
		_, err := cdp.Call(ctx, tg, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &handle})
		return err
	})
	if err := chromedp.Do(cctx, setup); err != nil {
		t.Fatalf("chromium: starting with Fetch enabled: %v", err)
	}
	var out []answer
	for _, u := range urls {
		res, err := chromedp.Run(cctx, chromedp.NavigateResponse(u))
		if err != nil {
			t.Fatalf("chromium: %s: %v", u, err)
		}
		body, err := chromedp.Run(cctx, chromedp.Evaluate[string](`document.body.innerText`))
		if err != nil {
			t.Fatalf("chromium: %s: reading the page: %v", u, err)
		}
		a := answer{URL: u, Body: strings.TrimSpace(body), Headers: map[string][]string{}}
		if res != nil {
			a.Status = int(res.Status)
			for k, v := range res.Headers {
				a.Headers[k] = []string{fmt.Sprint(v)}
			}
		}
		g.record(fmt.Sprint(a.Headers), a.Body)
		out = append(out, a)
	}
	mu.Lock()
	defer mu.Unlock()
	if auths == 0 {
		t.Errorf("chromium never met the gateway's 407")
	}
	t.Logf("chromium: %d pages, %d proxy authentication challenges answered", len(out), auths)
	return out
}
