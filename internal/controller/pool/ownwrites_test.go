package pool

import (
	"testing"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
)

// A pool reconcile handed a copy of the pool older than the reconciler's own last write
// of it decides nothing from it. Here a child turned Ready and back: the old copy's
// status (0 ready) is what the pool wants again, so without the check nothing is written
// and the status the server holds (1 ready, the reconciler's last write) stays until the
// next event.
func TestPoolReconcileBehindItsOwnWriteDecidesNothing(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t, shared.Env(t))
	lag := &controllertest.LaggingCache{Client: e.C}
	e.R.Client, e.R.APIReader = lag, e.C
	pool := e.NewPool("lag", 1)
	e.Create(pool)
	kids := e.Children("lag")
	if len(kids) != 1 || pool.Status.ReadyReplicas != 0 {
		t.Fatalf("after the first reconcile: %d children, %d ready; want 1 and 0", len(kids), pool.Status.ReadyReplicas)
	}
	before := pool.DeepCopy()
	setChild := func(phase v1alpha1.ProxyPhase, healthy bool) {
		t.Helper()
		px := kids[0].DeepCopy()
		if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(px), px); err != nil {
			t.Fatal(err)
		}
		px.Status.Phase, px.Status.Healthy = phase, healthy
		if err := e.C.Status().Update(e.Ctx, px); err != nil {
			t.Fatalf("setting child %s %s: %v", px.Name, phase, err)
		}
	}
	setChild(v1alpha1.PhaseReady, true)
	e.Reconcile(pool)
	if pool.Status.ReadyReplicas != 1 {
		t.Fatalf("readyReplicas %d with the child Ready, want 1", pool.Status.ReadyReplicas)
	}
	written := pool.ResourceVersion

	setChild(v1alpha1.PhaseRunning, false)
	lag.Stale = before
	res, err := e.R.Reconcile(e.Ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pool)})
	lag.Stale = nil
	if err != nil || res.RequeueAfter != common.StaleRetry {
		t.Errorf("a reconcile from a copy (version %s) older than the reconciler's last write (%s) = %+v, %v; want a requeue after %v",
			before.ResourceVersion, written, res, err, common.StaleRetry)
	}
	e.Reconcile(pool)
	if pool.Status.ReadyReplicas != 0 {
		t.Errorf("readyReplicas %d once the cache caught up, the child not Ready, want 0", pool.Status.ReadyReplicas)
	}
}
