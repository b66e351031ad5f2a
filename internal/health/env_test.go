package health

import (
	"context"
	"fmt"
	"github.com/go-logr/logr"
	"net/http/httptest"
	"sync"
	"testing"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

const waitLong = testutil.WaitLong

// engineEnv is one test's namespace, a running manager (cache, events) and an engine whose
// probe target is the operator's own /v1/whoami.
type engineEnv struct {
	t      testing.TB
	ctx    context.Context
	ns     string
	c      client.Client // uncached, for setting up and reading back
	mgr    ctrl.Manager
	engine *Engine
}

func newEngineEnv(t testing.TB, mutate func(*Options)) *engineEnv {
	t.Helper()
	ctx := testContext(t)
	env := shared.Env(t)
	ns := env.Namespace(t, ctx, "health")
	mgr := env.NewManager(t, ns, func(o *ctrl.Options) {
		o.Logger = zap.New(zap.UseDevMode(true), zap.WriteTo(newTestWriter(t)))
	})
	target := whoamiServer(t)
	// A probe that should succeed has all the time a loaded machine needs; tests of the
	// timeout set their own.
	opts := Options{ProbeURL: target + "/v1/whoami", Timeout: waitLong, FailureThreshold: 3}
	if mutate != nil {
		mutate(&opts)
	}
	log := mgr.GetLogger()
	if _, bench := t.(*testing.B); bench {
		log = logr.Discard() // a log line per probe would dominate the CPU figures
	}
	eng, err := New(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder("proxy-health"), opts, log)
	if err != nil {
		t.Fatal(err)
	}
	testenv.StartManager(t, ctx, mgr)
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	return &engineEnv{t: t, ctx: ctx, ns: ns, c: env.Client, mgr: mgr, engine: eng}
}

// whoamiServer serves the discovery API's probe target on loopback.
func whoamiServer(t testing.TB) string {
	s, err := discovery.New(nil, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// testWriter sends the manager's log to the test's log until the test ends; after that
// (the event broadcaster can still retry a write then) it drops it, since a t.Log after
// the test has completed panics.
type testWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func newTestWriter(t testing.TB) *testWriter {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return w
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(string(p))
	}
	return len(p), nil
}

// proxyAt creates a Proxy whose status says what the reconciler would have published: its
// address, a phase and the Provisioned condition.
func (e *engineEnv) proxyAt(name string, mode v1alpha1.ProxyMode, host string, port int32, phase v1alpha1.ProxyPhase) *v1alpha1.Proxy {
	e.t.Helper()
	return e.proxyWith(name, mode, host, port, phase, nil)
}

// proxyWith is proxyAt with spec.proxy set to cfg.
func (e *engineEnv) proxyWith(name string, mode v1alpha1.ProxyMode, host string, port int32, phase v1alpha1.ProxyPhase, cfg *v1alpha1.ProxyConfig) *v1alpha1.Proxy {
	e.t.Helper()
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: v1alpha1.ProxySpec{Mode: mode, Port: port, Proxy: cfg}}
	if mode == v1alpha1.ProxyModeExternal {
		px.Spec.Address = host
	} else {
		px.Spec.Provider = "fake-home"
	}
	if err := e.c.Create(e.ctx, px); err != nil {
		e.t.Fatalf("creating proxy %s: %v", name, err)
	}
	px.Status = v1alpha1.ProxyStatus{Phase: phase, IP: host, ProviderID: "fake/" + name,
		Conditions: []metav1.Condition{{Type: v1alpha1.ConditionProvisioned, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonInstanceRunning, Message: "instance running", LastTransitionTime: metav1.Now()}}}
	if err := e.c.Status().Update(e.ctx, px); err != nil {
		e.t.Fatalf("setting status of proxy %s: %v", name, err)
	}
	waitFor(e.t, waitLong, "the engine's cache to see proxy "+name+" "+string(phase), func() (bool, error) {
		cached := &v1alpha1.Proxy{}
		err := e.mgr.GetClient().Get(e.ctx, client.ObjectKeyFromObject(px), cached)
		return err == nil && cached.Status.Phase == phase, err
	})
	return px
}

func (e *engineEnv) get(name string) *v1alpha1.Proxy {
	e.t.Helper()
	px := &v1alpha1.Proxy{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, px); err != nil {
		e.t.Fatalf("getting proxy %s: %v", name, err)
	}
	return px
}

func (e *engineEnv) round() RoundStats {
	e.t.Helper()
	st, err := e.engine.Round(e.ctx)
	if err != nil {
		e.t.Fatalf("round: %v", err)
	}
	return st
}

// waitEvent waits for an Event with reason on the named Proxy and returns its note.
func (e *engineEnv) waitEvent(name, reason string, n int) {
	e.t.Helper()
	waitFor(e.t, waitLong, fmt.Sprintf("%d %s event(s) on %s", n, reason, name), func() (bool, error) {
		return e.countEvents(name, reason) >= n, nil
	})
}

func (e *engineEnv) countEvents(name, reason string) int {
	var list eventsv1.EventList
	if err := e.c.List(e.ctx, &list, client.InNamespace(e.ns)); err != nil {
		return 0
	}
	n := 0
	for _, ev := range list.Items {
		if ev.Regarding.Name == name && ev.Reason == reason {
			n++
		}
	}
	return n
}
