package autoscaler

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/autoscale"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
)

// gateways writes the same share of sessions from each of n gateway replicas.
func (e *syncEnv) gateways(pool string, n int, sessions float64) {
	e.T.Helper()
	for i := range n {
		e.Demand(pool, fmt.Sprintf("egress-gw-%d", i), demand.Measure{Sessions: sessions / float64(n)})
	}
}

// TestDemandRampGrowsInBoundedSteps: a demand that ramps up over a few minutes grows the
// pool at once, but never more than maxStepUp beyond the available children, to what the
// target asks (ceil(96/10) = 10), and the status and the metric show the demand.
func TestDemandRampGrowsInBoundedSteps(t *testing.T) {
	e := newSyncEnv(t)
	pool := e.CreatePool("ramp", Autoscaling(0, 12, 10, func(a *v1alpha1.PoolAutoscaling) {
		a.MaxStepUp = ptr.To(intstr.FromInt32(2))
	}))
	e.Available(pool, 1)
	ramp := []float64{12, 30, 60, 96, 96, 96, 96, 96, 96}
	var history []int32
	for _, sessions := range ramp {
		e.Clock.Step(15 * time.Second)
		e.gateways("ramp", 3, sessions)
		before, avail := replicas(pool), pool.Status.AvailableReplicas
		res := e.Pass(pool)
		got := replicas(pool)
		history = append(history, got)
		if got > before && got > avail+2 {
			t.Fatalf("demand %g: scaled from %d to %d with %d available: more than maxStepUp 2 beyond them (history %v)", sessions, before, got, avail, history)
		}
		if want := int32((sessions + 9) / 10); got > want {
			t.Fatalf("demand %g: %d replicas, more than the %d it needs", sessions, got, want)
		}
		c := Scaling(pool)
		if c.Status != metav1.ConditionTrue {
			t.Fatalf("demand %g: Scaling %s/%s %q, want True", sessions, c.Status, c.Reason, c.Message)
		}
		if got < int32((sessions+9)/10) && res.RequeueAfter <= 0 {
			t.Fatalf("demand %g: short of the target (%d) and no requeue", sessions, got)
		}
		// The children of the last step boot.
		e.Available(pool, got)
	}
	if got := replicas(pool); got != 10 {
		t.Fatalf("the pool settled at %d replicas, want 10 (history %v)", got, history)
	}
	if c := Scaling(pool); c.Reason != v1alpha1.PoolReasonWithinTarget || !strings.Contains(c.Message, "96 sessions") {
		t.Errorf("Scaling %s %q, want WithinTarget naming the 96 sessions", c.Reason, c.Message)
	}
	st := pool.Status.Autoscaling
	if st == nil || st.DesiredReplicas != 10 || st.Demand.Sessions.AsApproximateFloat64() != 96 || st.Demand.Sources != 3 || st.LastScaleUpTime == nil {
		t.Fatalf("status.autoscaling %+v, want desired 10, 96 sessions from 3 sources, a last scale-up", st)
	}
	want := []string{"proxy_operator_pool_demand_held=0", "proxy_operator_pool_demand_requests_per_second=0", "proxy_operator_pool_demand_sessions=96"}
	if got := demandSeries(t, e.NS, "ramp"); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the manager's registry holds %v for the pool, want %v", got, want)
	}
	t.Logf("replicas pass by pass: %v", history)
}

