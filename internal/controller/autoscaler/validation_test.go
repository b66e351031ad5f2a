package autoscaler

import (
	"context"
	"strings"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/autoscale"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
)

// TestAdmissionRefusesBadAutoscaling: the API server refuses a spec.autoscaling it could
// never act on, naming the field.
func TestAdmissionRefusesBadAutoscaling(t *testing.T) {
	e := newSyncEnv(t)
	for _, tc := range []struct {
		name string
		a    *v1alpha1.PoolAutoscaling
		want string
	}{
		{"fine", Autoscaling(0, 3, 10), ""},
		{"min above max", Autoscaling(5, 3, 10), "minReplicas must not be more than maxReplicas"},
		{"max zero", Autoscaling(0, 0, 10), "maxReplicas"},
		{"no target", Autoscaling(0, 3, 10, func(a *v1alpha1.PoolAutoscaling) { a.Target = v1alpha1.PoolAutoscalingTarget{} }),
			"spec.autoscaling.target must set sessionsPerReplica, requestsPerSecondPerReplica or both"},
		{"target zero", Autoscaling(0, 3, 0), "sessionsPerReplica"},
		{"negative spare", Autoscaling(0, 3, 10, func(a *v1alpha1.PoolAutoscaling) { a.WarmSpare = -1 }), "warmSpare"},
		{"negative delay", Autoscaling(0, 3, 10, func(a *v1alpha1.PoolAutoscaling) { a.ScaleDownDelay = &metav1.Duration{Duration: -time.Minute} }),
			"scaleDownDelay must not be negative"},
		{"bad step", Autoscaling(0, 3, 10, func(a *v1alpha1.PoolAutoscaling) { a.MaxStepUp = ptr.To(intstr.FromString("half")) }),
			"spec.autoscaling.maxStepUp must be a non-negative number or a percentage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := NewAutoscaledPool(e.NS, "v", tc.a)
			err := e.C.Create(e.Ctx, pool, client.DryRunAll)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// TestAdmissionRefusesBadBudget: spec.budget.maxHourly is a sum of money written out in
// full; the API server refuses a negative one and a quantity's notation (500m), naming
// the field, and keeps what was written ("0.50" reads back as "0.50").
func TestAdmissionRefusesBadBudget(t *testing.T) {
	e := newSyncEnv(t)
	for _, bad := range []v1alpha1.Amount{"-1", "500m", "1e3", "abc", ""} {
		pool := NewAutoscaledPool(e.NS, "broke", Autoscaling(0, 5, 10))
		pool.Spec.Budget = &v1alpha1.PoolBudget{MaxHourly: bad}
		err := e.C.Create(e.Ctx, pool, client.DryRunAll)
		if err == nil || !strings.Contains(err.Error(), "spec.budget.maxHourly") {
			t.Errorf("maxHourly %q: %v, want a refusal naming spec.budget.maxHourly", bad, err)
		}
	}
	pool := NewAutoscaledPool(e.NS, "fine", Autoscaling(0, 5, 10))
	pool.Spec.Budget = &v1alpha1.PoolBudget{MaxHourly: "0.50"}
	if err := e.C.Create(e.Ctx, pool); err != nil {
		t.Fatal(err)
	}
	got := &v1alpha1.ProxyPool{}
	if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(pool), got); err != nil || got.Spec.Budget == nil || got.Spec.Budget.MaxHourly != "0.50" {
		t.Fatalf("maxHourly read back as %+v (%v), want 0.50", got.Spec.Budget, err)
	}
}

// TestStaleDemandKeepsTheSizeAndOldLeasesGo: a pool whose measurers stopped reporting
// keeps its size (DemandUnknown, the stale source counted), and a Lease not renewed for an
// hour is deleted.
func TestStaleDemandKeepsTheSizeAndOldLeasesGo(t *testing.T) {
	e := newSyncEnv(t)
	pool := e.CreatePool("silent", Autoscaling(0, 5, 10))
	e.Available(pool, 1)
	e.gateways("silent", 1, 20)
	e.Pass(pool)
	if got := replicas(pool); got != 2 {
		t.Fatalf("20 sessions at 10 per child: %d replicas, want 2", got)
	}
	// The gateway goes away; its Lease goes stale.
	e.Clock.Step(autoscale.DefaultStaleAfter + time.Second)
	res := e.Pass(pool)
	c := Scaling(pool)
	if got := replicas(pool); got != 2 || c.Reason != v1alpha1.PoolReasonDemandUnknown || pool.Status.Autoscaling.Demand.StaleSources != 1 || res.RequeueAfter <= 0 {
		t.Fatalf("a stale measurer: %d replicas, %s %q, status %+v, requeue %s; want 2 kept, DemandUnknown, 1 stale source, a requeue",
			got, c.Reason, c.Message, pool.Status.Autoscaling.Demand, res.RequeueAfter)
	}
	if len(e.Leases("silent")) != 1 {
		t.Fatal("a Lease stale for 2 minutes was deleted; want it kept until an hour")
	}
	e.Clock.Step(DefaultLeaseGCAfter)
	e.Pass(pool)
	if n := len(e.Leases("silent")); n != 0 {
		t.Fatalf("%d demand Leases left after an hour without renewal, want none", n)
	}
}

// TestLeaseOutsideTheDemandNamespaceIsNoDemand: a Lease labelled for the pool but written
// in the pool's own namespace (anyone with write access to Leases there could) counts for
// nothing, nor is it collected; one in the demand namespace labelled for a pool of the
// same name in another namespace counts for that pool only; the pool's own Lease in the
// demand namespace counts.
func TestLeaseOutsideTheDemandNamespaceIsNoDemand(t *testing.T) {
	e := newSyncEnv(t)
	pool := e.CreatePool("elsewhere", Autoscaling(0, 5, 10))
	e.Available(pool, 1)
	e.DemandIn(e.NS, "elsewhere", "egress-gw-0", demand.Measure{Sessions: 40})
	other := demand.Lease(e.DemandNS, types.NamespacedName{Namespace: "another-team", Name: "elsewhere"}, demand.KindGateway, "egress-gw-1",
		demand.Measure{Sessions: 40}, e.Clock.Now())
	if err := e.C.Apply(e.Ctx, other, client.FieldOwner(demand.FieldManager), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	// No demand at all (not 40 sessions, not unknown): held at 1 by the delay, then 0.
	e.Pass(pool)
	if c := Scaling(pool); replicas(pool) != 1 || c.Reason != v1alpha1.PoolReasonHeldByDelay || !pool.Status.Autoscaling.Demand.Sessions.IsZero() {
		t.Fatalf("with demand Leases only in the pool's namespace and for another namespace's pool: %d replicas, %s %q, demand %+v; want 1 held by the delay, no demand",
			replicas(pool), c.Reason, c.Message, pool.Status.Autoscaling.Demand)
	}
	e.Clock.Step(autoscale.DefaultScaleDownDelay)
	e.Pass(pool)
	if c := Scaling(pool); replicas(pool) != 0 || c.Reason != v1alpha1.PoolReasonScaledDown {
		t.Fatalf("a delay later: %d replicas, %s %q; want 0, ScaledDown", replicas(pool), c.Reason, c.Message)
	}
	// The autoscaler collects in the demand namespace only.
	e.Clock.Step(DefaultLeaseGCAfter + time.Minute)
	e.Pass(pool)
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: demand.LeaseName(client.ObjectKeyFromObject(pool), "egress-gw-0")}, &coordinationv1.Lease{}); err != nil {
		t.Fatalf("the Lease in the pool's namespace: %v; want it left alone", err)
	}
	e.Available(pool, 0)
	e.Demand("elsewhere", "egress-gw-2", demand.Measure{Held: 1})
	e.Pass(pool)
	if c := Scaling(pool); replicas(pool) != 1 || c.Reason != v1alpha1.PoolReasonScaledUp {
		t.Fatalf("one held request in the demand namespace's Lease: %d replicas, %s %q; want 1, ScaledUp", replicas(pool), c.Reason, c.Message)
	}
}

// TestFreshLeaseRequeuesWhenItGoesStale: the pass looks again when a fresh Lease would go
// stale, since nothing else would wake it then.
func TestFreshLeaseRequeuesWhenItGoesStale(t *testing.T) {
	e := newSyncEnv(t)
	pool := e.CreatePool("fresh", Autoscaling(1, 5, 10))
	e.Available(pool, 1)
	e.gateways("fresh", 1, 5)
	e.Clock.Step(30 * time.Second)
	res := e.Pass(pool)
	if want := autoscale.DefaultStaleAfter - 30*time.Second + time.Second; res.RequeueAfter != want {
		t.Fatalf("requeue after %s, want %s (when the 30 s old Lease goes stale)", res.RequeueAfter, want)
	}
}

// The watches map a demand Lease, an HPA and a ScaledObject to the pool they name.
func TestWatchesMapToThePool(t *testing.T) {
	want := "ns/crawl"
	one := func(what string, got []reconcileRequest) {
		t.Helper()
		if len(got) != 1 || got[0].String() != want {
			t.Errorf("%s maps to %v, want %s", what, got, want)
		}
	}
	ctx := context.Background()
	// The pool's namespace is the label's, not the Lease's (the demand namespace).
	one("a demand Lease", leasePool(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "operator", Name: "ns.crawl.demand.gw",
		Labels: map[string]string{demand.LabelFor: "crawl", demand.LabelNamespace: "ns"}}}))
	hpa := func(apiVersion, kind string) *autoscalingv2.HorizontalPodAutoscaler {
		return &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "h"},
			Spec: autoscalingv2.HorizontalPodAutoscalerSpec{ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: apiVersion, Kind: kind, Name: "crawl"}}}
	}
	one("an HPA on the pool", hpaPool(ctx, hpa("egress.hrajfrisbee.cz/v1alpha1", "ProxyPool")))
	for _, h := range []*autoscalingv2.HorizontalPodAutoscaler{hpa("apps/v1", "Deployment"), hpa("other.example/v1", "ProxyPool")} {
		if got := hpaPool(ctx, h); len(got) != 0 {
			t.Errorf("an HPA on %s %s maps to %v, want nothing", h.Spec.ScaleTargetRef.APIVersion, h.Spec.ScaleTargetRef.Kind, got)
		}
	}
	so := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"namespace": "ns", "name": "k"},
		"spec": map[string]any{"scaleTargetRef": map[string]any{"kind": "ProxyPool", "name": "crawl"}}}}
	one("a ScaledObject on the pool", scaledObjectPool(ctx, so))
	if got := leasePool(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "node"}}); len(got) != 0 {
		t.Errorf("a Lease without the demand-for label maps to %v", got)
	}
	if got := leasePool(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "crawl.demand.gw",
		Labels: map[string]string{demand.LabelFor: "crawl"}}}); len(got) != 0 {
		t.Errorf("a Lease without the demand-namespace label maps to %v", got)
	}
}

// The condition's reasons in the API are the decision core's.
func TestReasonsAreTheCoresReasons(t *testing.T) {
	for api, core := range map[string]string{
		v1alpha1.PoolReasonScaledUp: autoscale.ReasonScaledUp, v1alpha1.PoolReasonScaledDown: autoscale.ReasonScaledDown,
		v1alpha1.PoolReasonWithinTarget: autoscale.ReasonWithinTarget, v1alpha1.PoolReasonHeldByDelay: autoscale.ReasonHeldByDelay,
		v1alpha1.PoolReasonHeldByStep: autoscale.ReasonHeldByStep, v1alpha1.PoolReasonBudgetCapped: autoscale.ReasonBudgetCapped,
		v1alpha1.PoolReasonExternalAutoscaler: autoscale.ReasonExternalAutoscaler, v1alpha1.PoolReasonDemandUnknown: autoscale.ReasonDemandUnknown,
		v1alpha1.PoolReasonInvalidSpec: autoscale.ReasonInvalidSpec,
	} {
		if api != core {
			t.Errorf("API reason %q, decision core's %q", api, core)
		}
	}
}
