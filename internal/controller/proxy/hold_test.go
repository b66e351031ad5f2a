package proxy

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// A running instance whose agent stops reporting an address keeps its last address and
// phase for AddressHold (by the reconciler's clock, a fake one here), then the Proxy goes
// back to Provisioning; the address coming back ends the hold, and a later loss starts a
// new one.
func TestAddressHeldWhileAgentReportsNone(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Now())
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, _ ctrl.Manager) { r.Clock = clk }))
	const name = "flaky-agent"
	e.create(e.newProxy(name))
	before := e.waitPhase(name, v1alpha1.PhaseRunning)
	setIP := func(ip string) {
		t.Helper()
		inst, ok := e.fake.Instance(before.Status.ProviderID)
		if !ok {
			t.Fatalf("instance %s missing from the fake", before.Status.ProviderID)
		}
		inst.IP = ip
		e.fake.SetInstance(inst)
	}
	reconcile := func(what string) (*v1alpha1.Proxy, ctrl.Result) {
		t.Helper()
		res, err := e.reconcileNow(name)
		if err != nil {
			t.Fatalf("%s: reconcile: %v", what, err)
		}
		return e.get(name), res
	}
	held := func(what string) {
		t.Helper()
		px, res := reconcile(what)
		if px.Status.Phase != v1alpha1.PhaseRunning || px.Status.IP != before.Status.IP {
			t.Fatalf("%s: phase %s ip %q, want Running at %s held", what, px.Status.Phase, px.Status.IP, before.Status.IP)
		}
		if res.RequeueAfter <= 0 || res.RequeueAfter > DefaultPollInterval {
			t.Errorf("%s: requeue after %s, want a look within the poll interval", what, res.RequeueAfter)
		}
	}

	setIP("")
	held("the address just lost")
	clk.Step(DefaultAddressHold - time.Second)
	held("a second before the hold ends")
	clk.Step(time.Second)
	px, _ := reconcile("the hold over")
	if px.Status.Phase != v1alpha1.PhaseProvisioning || px.Status.IP != "" {
		t.Fatalf("after the hold: phase %s ip %q, want Provisioning without an address", px.Status.Phase, px.Status.IP)
	}

	setIP(before.Status.IP)
	if px, _ := reconcile("the address back"); px.Status.Phase != v1alpha1.PhaseRunning {
		t.Fatalf("address back: phase %s", px.Status.Phase)
	}
	clk.Step(time.Hour)
	setIP("")
	held("a new loss, long after the first")
}
