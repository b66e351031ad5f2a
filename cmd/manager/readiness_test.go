package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// gatedAPI is a reverse proxy in front of the envtest API server that holds every request
// for Proxy objects (the informer's list and watch among them) until release: a cluster
// whose answers are slow to come, so the manager's caches cannot sync meanwhile.
type gatedAPI struct {
	*httptest.Server
	held        atomic.Int32
	gate        chan struct{}
	releaseOnce sync.Once
}

func newGatedAPI(t *testing.T, env *testenv.Env) *gatedAPI {
	t.Helper()
	host := env.Config.Host
	if !strings.Contains(host, "://") {
		host = "https://" + host
	}
	target, err := url.Parse(host)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := rest.TransportFor(env.Config) // the administrator's credentials
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = tr
	rp.FlushInterval = -1 // watches stream
	g := &gatedAPI{gate: make(chan struct{})}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/proxies") {
			g.held.Add(1)
			select {
			case <-g.gate:
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(g.Close)
	t.Cleanup(g.release) // before Close, which waits for the held handlers
	return g
}

func (g *gatedAPI) release() { g.releaseOnce.Do(func() { close(g.gate) }) }

// kubeconfig reaches the API server through the proxy, which adds the credentials.
func (g *gatedAPI) kubeconfig() []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters: [{name: gated, cluster: {server: %q}}]
users: [{name: anonymous, user: {}}]
contexts: [{name: gated, context: {cluster: gated, user: anonymous}}]
current-context: gated
`, g.URL)
}

// get answers the status code and body of a GET, or an error.
func get(rawURL string) (int, string, error) {
	resp, err := http.Get(rawURL)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// /readyz fails, naming the checks not met, while the caches cannot sync and the discovery
// API therefore does not listen yet (it starts after the caches), and passes once both are
// done; /healthz passes throughout.
func TestReadyzWaitsForCachesAndDiscovery(t *testing.T) {
	t.Parallel()
	env := testenv.StartT(t)
	api := newGatedAPI(t, env)
	providers := writeFile(t, "providers.yaml", fmt.Sprintf(goodConfig, t.TempDir()))
	probe, disc := freeAddr(t), freeAddr(t)
	mgr := startManagerWith(t, api.kubeconfig(), "--providers-config", providers,
		"--health-probe-bind-address", probe, "--metrics-bind-address", "0", "--discovery-bind-address", disc,
		"--discovery-kubernetes-auth=false")

	readyz := "http://" + probe + "/readyz"
	mgr.waitUntil("/readyz to answer and the Proxy list to be held", func() (bool, error) {
		if _, _, err := get(readyz); err != nil {
			return false, err
		}
		return api.held.Load() > 0, errors.New("no Proxy request held yet")
	})
	// The proxy holds the list, so nothing below can have changed until release.
	code, body, err := get(readyz)
	if err != nil || code != http.StatusInternalServerError {
		t.Fatalf("/readyz while the caches cannot sync: %d %v, want 500\n%s", code, err, body)
	}
	for _, want := range []string{"[-]caches failed", "[-]discovery failed", "[+]providers ok"} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz body lacks %q:\n%s", want, body)
		}
	}
	if code, _, err := get("http://" + probe + "/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("/healthz while not ready: %d %v, want 200", code, err)
	}
	if c, err := net.DialTimeout("tcp", disc, time.Second); err == nil {
		c.Close()
		t.Fatal("the discovery port listens before the caches synced")
	}
	released := time.Now()
	api.release()
	mgr.waitUntil("/readyz to answer 200", func() (bool, error) {
		code, body, err := get(readyz)
		if err != nil {
			return false, err
		}
		return code == http.StatusOK, fmt.Errorf("/readyz answered %d: %s", code, body)
	})
	code, body, err = get(readyz + "?verbose")
	for _, want := range []string{"[+]caches ok", "[+]discovery ok", "[+]providers ok"} {
		if err != nil || code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("verbose /readyz after release: %d %v, lacks %q:\n%s", code, err, want, body)
		}
	}
	if code, body, err := get("http://" + disc + "/v1/proxies"); err != nil || code != http.StatusOK {
		t.Errorf("discovery once ready: %d %v\n%s", code, err, body)
	}
	t.Logf("ready %s after the Proxy list was released", time.Since(released).Round(time.Millisecond))
	mgr.stop()
}

func TestProvidersLoadedCheck(t *testing.T) {
	if err := providersLoaded(nil)(nil); err == nil || err.Error() != "the providers config is not loaded" {
		t.Errorf("nil providers: %v", err)
	}
	if err := providersLoaded(map[string]provider.Provider{})(nil); err != nil {
		t.Errorf("a loaded config without entries: %v", err)
	}
}

// The discovery check passes exactly while the listener is bound.
func TestDiscoveryListeningCheck(t *testing.T) {
	srv, err := discovery.New(nil, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l := &listeningServer{addr: freeAddr(t), srv: srv}
	if err := l.check(nil); err == nil || !strings.Contains(err.Error(), "not listening on "+l.addr) {
		t.Fatalf("before Start: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Start(ctx) }()
	testutil.WaitFor(t, 10*time.Second, "the discovery check to pass", func() (bool, error) {
		err := l.check(nil)
		return err == nil, err
	})
	c, err := net.Dial("tcp", l.addr)
	if err != nil {
		t.Fatalf("check passed but the port does not accept: %v", err)
	}
	c.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := l.check(nil); err == nil {
		t.Fatal("the check passes after the server stopped")
	}
	// A port already taken fails Start, and the check never passes.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	l = &listeningServer{addr: busy.Addr().String(), srv: srv}
	if err := l.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "listening on "+l.addr) {
		t.Fatalf("Start on a taken port: %v", err)
	}
	if l.check(nil) == nil {
		t.Fatal("the check passes although Start failed")
	}
}
