package pool

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// syncEnv is the pool reconciler alone on a namespace of its own and a fake clock, with
// no manager: the test runs each reconcile itself (controllertest.ExpectReconciled) and
// asserts what that one pass wrote, with nothing to wait for. The children it creates
// stay as created (no Proxy reconciler, no health engine): this layer suits what one
// pass decides, the envtest stories (poolEnv) what takes children through their life.
type syncEnv struct {
	T     testing.TB
	Ctx   context.Context
	C     client.Client
	NS    string
	Clock *clocktesting.FakeClock
	R     *ProxyPoolReconciler
}

func newSyncEnv(t testing.TB, env *testenv.Env) *syncEnv {
	t.Helper()
	ctx := testenv.Context(t)
	clk := clocktesting.NewFakeClock(time.Now())
	r := &ProxyPoolReconciler{Client: env.Client, Scheme: env.Scheme, Recorder: &events.FakeRecorder{},
		Zones: controllertest.PoolZones, Clock: clk}
	return &syncEnv{T: t, Ctx: ctx, C: env.Client, NS: env.Namespace(t, ctx, "pool"), Clock: clk, R: r}
}

// NewPool is controllertest.NewPool in the test's namespace.
func (e *syncEnv) NewPool(name string, replicas int32) *v1alpha1.ProxyPool {
	return controllertest.NewPool(e.NS, name, replicas)
}

// Create creates the pool and runs its first reconcile; pool is left as that pass wrote it.
func (e *syncEnv) Create(pool *v1alpha1.ProxyPool) ctrl.Result {
	e.T.Helper()
	if err := e.C.Create(e.Ctx, pool); err != nil {
		e.T.Fatalf("creating pool %s: %v", pool.Name, err)
	}
	return e.Reconcile(pool)
}

// Reconcile runs one reconcile of the pool and reads it back into pool.
func (e *syncEnv) Reconcile(pool *v1alpha1.ProxyPool) ctrl.Result {
	e.T.Helper()
	return controllertest.ExpectReconciled(e.T, e.Ctx, e.C, e.R, pool)
}

// Children lists the pool's children, by name.
func (e *syncEnv) Children(pool string) []v1alpha1.Proxy {
	e.T.Helper()
	return controllertest.ListChildren(e.T, e.Ctx, e.C, e.NS, pool)
}
