package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// syncEnv is the Proxy reconciler alone on a namespace of its own, a fake provider and a
// fake clock, with no manager: the test runs each reconcile itself
// (controllertest.ExpectReconciled) and asserts what that one pass wrote, with nothing to
// wait for. The Events go to a recorder the test reads. This layer suits what one pass
// decides; proxyEnv (a manager) what needs the controller's timers, watches and cache.
type syncEnv struct {
	t      testing.TB
	ctx    context.Context
	c      client.Client
	ns     string
	clock  *clocktesting.FakeClock
	fake   *providertest.Fake
	events *events.FakeRecorder
	r      *ProxyReconciler
}

// newSyncEnv makes a syncEnv; adjust changes the reconciler (its intervals) first.
func newSyncEnv(t testing.TB, adjust ...func(*ProxyReconciler)) *syncEnv {
	t.Helper()
	ctx := testContext(t)
	env := shared.Env(t)
	e := &syncEnv{t: t, ctx: ctx, c: env.Client, ns: env.Namespace(t, ctx, "pxs"), clock: clocktesting.NewFakeClock(time.Now()),
		fake: providertest.NewFake(), events: events.NewFakeRecorder(100)}
	e.r = &ProxyReconciler{Client: env.Client, APIReader: env.Client, Scheme: env.Scheme, Recorder: e.events,
		Providers: map[string]provider.Provider{testProvider: e.fake}, Clock: e.clock, QuotaRetry: time.Hour}
	for _, f := range adjust {
		f(e.r)
	}
	return e
}

// newProxy is testProxy in the test's namespace.
func (e *syncEnv) newProxy(name string) *v1alpha1.Proxy { return testProxy(e.ns, name) }

// create creates px and runs its first reconcile; px is left as that pass wrote it.
func (e *syncEnv) create(px *v1alpha1.Proxy) ctrl.Result {
	e.t.Helper()
	if err := e.c.Create(e.ctx, px); err != nil {
		e.t.Fatalf("creating proxy %s: %v", px.Name, err)
	}
	return e.reconcile(px)
}

// reconcile runs one reconcile of px and reads it back into px.
func (e *syncEnv) reconcile(px *v1alpha1.Proxy) ctrl.Result {
	e.t.Helper()
	return controllertest.ExpectReconciled(e.t, e.ctx, e.c, e.r, px)
}

// ops lists the calls made of the fake provider (fakeOps).
func (e *syncEnv) ops() []string { return fakeOps(e.fake) }

// recorded returns the Events recorded since the last call, as "type reason note".
func (e *syncEnv) recorded() []string {
	var out []string
	for {
		select {
		case ev := <-e.events.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// expectEvent fails the test unless an Event of typ and reason whose note contains
// substr was recorded since the last look.
func (e *syncEnv) expectEvent(typ, reason, substr string) {
	e.t.Helper()
	evs := e.recorded()
	for _, ev := range evs {
		if strings.HasPrefix(ev, typ+" "+reason+" ") && strings.Contains(ev, substr) {
			return
		}
	}
	e.t.Errorf("no %s Event %s containing %q among %q", typ, reason, substr, evs)
}