// TestDemandStopsShrinksAfterTheDelay: when the demand drops, the pool keeps its size for
// scaleDownDelay, then shrinks to what the demand needs plus the warm spare, never below
// that while there is demand; when the demand stops it shrinks, a delay later, to
// minReplicas.
func TestDemandStopsShrinksAfterTheDelay(t *testing.T) {
	e := newSyncEnv(t)
	const delay = 5 * time.Minute
	pool := e.CreatePool("ebb", Autoscaling(1, 10, 10, func(a *v1alpha1.PoolAutoscaling) {
		a.WarmSpare = 1
		a.ScaleDownDelay = &metav1.Duration{Duration: delay}
	}))
	// Grow to 40/10 + 1 spare = 5, the children booting between passes.
	for range 5 {
		e.Clock.Step(15 * time.Second)
		e.gateways("ebb", 2, 40)
		e.Pass(pool)
		e.Available(pool, replicas(pool))
	}
	if got := replicas(pool); got != 5 {
		t.Fatalf("40 sessions at 10 per child and a warm spare: %d replicas, want 5", got)
	}
	// The demand drops to 5 sessions: it needs 1, plus the spare.
	dropped := e.Clock.Now()
	for e.Clock.Since(dropped) < delay+time.Minute {
		e.Clock.Step(30 * time.Second)
		e.gateways("ebb", 2, 5)
		res := e.Pass(pool)
		got, c := replicas(pool), Scaling(pool)
		if got < 2 {
			t.Fatalf("%s after the drop: %d replicas, below 1 needed + 1 warm spare while there is demand", e.Clock.Since(dropped), got)
		}
		if e.Clock.Since(dropped) < delay {
			if got != 5 || c.Reason != v1alpha1.PoolReasonHeldByDelay || res.RequeueAfter <= 0 {
				t.Fatalf("%s after the drop (delay %s): %d replicas, %s %q, requeue %s; want 5 held by the delay with a requeue",
					e.Clock.Since(dropped), delay, got, c.Reason, c.Message, res.RequeueAfter)
			}
		}
	}
	if got := replicas(pool); got != 2 {
		t.Fatalf("a delay after the drop: %d replicas, want 2 (1 needed + 1 warm spare)", got)
	}
	e.Available(pool, 2)
	// The demand stops (the gateways report zero): minReplicas 1, a delay later.
	stopped := e.Clock.Now()
	for e.Clock.Since(stopped) < delay+time.Minute {
		e.Clock.Step(30 * time.Second)
		e.gateways("ebb", 2, 0)
		e.Pass(pool)
		if e.Clock.Since(stopped) < delay && replicas(pool) != 2 {
			t.Fatalf("%s after the demand stopped: %d replicas, want 2 until the delay has passed", e.Clock.Since(stopped), replicas(pool))
		}
	}
	if got, c := replicas(pool), Scaling(pool); got != 1 || c.Reason != v1alpha1.PoolReasonWithinTarget && c.Reason != v1alpha1.PoolReasonScaledDown {
		t.Fatalf("a delay after the demand stopped: %d replicas (%s %q), want minReplicas 1", got, c.Reason, c.Message)
	}
	if st := pool.Status.Autoscaling; st == nil || st.LastScaleDownTime == nil {
		t.Fatalf("status.autoscaling %+v, want a last scale-down time", st)
	}
}

// TestSteadyDemandDoesNotOscillate: a demand that wobbles across a child's target (19, 21,
// 19, ... sessions at 10 per child, a report each 30 s) for 20 minutes changes the pool's size at most once
// per scale-down delay.
func TestSteadyDemandDoesNotOscillate(t *testing.T) {
	e := newSyncEnv(t)
	const delay = 3 * time.Minute
	pool := e.CreatePool("wobble", Autoscaling(0, 10, 10, func(a *v1alpha1.PoolAutoscaling) {
		a.ScaleDownDelay = &metav1.Duration{Duration: delay}
	}))
	// Changes of size once the pool first reached 3 (it grows to it at once, in steps).
	var changes []time.Time
	grown := false
	start := e.Clock.Now()
	for i := 0; e.Clock.Since(start) < 20*time.Minute; i++ {
		e.Clock.Step(30 * time.Second)
		sessions := 19.0
		if i%3 == 1 {
			sessions = 21
		}
		e.gateways("wobble", 2, sessions)
		before := replicas(pool)
		e.Pass(pool)
		e.Available(pool, replicas(pool))
		if grown && replicas(pool) != before {
			changes = append(changes, e.Clock.Now())
		}
		grown = grown || replicas(pool) == 3
	}
	for i := 1; i < len(changes); i++ {
		if changes[i].Sub(changes[i-1]) < delay {
			t.Fatalf("changes at %v: two within the scale-down delay %s", changes, delay)
		}
	}
	if len(changes) > 20/3 {
		t.Fatalf("%d changes of size in 20 minutes of a steady demand: %v", len(changes), changes)
	}
	if got := replicas(pool); got != 3 {
		t.Fatalf("a demand up to 21 sessions at 10 per child: %d replicas, want 3", got)
	}
	t.Logf("%d changes of size in 20 minutes once grown", len(changes))
}

