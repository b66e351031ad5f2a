package autoscaler

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// The package's tests share one API server (controllertest.Main).
var shared = testenv.NewShared()

func TestMain(m *testing.M) { controllertest.Main(m, shared) }

// counts counts the API requests a client makes.
type counts struct{ reads, writes atomic.Int64 }

// countingClient wraps c, counting its reads and writes into n.
func countingClient(c client.Client, n *counts) client.Client {
	read := func() { n.reads.Add(1) }
	write := func() { n.writes.Add(1) }
	return interceptor.NewClient(controllertest.NoWatch{Client: c}, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			read()
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			read()
			return c.List(ctx, list, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			write()
			return c.Patch(ctx, obj, patch, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			write()
			return c.Delete(ctx, obj, opts...)
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			write()
			return c.Apply(ctx, obj, opts...)
		},
		SubResourceApply: func(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
			write()
			return c.SubResource(sub).Apply(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			write()
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
}

// syncEnv is the autoscaler alone, on a namespace of its own (and a demand namespace of
// its own for the demand Leases) and a fake clock, with no manager: the test writes the demand Leases (the fake demand source) and the pool's
// available count (as the pool controller would), runs each pass itself
// (controllertest.ExpectReconciled) and asserts what the pass wrote.
type syncEnv struct {
	T   testing.TB
	Ctx context.Context
	C   client.Client
	NS  string
	// DemandNS is the demand namespace: the Leases are written there, the pools are in NS.
	DemandNS string
	Clock    *clocktesting.FakeClock
	R        *Reconciler
	// N counts the autoscaler's requests.
	N *counts
}

func newSyncEnv(t testing.TB) *syncEnv {
	t.Helper()
	env := shared.Env(t)
	ctx := testenv.Context(t)
	// A whole second: the status keeps times to the second.
	clk := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	n := &counts{}
	dns := env.Namespace(t, ctx, "demand")
	r := &Reconciler{Client: countingClient(env.Client, n), Clock: clk, DemandNamespace: dns}
	return &syncEnv{T: t, Ctx: ctx, C: env.Client, NS: env.Namespace(t, ctx, "autoscale"), DemandNS: dns, Clock: clk, R: r, N: n}
}

// Autoscaling is a spec.autoscaling with a target of sessions per child.
func Autoscaling(minR, maxR, sessionsPerChild int32, change ...func(*v1alpha1.PoolAutoscaling)) *v1alpha1.PoolAutoscaling {
	a := &v1alpha1.PoolAutoscaling{MinReplicas: &minR, MaxReplicas: maxR,
		Target: v1alpha1.PoolAutoscalingTarget{SessionsPerReplica: &sessionsPerChild}}
	for _, c := range change {
		c(a)
	}
	return a
}

// NewAutoscaledPool is a pool with spec.autoscaling a and no spec.replicas (the API
// server defaults it to 1).
func NewAutoscaledPool(ns, name string, a *v1alpha1.PoolAutoscaling) *v1alpha1.ProxyPool {
	pool := controllertest.NewPool(ns, name, 0)
	pool.Spec.Replicas = nil
	pool.Spec.Autoscaling = a
	return pool
}

// CreatePool creates NewAutoscaledPool(name, a) with change applied first.
func (e *syncEnv) CreatePool(name string, a *v1alpha1.PoolAutoscaling, change ...func(*v1alpha1.ProxyPool)) *v1alpha1.ProxyPool {
	e.T.Helper()
	pool := NewAutoscaledPool(e.NS, name, a)
	for _, c := range change {
		c(pool)
	}
	if err := e.C.Create(e.Ctx, pool); err != nil {
		e.T.Fatalf("creating pool %s: %v", name, err)
	}
	return pool
}

// Demand writes source's demand Lease for pool, measured now, as a gateway replica does:
// in the demand namespace.
func (e *syncEnv) Demand(pool, source string, m demand.Measure) {
	e.T.Helper()
	e.DemandIn(e.DemandNS, pool, source, m)
}

// DemandIn writes source's demand Lease for pool (in NS), measured now, in namespace ns.
func (e *syncEnv) DemandIn(ns, pool, source string, m demand.Measure) {
	e.T.Helper()
	l := demand.Lease(ns, types.NamespacedName{Namespace: e.NS, Name: pool}, demand.KindGateway, source, m, e.Clock.Now())
	if err := e.C.Apply(e.Ctx, l, client.FieldOwner(demand.FieldManager), client.ForceOwnership); err != nil {
		e.T.Fatalf("writing the demand of %s from %s: %v", pool, source, err)
	}
}

// Available sets the pool's status.availableReplicas, as the pool controller does.
func (e *syncEnv) Available(pool *v1alpha1.ProxyPool, n int32) {
	e.T.Helper()
	type avail struct {
		AvailableReplicas int32 `json:"availableReplicas"`
	}
	if err := statusapply.Status(e.Ctx, e.C, pool, &avail{AvailableReplicas: n}, statusapply.ProxyPoolController); err != nil {
		e.T.Fatalf("setting %d available children of pool %s: %v", n, pool.Name, err)
	}
}

// Pass runs one pass of the autoscaler for pool and reads the pool back.
func (e *syncEnv) Pass(pool *v1alpha1.ProxyPool) ctrl.Result {
	e.T.Helper()
	return controllertest.ExpectReconciled(e.T, e.Ctx, e.C, e.R, pool)
}

// Scaling is the pool's Scaling condition (empty when it has none).
func Scaling(pool *v1alpha1.ProxyPool) metav1.Condition {
	if c := meta.FindStatusCondition(pool.Status.Conditions, v1alpha1.PoolConditionScaling); c != nil {
		return *c
	}
	return metav1.Condition{}
}

func replicas(pool *v1alpha1.ProxyPool) int32 {
	if pool.Spec.Replicas == nil {
		return -1
	}
	return *pool.Spec.Replicas
}

// Leases lists the demand Leases of pool (in the demand namespace).
func (e *syncEnv) Leases(pool string) []coordinationv1.Lease {
	e.T.Helper()
	list := &coordinationv1.LeaseList{}
	if err := e.C.List(e.Ctx, list, client.InNamespace(e.DemandNS), client.MatchingLabels(demand.Selector(types.NamespacedName{Namespace: e.NS, Name: pool}))); err != nil {
		e.T.Fatal(err)
	}
	return list.Items
}

// HPA creates an autoscaling/v2 HorizontalPodAutoscaler named name whose scaleTargetRef is
// the ProxyPool pool.
func (e *syncEnv) HPA(name, pool string) *autoscalingv2.HorizontalPodAutoscaler {
	e.T.Helper()
	h := &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: e.NS, Name: name},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: pool},
			MaxReplicas:    5,
		}}
	if err := e.C.Create(e.Ctx, h); err != nil {
		e.T.Fatalf("creating HorizontalPodAutoscaler %s: %v", name, err)
	}
	return h
}

