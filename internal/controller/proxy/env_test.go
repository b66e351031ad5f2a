package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

const (
	testProvider = controllertest.TestProvider
	waitLong     = testutil.WaitLong
)

// proxyEnv is one test's namespace, fake provider and running manager.
type proxyEnv struct {
	t    testing.TB
	ctx  context.Context
	ns   string
	c    client.Client // uncached, for setting up and reading back
	fake *providertest.Fake
	r    *ProxyReconciler
	// cached reads through the manager's cache, as the reconciler does.
	cached client.Reader
}

// envConfig is how newProxyEnv sets up its manager and reconciler.
type envConfig struct {
	// manager adjusts the manager's options (its logger) when not nil.
	manager func(*ctrl.Options)
	// reconciler adjusts the reconciler, in order, before it is set up with the manager.
	reconciler []func(*ProxyReconciler, ctrl.Manager)
}

// envOption is one setting of newProxyEnv.
type envOption func(*envConfig)

// withReconciler adjusts the reconciler (its intervals, clock, providers or client)
// before it is set up with the manager.
func withReconciler(f func(*ProxyReconciler, ctrl.Manager)) envOption {
	return func(c *envConfig) { c.reconciler = append(c.reconciler, f) }
}

// withLogLines has the manager log into logs, up to V(2) (client-go's request dumps
// start at V(6)), for a test that reads what is logged.
func withLogLines(logs *controllertest.LogLines) envOption {
	return func(c *envConfig) {
		c.manager = func(o *ctrl.Options) {
			o.Logger = funcr.New(func(prefix, args string) { logs.Add(prefix + " " + args) }, funcr.Options{Verbosity: 2})
		}
	}
}

// newProxyEnv starts a manager watching a fresh namespace, with the reconciler (three
// workers) wired to a fake provider named testProvider, set up as opts say.
func newProxyEnv(t testing.TB, opts ...envOption) *proxyEnv {
	t.Helper()
	var cfg envConfig
	for _, o := range opts {
		o(&cfg)
	}
	ctx := testContext(t)
	env := shared.Env(t)
	ns := env.Namespace(t, ctx, "px")
	mgr := env.NewManager(t, ns, cfg.manager)
	e := &proxyEnv{t: t, ctx: ctx, ns: ns, c: env.Client, fake: providertest.NewFake(), cached: mgr.GetClient()}
	e.r = &ProxyReconciler{
		Client:     mgr.GetClient(),
		Scheme:     mgr.GetScheme(),
		Recorder:   mgr.GetEventRecorder("proxy-controller"),
		Providers:  map[string]provider.Provider{testProvider: e.fake},
		QuotaRetry: time.Hour,
	}
	for _, f := range cfg.reconciler {
		f(e.r, mgr)
	}
	if err := e.r.SetupWithManager(mgr, 3); err != nil {
		t.Fatalf("setting up the reconciler: %v", err)
	}
	testenv.StartManager(t, ctx, mgr)
	return e
}

// newProxy returns a Managed Proxy on testProvider (not yet created).
func (e *proxyEnv) newProxy(name string) *v1alpha1.Proxy { return testProxy(e.ns, name) }

// testProxy is a Managed Proxy ns/name on testProvider.
func testProxy(ns, name string) *v1alpha1.Proxy {
	return testbuild.Proxy(ns, name, testbuild.WithProvider(testProvider),
		testbuild.WithPlacement(v1alpha1.ProxyPlacement{Region: "home", Zone: "beelink", MachineType: "small", Image: "debian-12"}),
		testbuild.WithSpec(func(s *v1alpha1.ProxySpec) { s.CloudInit = "#cloud-config\npackages: [tinyproxy]\n" }))
}

func (e *proxyEnv) create(px *v1alpha1.Proxy) *v1alpha1.Proxy {
	e.t.Helper()
	if err := e.c.Create(e.ctx, px); err != nil {
		e.t.Fatalf("creating proxy %s: %v", px.Name, err)
	}
	return px
}

func (e *proxyEnv) get(name string) *v1alpha1.Proxy {
	e.t.Helper()
	return getProxyIn(e.t, e.ctx, e.c, e.ns, name)
}

// getProxyIn reads the Proxy ns/name through c.
func getProxyIn(t testing.TB, ctx context.Context, c client.Reader, ns, name string) *v1alpha1.Proxy {
	t.Helper()
	px := &v1alpha1.Proxy{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, px); err != nil {
		t.Fatalf("getting proxy %s/%s: %v", ns, name, err)
	}
	return px
}