// TestBudgetCapsScaleUp: with each child costing 0.5 an hour (the cost option), a budget
// of 2 an hour caps the pool at 4 children, whatever the demand wants, and the condition
// names the cap; with the cost unknown the budget caps nothing.
func TestBudgetCapsScaleUp(t *testing.T) {
	e := newSyncEnv(t)
	budget := func(p *v1alpha1.ProxyPool) {
		p.Spec.Budget = &v1alpha1.PoolBudget{MaxHourly: "2"}
	}
	capped := e.CreatePool("capped", Autoscaling(0, 20, 10), budget)
	free := e.CreatePool("free", Autoscaling(0, 20, 10), budget)
	e.R.CostPerChild = func(_ context.Context, p *v1alpha1.ProxyPool) (float64, bool) {
		if p.Name == "capped" {
			return 0.5, true
		}
		return 0, false
	}
	for range 6 {
		e.Clock.Step(15 * time.Second)
		for _, p := range []*v1alpha1.ProxyPool{capped, free} {
			e.gateways(p.Name, 2, 100)
			e.Pass(p)
			e.Available(p, replicas(p))
		}
	}
	if got, c := replicas(capped), Scaling(capped); got != 4 || c.Reason != v1alpha1.PoolReasonBudgetCapped || !strings.Contains(c.Message, "budget 2/h at 0.5/h per child (4 children)") {
		t.Fatalf("a pool wanting 10 children at 0.5/h under a budget of 2/h: %d replicas, %s %q; want 4, BudgetCapped naming the cap", got, c.Reason, c.Message)
	}
	if got := replicas(free); got != 10 {
		t.Fatalf("a pool whose children's cost is unknown: %d replicas, want 10 (no cap)", got)
	}
}

// TestExternalAutoscalerIsRefused: a HorizontalPodAutoscaler (or a KEDA ScaledObject) on
// the pool turns the built-in autoscaler aside: Scaling False, ExternalAutoscaler, naming
// it, and spec.replicas left alone; once it is gone the autoscaler sizes the pool again.
func TestExternalAutoscalerIsRefused(t *testing.T) {
	e := newSyncEnv(t)
	pool := e.CreatePool("hpa", Autoscaling(0, 10, 10))
	e.Available(pool, 1)
	hpa := e.HPA("crawl-hpa", "hpa")
	e.HPA("other-hpa", "another-pool")
	e.gateways("hpa", 2, 50)
	e.Pass(pool)
	c := Scaling(pool)
	if c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.PoolReasonExternalAutoscaler ||
		!strings.Contains(c.Message, "HorizontalPodAutoscaler "+e.NS+"/crawl-hpa") || strings.Contains(c.Message, "other-hpa") {
		t.Fatalf("Scaling %s/%s %q, want False ExternalAutoscaler naming HorizontalPodAutoscaler %s/crawl-hpa alone", c.Status, c.Reason, c.Message, e.NS)
	}
	if got := replicas(pool); got != 1 {
		t.Fatalf("with an HPA on the pool: %d replicas, want 1 as it was", got)
	}
	// The demand is still measured, shown and exported: the HPA may scale on it.
	if st := pool.Status.Autoscaling; st == nil || st.Demand.Sessions.AsApproximateFloat64() != 50 {
		t.Fatalf("with an HPA on the pool: status.autoscaling %+v, want the 50 sessions measured", st)
	}
	if got := promtestutil.ToFloat64(demandSessions.WithLabelValues(e.NS, "hpa")); got != 50 {
		t.Fatalf("with an HPA on the pool: proxy_operator_pool_demand_sessions = %g, want 50", got)
	}
	if err := e.C.Delete(e.Ctx, hpa); err != nil {
		t.Fatal(err)
	}
	e.Pass(pool)
	if got, c := replicas(pool), Scaling(pool); got != 2 || c.Status != metav1.ConditionTrue {
		t.Fatalf("the HPA gone: %d replicas, Scaling %s/%s; want 2 (100%% step from 1), True", got, c.Status, c.Reason)
	}

	// A KEDA ScaledObject, its CRD installed.
	e.InstallScaledObjectCRD()
	e.R.ScaledObjects = true
	e.ScaledObject("crawl-keda", "hpa")
	e.Pass(pool)
	if c := Scaling(pool); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.PoolReasonExternalAutoscaler || !strings.Contains(c.Message, "ScaledObject "+e.NS+"/crawl-keda") {
		t.Fatalf("Scaling %s/%s %q, want False ExternalAutoscaler naming ScaledObject %s/crawl-keda", c.Status, c.Reason, c.Message, e.NS)
	}
}

