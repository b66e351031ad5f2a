package autoscaler

import (
	"fmt"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// TestManagerWakesTheAutoscaler runs the autoscaler in a manager (the real clock), to
// check its watches: a demand Lease written for a pool wakes it, the pool's available
// children changing wakes it, and an HPA on the pool wakes it; each wait is for what the
// pass writes.
func TestManagerWakesTheAutoscaler(t *testing.T) {
	env := shared.Env(t)
	e := newSyncEnv(t)
	// As in the manager: the Leases cached in the demand namespace alone.
	mgr := env.NewManager(t, e.NS, func(o *ctrl.Options) {
		o.Cache.ByObject = map[client.Object]cache.ByObject{&coordinationv1.Lease{}: LeaseCache(e.DemandNS)}
	})
	if err := (&Reconciler{Client: mgr.GetClient(), Clock: e.Clock, DemandNamespace: e.DemandNS}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	testenv.StartManager(t, e.Ctx, mgr)

	pool := e.CreatePool("woken", Autoscaling(0, 5, 10))
	wait := func(what string, ok func(p *v1alpha1.ProxyPool) bool) {
		t.Helper()
		testutil.WaitFor(t, testutil.WaitLong, what, func() (bool, error) {
			if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
				return false, err
			}
			c := Scaling(pool)
			return ok(pool), fmt.Errorf("replicas %d, Scaling %s/%s %q", replicas(pool), c.Status, c.Reason, c.Message)
		})
	}
	e.Demand("woken", "egress-gw-0", demand.Measure{Sessions: 30})
	wait("the Lease's pass: held at 1 with nothing available", func(p *v1alpha1.ProxyPool) bool {
		return Scaling(p).Reason == v1alpha1.PoolReasonHeldByStep && replicas(p) == 1
	})
	e.Available(pool, 1)
	wait("the available child's pass: scaled up to 2", func(p *v1alpha1.ProxyPool) bool { return replicas(p) == 2 })
	e.HPA("woken-hpa", "woken")
	wait("the HPA's pass: ExternalAutoscaler", func(p *v1alpha1.ProxyPool) bool {
		return Scaling(p).Reason == v1alpha1.PoolReasonExternalAutoscaler
	})
}

// An autoscaler without a demand namespace is refused at setup.
func TestSetupNeedsADemandNamespace(t *testing.T) {
	env := shared.Env(t)
	e := newSyncEnv(t)
	mgr := env.NewManager(t, e.NS, nil)
	if err := (&Reconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err == nil || !strings.Contains(err.Error(), "demand namespace") {
		t.Fatalf("SetupWithManager without a demand namespace = %v, want an error naming it", err)
	}
}