// edit changes the spec of the Proxy name by mutate on its latest version, again on a
// conflict: the reconciler writes its status meanwhile, and each write is a new
// resourceVersion an Update of an older copy is refused for.
func (e *proxyEnv) edit(name, what string, mutate func(*v1alpha1.Proxy)) {
	e.t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		px := &v1alpha1.Proxy{}
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, px); err != nil {
			return err
		}
		mutate(px)
		return e.c.Update(e.ctx, px)
	}); err != nil {
		e.t.Fatalf("editing %s of proxy %s: %v", what, name, err)
	}
}

// waitProxy waits until cond holds for the Proxy and returns it.
func (e *proxyEnv) waitProxy(name, what string, cond func(*v1alpha1.Proxy) bool) *v1alpha1.Proxy {
	e.t.Helper()
	var px *v1alpha1.Proxy
	waitFor(e.t, waitLong, fmt.Sprintf("proxy %s/%s: %s", e.ns, name, what), func() (bool, error) {
		px = &v1alpha1.Proxy{}
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, px); err != nil {
			return false, err
		}
		if cond(px) {
			return true, nil
		}
		return false, fmt.Errorf("phase %q, message %q, provisioned %+v", px.Status.Phase, px.Status.Message, provisioned(px))
	})
	return px
}

func (e *proxyEnv) waitPhase(name string, phase v1alpha1.ProxyPhase) *v1alpha1.Proxy {
	e.t.Helper()
	return e.waitProxy(name, "phase "+string(phase), func(px *v1alpha1.Proxy) bool { return px.Status.Phase == phase })
}

func provisioned(px *v1alpha1.Proxy) metav1.Condition {
	if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// waitEvent waits for an Event on the Proxy with reason (and a note containing substr)
// and returns it.
func (e *proxyEnv) waitEvent(name, reason, substr string) eventsv1.Event {
	e.t.Helper()
	var found eventsv1.Event
	waitFor(e.t, waitLong, fmt.Sprintf("event %s %q on proxy %s", reason, substr, name), func() (bool, error) {
		evs, err := e.events(name)
		for _, ev := range evs {
			if ev.Reason == reason && strings.Contains(ev.Note, substr) {
				found = ev
				return true, nil
			}
		}
		return false, err
	})
	return found
}

func (e *proxyEnv) events(name string) ([]eventsv1.Event, error) {
	list := &eventsv1.EventList{}
	if err := e.c.List(e.ctx, list, client.InNamespace(e.ns)); err != nil {
		return nil, err
	}
	var out []eventsv1.Event
	for _, ev := range list.Items {
		if ev.Regarding.Name == name && ev.Regarding.Kind == "Proxy" {
			out = append(out, ev)
		}
	}
	return out, nil
}

// reconcileNow runs one reconcile of the Proxy directly, as the controller would once
// its cache has seen the latest write.
func (e *proxyEnv) reconcileNow(name string) (ctrl.Result, error) {
	e.t.Helper()
	key := client.ObjectKey{Namespace: e.ns, Name: name}
	latest := e.get(name).ResourceVersion
	waitFor(e.t, waitLong, "the manager's cache to see proxy "+name+" at version "+latest, func() (bool, error) {
		px := &v1alpha1.Proxy{}
		err := e.cached.Get(e.ctx, key, px)
		return err == nil && px.ResourceVersion == latest, err
	})
	return e.r.Reconcile(e.ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: e.ns, Name: name}})
}

// ops lists the recorded provider operations, in order, as "op arg".
func (e *proxyEnv) ops() []string { return fakeOps(e.fake) }

// fakeOps lists the calls made of fake, as "Op name-or-id".
func fakeOps(fake *providertest.Fake) []string {
	var out []string
	for _, c := range fake.Calls() {
		switch a := c.Arg.(type) {
		case provider.CreateRequest:
			out = append(out, c.Op+" "+a.Name)
		case string:
			out = append(out, c.Op+" "+a)
		default:
			out = append(out, c.Op)
		}
	}
	return out
}

// quotaUntil returns a create hook failing with ErrQuotaExceeded while *blocked is set.
func quotaUntil(blocked *atomic.Bool) providertest.CreateHook {
	return func(_ context.Context, req provider.CreateRequest) error {
		if blocked.Load() {
			return provider.QuotaExceeded(errors.New("storage pool default has 1 GiB available, 11 GiB needed"))
		}
		return nil
	}
}
