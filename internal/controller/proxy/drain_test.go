package proxy

import (
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// A deleted Proxy that was healthy (discovery may have handed it out until the deletion)
// keeps its instance for DeletionDrain from its deletion timestamp, by the reconciler's
// clock, a fake one here: Deleting, its message saying until when, no provider Delete;
// once the drain is over the instance goes and the Proxy with it. Without the drain a
// pool's rotation destroyed a replaced child's VM within a second of taking it out of
// discovery, cutting the requests a crawler had just sent through it.
func TestDeletionDrainKeepsAHealthyProxysInstance(t *testing.T) {
	t.Parallel()
	const drain = 10 * time.Second
	clk := clocktesting.NewFakeClock(time.Now())
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, _ ctrl.Manager) { r.Clock, r.DeletionDrain = clk, drain }))
	const name = "drained"
	px := e.create(e.newProxy(name))
	running := e.waitPhase(name, v1alpha1.PhaseRunning)
	id := running.Status.ProviderID
	healthEngineMarksReady(e.ctx, t, running)
	e.waitPhase(name, v1alpha1.PhaseReady)

	if err := e.c.Delete(e.ctx, px); err != nil {
		t.Fatal(err)
	}
	clk.SetTime(time.Now())
	got := e.waitProxy(name, "Deleting, draining", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseDeleting && strings.Contains(p.Status.Message, "draining until")
	})
	until := got.DeletionTimestamp.Add(drain).UTC().Format(time.RFC3339)
	for what, msg := range map[string]string{"message": got.Status.Message, "Provisioned": provisioned(got).Message} {
		if !strings.Contains(msg, until) || !strings.Contains(msg, got.InstanceName()) {
			t.Errorf("%s %q: want the drain's end %s and the instance %s", what, msg, until, got.InstanceName())
		}
	}
	res, err := e.reconcileNow(name)
	if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > drain {
		t.Errorf("a reconcile during the drain = %+v, %v; want a look again within %s", res, err, drain)
	}
	if _, ok := e.fake.Instance(id); !ok || slices.Contains(e.ops(), "Delete "+id) {
		t.Fatalf("instance %s deleted during the drain (provider calls %v)", id, e.ops())
	}

	clk.Step(drain)
	if _, err := e.reconcileNow(name); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.fake.Instance(id); ok {
		t.Errorf("instance %s still exists after the drain", id)
	}
	waitFor(t, waitLong, "proxy "+name+" to be gone after the drain", func() (bool, error) {
		err := e.c.Get(e.ctx, client.ObjectKeyFromObject(px), &v1alpha1.Proxy{})
		return apierrors.IsNotFound(err), err
	})
}

// A Proxy discovery never handed out (not healthy) has no drain: its instance goes at
// once, with the clock standing still.
func TestDeletionDrainSkipsAProxyNeverHealthy(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Now())
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, _ ctrl.Manager) { r.Clock, r.DeletionDrain = clk, time.Hour }))
	const name = "unproven"
	px := e.create(e.newProxy(name))
	id := e.waitPhase(name, v1alpha1.PhaseRunning).Status.ProviderID
	if err := e.c.Delete(e.ctx, px); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "proxy "+name+" to be gone without a drain", func() (bool, error) {
		err := e.c.Get(e.ctx, client.ObjectKeyFromObject(px), &v1alpha1.Proxy{})
		return apierrors.IsNotFound(err), err
	})
	if _, ok := e.fake.Instance(id); ok {
		t.Errorf("instance %s still exists after its Proxy is gone", id)
	}
}
