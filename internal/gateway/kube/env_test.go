package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gateway"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

var shared = testenv.NewShared()

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(shared.Run(m))
}

// exitHeader names, on every answer an exit relays, the exit that carried it: what the
// site really saw.
const exitHeader = "X-Test-Exit"

// startExit is a forward proxy on loopback, named name, that sends every absolute-URI
// request to site whatever its host (the test's only site), as an exit would.
func startExit(t *testing.T, name, site string) *httptest.Server {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", site)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL, r.Out.Host = r.In.URL, r.In.Host
			r.Out.Header.Set(exitHeader, name)
		},
		Transport: tr,
		ModifyResponse: func(res *http.Response) error {
			res.Header.Set(exitHeader, name)
			return nil
		},
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv
}

// createExit creates an External Proxy for the exit at addr, Ready and healthy as the
// health engine would leave it, with egress address egress.
func createExit(t *testing.T, ctx context.Context, env *testenv.Env, ns, name, addr, egress string) {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	var p int32
	fmt.Sscan(port, &p)
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: host, Port: p}}
	if err := env.Client.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	px.Status = v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, IP: host, Healthy: true, EgressIP: egress}
	if err := env.Client.Status().Update(ctx, px); err != nil {
		t.Fatal(err)
	}
}

// gwEnv is a gateway wired to discovery over a real API server: three exits in nsA
// (exit0..exit2, each a forward proxy on loopback with an egress address of its own), one
// in nsB, and a ServiceAccount token that may use nsA alone.
type gwEnv struct {
	t        *testing.T
	ctx      context.Context
	env      *testenv.Env
	nsA, nsB string
	token    string
	a        *Adapter
	addr     string
	exits    map[string]*httptest.Server
}

// startGateway sets up a gwEnv whose site answers what site says (nil: 200 "hello
// <host>").
func startGateway(t *testing.T, site http.HandlerFunc) *gwEnv {
	t.Helper()
	e := &gwEnv{t: t, env: shared.Env(t), ctx: testenv.Context(t), exits: map[string]*httptest.Server{}}
	ctx, env := e.ctx, e.env
	e.nsA, e.nsB = env.Namespace(t, ctx, "gw"), env.Namespace(t, ctx, "gw")
	if site == nil {
		site = func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s", r.Host) }
	}
	srv := httptest.NewServer(site)
	t.Cleanup(srv.Close)
	siteAddr := strings.TrimPrefix(srv.URL, "http://")
	for i := range 3 {
		name := fmt.Sprintf("exit%d", i)
		e.exits[name] = startExit(t, name, siteAddr)
		createExit(t, ctx, env, e.nsA, name, strings.TrimPrefix(e.exits[name].URL, "http://"), fmt.Sprintf("198.51.100.%d", i+1))
	}
	createExit(t, ctx, env, e.nsB, "foreign", strings.TrimPrefix(startExit(t, "foreign", siteAddr).URL, "http://"), "198.51.100.9")
	e.token = testenv.CrawlerToken(t, ctx, env, e.nsA)

	mgr := env.NewManager(t, e.nsA, func(o *ctrl.Options) {
		o.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{e.nsA: {}, e.nsB: {}}, ByObject: CacheByObject()}
	})
	a, err := Setup(ctx, mgr, Options{KubernetesAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	e.a = a
	testenv.StartManager(t, ctx, mgr)
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	g, err := gateway.New(gateway.Config{Chooser: a, Authenticator: a, Reporter: a, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Shutdown(sctx)
	})
	testutil.WaitFor(t, testutil.WaitLong, "the gateway to carry a request", func() (bool, error) {
		code, _, body := e.get("me", "http://www.example.com/")
		return code == http.StatusOK, fmt.Errorf("%d %s", code, body)
	})
	return e
}

// get sends GET target through the gateway with user name user and the token; it
// returns the status, the exit the site saw and the body.
func (e *gwEnv) get(user, target string) (int, string, string) {
	t := e.t
	t.Helper()
	pu := &url.URL{Scheme: "http", Host: e.addr, User: url.UserPassword(user, e.token)}
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}, Timeout: 30 * time.Second}
	defer c.CloseIdleConnections()
	res, err := c.Get(target)
	if err != nil {
		t.Fatalf("GET %s as %s: %v", target, user, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if exit := res.Header.Get(exitHeader); exit != "" && res.Header.Get("X-Egress-Proxy") != e.nsA+"/"+exit {
		t.Errorf("X-Egress-Proxy %q, but the site saw exit %q", res.Header.Get("X-Egress-Proxy"), exit)
	}
	return res.StatusCode, res.Header.Get(exitHeader), string(b)
}

// pick is discovery's own answer for the query, with the same token.
func (e *gwEnv) pick(q string) string {
	t := e.t
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/v1/proxies/pick?"+q, nil)
	req.Header.Set("Authorization", "Bearer "+e.token)
	rec := httptest.NewRecorder()
	e.a.Server.Handler().ServeHTTP(rec, req)
	var p struct{ Namespace, Name string }
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || rec.Code != http.StatusOK {
		t.Fatalf("pick?%s: %d %s", q, rec.Code, rec.Body)
	}
	return p.Name
}

// A real request through the gateway, wired to discovery over a real API server: a
// session leaves through the exit discovery's pick answers for its key; an exit cooling
// for a site is left out for that site alone; a namespace the token may not use and an
// unknown pool are refused, naming them.
func TestGatewayOverDiscovery(t *testing.T) {
	e := startGateway(t, nil)
	ctx, env, nsA, nsB, get, pick := e.ctx, e.env, e.nsA, e.nsB, e.get, e.pick

	home := pick("key=s1")
	for i := range 10 {
		code, exit, body := get("me+session=s1", "http://www.example.com/")
		if code != http.StatusOK || exit != home {
			t.Fatalf("request %d of session s1: %d through %q (%s), want 200 through %s, discovery's pick for key s1", i, code, exit, body, home)
		}
	}

	// The session's exit cools for example.com: the session moves for that site alone,
	// where pick?domain= moves it.
	px := &v1alpha1.Proxy{}
	if err := env.Client.Get(ctx, keyOf(nsA, home), px); err != nil {
		t.Fatal(err)
	}
	px.Status.Cooldowns = []v1alpha1.ProxyCooldown{{Site: "example.com", Until: metav1.NewTime(time.Now().Add(time.Hour)), Bans: 1, LastOutcome: v1alpha1.CooldownBanned}}
	if err := env.Client.Status().Update(ctx, px); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, testutil.WaitLong, "session s1 to leave "+home+" for example.com", func() (bool, error) {
		_, exit, _ := get("me+session=s1", "http://shop.example.com/")
		return exit != home, fmt.Errorf("still through %s", exit)
	})
	moved := pick("key=s1&domain=example.com")
	if _, exit, _ := get("me+session=s1", "http://shop.example.com/"); exit != moved || exit == home {
		t.Errorf("session s1 for example.com through %s, want %s as pick?domain=example.com", exit, moved)
	}
	if _, exit, _ := get("me+session=s1", "http://www.example.org/"); exit != home {
		t.Errorf("session s1 for example.org through %s, want its own exit %s (cooling for example.com only)", exit, home)
	}
	for n := range 6 {
		if _, exit, _ := get("me", fmt.Sprintf("http://www.example.com/%d", n)); exit == home {
			t.Errorf("request %d without a session for example.com through %s, which cools for it", n, exit)
		}
	}

	code, _, body := get("me+ns="+nsB, "http://www.example.com/")
	if code != http.StatusProxyAuthRequired || !strings.Contains(body, nsB) {
		t.Errorf("namespace %s, foreign to the token: %d %s, want 407 naming it", nsB, code, body)
	}
	code, _, body = get("me+pool=nosuch", "http://www.example.com/")
	if code != http.StatusProxyAuthRequired || !strings.Contains(body, "nosuch") {
		t.Errorf("pool nosuch: %d %s, want 407 naming it", code, body)
	}
}