// InstallScaledObjectCRD installs a stand-in for KEDA's ScaledObject CRD (its group,
// version and kind, any spec) on the API server, once.
func (e *syncEnv) InstallScaledObjectCRD() {
	e.T.Helper()
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "scaledobjects.keda.sh"},
		"spec": map[string]any{
			"group": "keda.sh", "scope": "Namespaced",
			"names": map[string]any{"plural": "scaledobjects", "singular": "scaledobject", "kind": "ScaledObject", "listKind": "ScaledObjectList"},
			"versions": []any{map[string]any{"name": "v1alpha1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
		},
	}}
	if err := e.C.Create(e.Ctx, crd); err != nil && !apierrors.IsAlreadyExists(err) {
		e.T.Fatalf("installing the ScaledObject CRD: %v", err)
	}
}

// ScaledObject creates a KEDA ScaledObject named name whose scaleTargetRef is the
// ProxyPool pool, once the API server serves the kind.
func (e *syncEnv) ScaledObject(name, pool string) {
	e.T.Helper()
	testenv.WaitFor(e.T, testutil.WaitLong, "the API server to serve keda.sh/v1alpha1 ScaledObject", func() (bool, error) {
		so := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
			"metadata": map[string]any{"namespace": e.NS, "name": name},
			"spec": map[string]any{"scaleTargetRef": map[string]any{"apiVersion": v1alpha1.GroupVersion.String(), "kind": "ProxyPool", "name": pool},
				"triggers": []any{map[string]any{"type": "prometheus", "metadata": map[string]any{"query": "sum(proxy_operator_pool_demand_sessions)", "threshold": "10"}}}},
		}}
		err := e.C.Create(e.Ctx, so)
		return err == nil, err
	})
}

type reconcileRequest = reconcile.Request

// demandSeries lists the demand metrics the manager's registry holds for the pool ns/pool.
func demandSeries(t testing.TB, ns, pool string) []string {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "proxy_operator_pool_demand_") {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == ns && labels["pool"] == pool {
				out = append(out, fmt.Sprintf("%s=%g", f.GetName(), m.GetGauge().GetValue()))
			}
		}
	}
	sort.Strings(out)
	return out
}
