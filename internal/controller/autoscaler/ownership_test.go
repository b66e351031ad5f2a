package autoscaler

import (
	"strings"
	"testing"

	"k8s.io/client-go/tools/events"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/pool"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// TestPoolReconcilerLeavesTheAutoscalersStatus: the pool reconciler and the autoscaler
// write one pool's status in turn; each status field has one owner, status.autoscaling
// and the Scaling condition are the autoscaler's, and the pool reconciler's passes never
// put back what the autoscaler wrote before.
func TestPoolReconcilerLeavesTheAutoscalersStatus(t *testing.T) {
	e := newSyncEnv(t)
	pr := &pool.ProxyPoolReconciler{Client: e.C, Scheme: shared.Env(t).Scheme, Recorder: &events.FakeRecorder{},
		Zones: controllertest.PoolZones, Clock: e.Clock}
	p := e.CreatePool("shared", Autoscaling(0, 5, 10))
	e.Available(p, 1)
	for _, sessions := range []float64{10, 20, 40} {
		e.Clock.Step(DefaultStatusInterval) // a change of the demand alone is written at most so often
		e.Demand("shared", "egress-gw-0", demand.Measure{Sessions: sessions})
		e.Pass(p)
		controllertest.ExpectReconciled(t, e.Ctx, e.C, pr, p)
		if got := p.Status.Autoscaling.Demand.Sessions.AsApproximateFloat64(); got != sessions {
			t.Fatalf("after the pool reconciler's pass status.autoscaling.demand.sessions is %g, want the autoscaler's %g", got, sessions)
		}
		if c := Scaling(p); !strings.Contains(c.Message, "demand "+strings.TrimSuffix(strings.TrimSuffix(p.Status.Autoscaling.Demand.Sessions.String(), "0"), ".")) {
			t.Fatalf("Scaling %q does not name the demand the autoscaler last acted on (%s)", c.Message, p.Status.Autoscaling.Demand.Sessions.String())
		}
	}
	if faults := testenv.StatusOwnership(p, statusapply.ProxyPoolController, statusapply.Autoscaler); len(faults) != 0 {
		t.Fatalf("status ownership:\n%s", strings.Join(faults, "\n"))
	}
	owned := testenv.StatusManagers(p)[statusapply.Autoscaler]
	for _, f := range []string{`"f:autoscaling"`, `"k:{\"type\":\"Scaling\"}"`} {
		if !strings.Contains(owned, f) {
			t.Errorf("the autoscaler does not own %s: %s", f, owned)
		}
	}
}