func keyOf(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }

// keyFor is a session key that discovery's pick maps to exit.
func (e *gwEnv) keyFor(exit string) string {
	e.t.Helper()
	for k := range 200 {
		if key := fmt.Sprintf("k%d", k); e.pick("key="+key) == exit {
			return key
		}
	}
	e.t.Fatalf("no key of 200 maps to %s", exit)
	return ""
}

// What the gateway learns reaches the Proxies' status through discovery's recorder: a
// site's plain-HTTP 403 is a ban of the exit for that site (status.cooldowns), and the
// session then leaves through another exit for that site; an exit that stops answering
// is reported unreachable (status.unreachable) while the request is retried through
// another exit, so the crawler sees no failure.
func TestGatewayReportsToTheRecorder(t *testing.T) {
	e := startGateway(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Host == "shop.example.net" && r.Header.Get(exitHeader) == "exit1" {
			http.Error(w, "go away", http.StatusForbidden)
			return
		}
		fmt.Fprintf(w, "hello %s", r.Host)
	})
	status := func(name string) *v1alpha1.Proxy {
		px := &v1alpha1.Proxy{}
		if err := e.env.Client.Get(e.ctx, keyOf(e.nsA, name), px); err != nil {
			t.Fatal(err)
		}
		return px
	}

	banned := e.keyFor("exit1")
	if code, exit, _ := e.get("me+session="+banned, "http://shop.example.net/"); code != http.StatusForbidden || exit != "exit1" {
		t.Fatalf("session %s: %d through %s, want the site's 403 through exit1", banned, code, exit)
	}
	testutil.WaitFor(t, testutil.WaitLong, "exit1's status.cooldowns to hold example.net", func() (bool, error) {
		cds := status("exit1").Status.Cooldowns
		return len(cds) == 1 && cds[0].Site == "example.net", fmt.Errorf("cooldowns %+v", cds)
	})
	testutil.WaitFor(t, testutil.WaitLong, "session "+banned+" to leave exit1 for example.net", func() (bool, error) {
		code, exit, _ := e.get("me+session="+banned, "http://shop.example.net/")
		return code == http.StatusOK && exit != "exit1", fmt.Errorf("%d through %s", code, exit)
	})

	dead := e.keyFor("exit2")
	e.exits["exit2"].Close()
	code, exit, body := e.get("me+session="+dead, "http://www.example.com/")
	if code != http.StatusOK || exit == "exit2" || exit == "" {
		t.Fatalf("session %s with exit2 closed: %d through %q (%s), want 200 through another exit", dead, code, exit, body)
	}
	testutil.WaitFor(t, testutil.WaitLong, "exit2's status.unreachable to count the gateway's report", func() (bool, error) {
		u := status("exit2").Status.Unreachable
		return u != nil && u.Reports >= 1, fmt.Errorf("status.unreachable %+v", u)
	})
	testutil.WaitFor(t, testutil.WaitLong, "discovery's pick to leave exit2 out", func() (bool, error) {
		got := e.pick("key=" + dead)
		return got != "exit2", fmt.Errorf("pick %s", got)
	})
}