// TestWithoutAutoscalingNoCondition: a pool without spec.autoscaling gets no Scaling
// condition nor status.autoscaling, and one that drops spec.autoscaling loses them (its
// spec.replicas stays as last set) and its demand metrics.
func TestWithoutAutoscalingNoCondition(t *testing.T) {
	e := newSyncEnv(t)
	plain := e.CreatePool("plain", nil)
	e.Pass(plain)
	if c := Scaling(plain); c.Type != "" || plain.Status.Autoscaling != nil {
		t.Fatalf("a pool without spec.autoscaling has Scaling %+v and status.autoscaling %+v", c, plain.Status.Autoscaling)
	}
	pool := e.CreatePool("dropped", Autoscaling(0, 10, 10))
	e.Available(pool, 1)
	e.gateways("dropped", 1, 30)
	e.Pass(pool)
	if Scaling(pool).Type == "" || pool.Status.Autoscaling == nil {
		t.Fatal("an autoscaled pool has no Scaling condition or status.autoscaling")
	}
	pool.Spec.Autoscaling = nil
	if err := e.C.Update(e.Ctx, pool); err != nil {
		t.Fatal(err)
	}
	e.Pass(pool)
	if c := Scaling(pool); c.Type != "" || pool.Status.Autoscaling != nil {
		t.Fatalf("spec.autoscaling dropped: Scaling %+v and status.autoscaling %+v remain", c, pool.Status.Autoscaling)
	}
	if got := replicas(pool); got != 2 {
		t.Fatalf("spec.autoscaling dropped: %d replicas, want 2 as last set", got)
	}
	if got := demandSeries(t, e.NS, "dropped"); len(got) != 0 {
		t.Fatalf("spec.autoscaling dropped: the demand metrics %v remain", got)
	}
}

// TestUnusedPoolGoesToMinReplicas: a new pool nobody sends anything to has no demand Lease
// (measurers write none before they see demand): its demand is zero, not unknown, and it
// goes from the API server's default of 1 to minReplicas 0 a delay later; the first
// held request (a wake) brings one child at once.
func TestUnusedPoolGoesToMinReplicas(t *testing.T) {
	e := newSyncEnv(t)
	pool := e.CreatePool("unused", Autoscaling(0, 5, 10))
	e.Available(pool, 1)
	e.Pass(pool)
	if c := Scaling(pool); replicas(pool) != 1 || c.Reason != v1alpha1.PoolReasonHeldByDelay {
		t.Fatalf("a new pool without demand: %d replicas, %s %q; want 1 held by the delay", replicas(pool), c.Reason, c.Message)
	}
	e.Clock.Step(autoscale.DefaultScaleDownDelay)
	e.Pass(pool)
	if c := Scaling(pool); replicas(pool) != 0 || c.Reason != v1alpha1.PoolReasonScaledDown {
		t.Fatalf("a delay later: %d replicas, %s %q; want 0, ScaledDown", replicas(pool), c.Reason, c.Message)
	}
	e.Available(pool, 0)
	e.Demand("unused", "egress-gw-0", demand.Measure{Held: 1})
	e.Pass(pool)
	if c := Scaling(pool); replicas(pool) != 1 || c.Reason != v1alpha1.PoolReasonScaledUp {
		t.Fatalf("one held request at zero: %d replicas, %s %q; want 1 at once, ScaledUp", replicas(pool), c.Reason, c.Message)
	}
}
