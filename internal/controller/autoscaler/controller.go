// Package autoscaler is the controller that sizes the ProxyPools with spec.autoscaling
// from their measured demand. Each pass gathers the pool's spec, spec.replicas,
// status.availableReplicas, the demand Leases the measurers write (internal/demand), and
// the HorizontalPodAutoscalers and KEDA ScaledObjects that target the pool; asks
// internal/autoscale what the pool should have; writes spec.replicas (a merge patch of
// that field alone, under the egress-proxies-autoscaler field manager); applies
// status.autoscaling and the Scaling condition under the same field manager; and looks
// again when the decision says.
package autoscaler

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/autoscale"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
)

// FieldManager is the autoscaler's field manager: for spec.replicas, and for
// status.autoscaling and the Scaling condition.
const FieldManager = statusapply.Autoscaler

// Defaults of the Reconciler's knobs.
const (
	// DefaultStatusInterval is the least time between two status writes that change
	// nothing but the demand's numbers (a decision's change is written at once).
	DefaultStatusInterval = 30 * time.Second
	// DefaultLeaseGCAfter: a demand Lease not renewed for this long is deleted.
	DefaultLeaseGCAfter = time.Hour
)

// ScaledObjectGVK is KEDA's ScaledObject, read as unstructured when its CRD is installed.
var ScaledObjectGVK = schema.GroupVersionKind{Group: "keda.sh", Version: "v1alpha1", Kind: "ScaledObject"}

var (
	demandSessions = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "proxy_operator_pool_demand_sessions",
		Help: "Concurrent sessions (open tunnels, live sessions) to the pool, summed over its measurers' fresh reports: the demand the autoscaler acted on."},
		[]string{"namespace", "pool"})
	demandHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "proxy_operator_pool_demand_held",
		Help: "Requests held waiting for one of the pool's children, summed over its measurers' fresh reports."},
		[]string{"namespace", "pool"})
	demandRate = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "proxy_operator_pool_demand_requests_per_second",
		Help: "Requests per second to the pool, summed over its measurers' fresh reports."},
		[]string{"namespace", "pool"})
)

func init() { metrics.Registry.MustRegister(demandSessions, demandHeld, demandRate) }

// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxypools,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxypools/status,verbs=get;patch
// +kubebuilder:rbac:groups=autoscaling,resources=horizontalpodautoscalers,verbs=get;list;watch
// +kubebuilder:rbac:groups=keda.sh,resources=scaledobjects,verbs=get;list;watch

// CostFunc says what one child of pool costs per hour, in the currency of spec.budget;
// false when that is not known (then the budget makes no cap).
type CostFunc func(ctx context.Context, pool *v1alpha1.ProxyPool) (hourly float64, known bool)

// Reconciler is the autoscaler.
type Reconciler struct {
	// Client reads the pools, their demand Leases and the HorizontalPodAutoscalers, and
	// writes spec.replicas and the status.
	Client client.Client
	// DemandNamespace is the demand namespace: the only namespace whose demand Leases
	// count (internal/demand; a Lease names its pool by its labels). Required.
	DemandNamespace string
	// External reads the KEDA ScaledObjects (nil: Client); ScaledObjects says whether
	// their CRD is installed (SetupWithManager finds out).
	External      client.Reader
	ScaledObjects bool
	// Clock: nil is the real clock.
	Clock clock.PassiveClock
	// CostPerChild gives a child's hourly cost for spec.budget; nil: unknown, so the
	// budget caps nothing.
	CostPerChild CostFunc
	// StaleAfter: demand older than this is ignored (0: autoscale.DefaultStaleAfter).
	StaleAfter time.Duration
	// StatusInterval and LeaseGCAfter: 0 is the default.
	StatusInterval, LeaseGCAfter time.Duration

	mu sync.Mutex
	// written is when each pool's status was last applied, for StatusInterval.
	written map[types.NamespacedName]time.Time
}

func (r *Reconciler) now() time.Time {
	if r.Clock == nil {
		return time.Now()
	}
	return r.Clock.Now()
}

func (r *Reconciler) staleAfter() time.Duration {
	if r.StaleAfter > 0 {
		return r.StaleAfter
	}
	return autoscale.DefaultStaleAfter
}

// scalingStatus is the part of a pool's status the autoscaler owns.
type scalingStatus struct {
	Autoscaling *v1alpha1.PoolAutoscalingStatus `json:"autoscaling,omitempty"`
	Conditions  []metav1.Condition              `json:"conditions,omitempty"`
}

// Reconcile runs one pass for a pool.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pool := &v1alpha1.ProxyPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if client.IgnoreNotFound(err) == nil {
			r.forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	now := r.now()
	if pool.Spec.Autoscaling == nil || !pool.DeletionTimestamp.IsZero() {
		r.forget(req.NamespacedName)
		// Without spec.autoscaling the pool has no Scaling condition nor
		// status.autoscaling: applying nothing removes what the autoscaler wrote.
		if pool.Spec.Autoscaling == nil && statusapply.Applied(pool, FieldManager) && !(scalingStatus{}).equal(r.have(pool)) {
			if err := statusapply.Status(ctx, r.Client, pool, &scalingStatus{}, FieldManager); err != nil {
				return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("clearing the autoscaling status of pool %s: %w", req.NamespacedName, err))
			}
		}
		return reconcile.Result{}, nil
	}

	leases, err := r.leases(ctx, pool, now)
	if err != nil {
		return reconcile.Result{}, err
	}
	external, err := r.externalAutoscalers(ctx, pool)
	if err != nil {
		return reconcile.Result{}, err
	}
	in := r.input(ctx, pool, leases, external, now)
	d := autoscale.Decide(in)

	want := r.want(pool, d, now)
	if err := r.writeStatus(ctx, pool, want, now); err != nil {
		return reconcile.Result{}, err
	}
	if d.Decided && d.Replicas != in.Replicas {
		if err := r.scale(ctx, pool, d.Replicas); err != nil {
			return reconcile.Result{}, err
		}
		log.FromContext(ctx).Info("scaled", "from", in.Replicas, "to", d.Replicas, "reason", d.Reason, "message", d.Message)
	}
	r.export(req.NamespacedName, d.Demand)
	return reconcile.Result{RequeueAfter: r.next(pool, d, leases, now)}, nil
}

// leases lists the pool's demand Leases (in the demand namespace, labelled for the pool),
// deleting those not renewed for LeaseGCAfter.
func (r *Reconciler) leases(ctx context.Context, pool *v1alpha1.ProxyPool, now time.Time) ([]coordinationv1.Lease, error) {
	if r.DemandNamespace == "" {
		return nil, fmt.Errorf("listing the demand Leases of pool %s/%s: the autoscaler has no demand namespace", pool.Namespace, pool.Name)
	}
	list := &coordinationv1.LeaseList{}
	if err := r.Client.List(ctx, list, client.InNamespace(r.DemandNamespace), client.MatchingLabels(demand.Selector(client.ObjectKeyFromObject(pool)))); err != nil {
		return nil, fmt.Errorf("listing the demand Leases of pool %s/%s in the demand namespace %s: %w", pool.Namespace, pool.Name, r.DemandNamespace, err)
	}
	gc := r.LeaseGCAfter
	if gc <= 0 {
		gc = DefaultLeaseGCAfter
	}
	keep := list.Items[:0]
	for i := range list.Items {
		l := &list.Items[i]
		if demand.Stale(l, now, gc) {
			if err := r.Client.Delete(ctx, l, client.Preconditions{ResourceVersion: &l.ResourceVersion}); client.IgnoreNotFound(err) != nil {
				log.FromContext(ctx).Error(err, "deleting a stale demand Lease", "lease", l.Name)
			}
			continue
		}
		if _, err := demand.Parse(l); err != nil {
			log.FromContext(ctx).Info("ignoring a demand Lease", "error", err.Error())
		}
		keep = append(keep, *l)
	}
	return keep, nil
}

// externalAutoscalers names the HorizontalPodAutoscalers and KEDA ScaledObjects whose
// scaleTargetRef is the pool ("HorizontalPodAutoscaler ns/name", "ScaledObject ns/name").
func (r *Reconciler) externalAutoscalers(ctx context.Context, pool *v1alpha1.ProxyPool) ([]string, error) {
	var names []string
	hpas := &autoscalingv2.HorizontalPodAutoscalerList{}
	if err := r.Client.List(ctx, hpas, client.InNamespace(pool.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the HorizontalPodAutoscalers of namespace %s: %w", pool.Namespace, err)
	}
	for _, h := range hpas.Items {
		ref := h.Spec.ScaleTargetRef
		if targetsPool(ref.APIVersion, ref.Kind, ref.Name, pool.Name) {
			names = append(names, "HorizontalPodAutoscaler "+h.Namespace+"/"+h.Name)
		}
	}
	if r.ScaledObjects {
		reader := r.External
		if reader == nil {
			reader = r.Client
		}
		sos := &unstructured.UnstructuredList{}
		sos.SetGroupVersionKind(ScaledObjectGVK.GroupVersion().WithKind(ScaledObjectGVK.Kind + "List"))
		if err := reader.List(ctx, sos, client.InNamespace(pool.Namespace)); err != nil {
			return nil, fmt.Errorf("listing the KEDA ScaledObjects of namespace %s: %w", pool.Namespace, err)
		}
		for _, so := range sos.Items {
			if apiVersion, kind, name := scaleTarget(&so); targetsPool(apiVersion, kind, name, pool.Name) {
				names = append(names, "ScaledObject "+so.GetNamespace()+"/"+so.GetName())
			}
		}
	}
	slices.Sort(names)
	return names, nil
}

// scaleTarget is a ScaledObject's spec.scaleTargetRef.
func scaleTarget(so *unstructured.Unstructured) (apiVersion, kind, name string) {
	apiVersion, _, _ = unstructured.NestedString(so.Object, "spec", "scaleTargetRef", "apiVersion")
	kind, _, _ = unstructured.NestedString(so.Object, "spec", "scaleTargetRef", "kind")
	name, _, _ = unstructured.NestedString(so.Object, "spec", "scaleTargetRef", "name")
	return apiVersion, kind, name
}

// targetsPool: a scaleTargetRef names the ProxyPool pool (an apiVersion, when given, of
// the pool's group).
func targetsPool(apiVersion, kind, name, pool string) bool {
	if kind != "ProxyPool" || name != pool {
		return false
	}
	if apiVersion == "" {
		return true
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	return err == nil && gv.Group == v1alpha1.GroupVersion.Group
}

// input gathers what Decide decides from.
func (r *Reconciler) input(ctx context.Context, pool *v1alpha1.ProxyPool, leases []coordinationv1.Lease, external []string, now time.Time) autoscale.Input {
	a := pool.Spec.Autoscaling
	in := autoscale.Input{
		Now:         now,
		Replicas:    1,
		Available:   pool.Status.AvailableReplicas,
		MaxReplicas: a.MaxReplicas,
		WarmSpare:   a.WarmSpare,
		MaxStepUp:   a.MaxStepUp,
		Demand:      demand.Samples(client.ObjectKeyFromObject(pool), leases),
		StaleAfter:  r.staleAfter(),
		// No Lease at all: no measurer has seen demand for the pool (they write none
		// before they do), or its Leases were collected an hour after going stale.
		Idle: len(leases) == 0,
	}
	if pool.Spec.Replicas != nil {
		in.Replicas = *pool.Spec.Replicas
	}
	if a.MinReplicas != nil {
		in.MinReplicas = *a.MinReplicas
	}
	if t := a.Target.SessionsPerReplica; t != nil {
		in.Target.Sessions = float64(*t)
	}
	if t := a.Target.RequestsPerSecondPerReplica; t != nil {
		in.Target.RequestsPerSecond = float64(*t)
	}
	if a.ScaleDownDelay != nil {
		in.ScaleDownDelay = a.ScaleDownDelay.Duration
	}
	if len(external) > 0 {
		in.ExternalAutoscaler = strings.Join(external, ", ")
	}
	if b := pool.Spec.Budget; b != nil && r.CostPerChild != nil {
		if cost, ok := r.CostPerChild(ctx, pool); ok {
			max := b.MaxHourly.Quantity()
			in.Budget = &autoscale.Budget{MaxHourly: max.AsApproximateFloat64(), CostPerChildHourly: cost}
		}
	}
	if st := pool.Status.Autoscaling; st != nil {
		in.State = autoscale.State{LastScaleUp: timeOf(st.LastScaleUpTime), LastScaleDown: timeOf(st.LastScaleDownTime),
			BelowSince: timeOf(st.BelowSince), BelowPeak: st.BelowPeak}
	}
	return in
}

func timeOf(t *metav1.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.Time
}

func metaTime(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	return &metav1.Time{Time: t}
}

// quantity is v to a thousandth.
func quantity(v float64) resource.Quantity {
	return *resource.NewMilliQuantity(int64(math.Round(min(v, math.MaxInt64/1000)*1000)), resource.DecimalSI)
}

// want is the status the decision calls for.
func (r *Reconciler) want(pool *v1alpha1.ProxyPool, d autoscale.Decision, now time.Time) *scalingStatus {
	st := &scalingStatus{Autoscaling: &v1alpha1.PoolAutoscalingStatus{
		DesiredReplicas: d.Replicas,
		Demand: v1alpha1.PoolDemand{Sessions: quantity(d.Demand.Sessions), Held: d.Demand.Held,
			RequestsPerSecond: quantity(d.Demand.RequestsPerSecond), Sources: int32(d.Demand.Sources), StaleSources: int32(d.Demand.Stale)},
		LastScaleUpTime:   metaTime(d.State.LastScaleUp),
		LastScaleDownTime: metaTime(d.State.LastScaleDown),
		BelowSince:        metaTime(d.State.BelowSince),
		BelowPeak:         d.State.BelowPeak,
	}}
	status := metav1.ConditionTrue
	if !d.Decided {
		status = metav1.ConditionFalse
	}
	st.Conditions = r.have(pool).Conditions
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.PoolConditionScaling, Status: status,
		Reason: d.Reason, Message: d.Message, ObservedGeneration: pool.Generation, LastTransitionTime: metav1.NewTime(now)})
	return st
}

// have is the autoscaler's part of the pool's status as it is.
func (r *Reconciler) have(pool *v1alpha1.ProxyPool) *scalingStatus {
	st := &scalingStatus{Autoscaling: pool.Status.Autoscaling}
	if c := meta.FindStatusCondition(pool.Status.Conditions, v1alpha1.PoolConditionScaling); c != nil {
		st.Conditions = []metav1.Condition{*c}
	}
	return st
}

func (s scalingStatus) equal(o *scalingStatus) bool { return equality.Semantic.DeepEqual(&s, o) }

// decisionOf is want without the demand's numbers and the condition's message: what
// changes only with a decision.
func decisionOf(s *scalingStatus) scalingStatus {
	out := scalingStatus{}
	if s.Autoscaling != nil {
		a := *s.Autoscaling
		a.Demand = v1alpha1.PoolDemand{Sources: min(a.Demand.Sources, 1)}
		out.Autoscaling = &a
	}
	for _, c := range s.Conditions {
		out.Conditions = append(out.Conditions, metav1.Condition{Type: c.Type, Status: c.Status, Reason: c.Reason, ObservedGeneration: c.ObservedGeneration})
	}
	return out
}

// writeStatus applies want unless the pool has it already. A change of the decision is
// applied at once; a change of the demand's numbers alone at most once per
// StatusInterval (next tells when).
func (r *Reconciler) writeStatus(ctx context.Context, pool *v1alpha1.ProxyPool, want *scalingStatus, now time.Time) error {
	key := client.ObjectKeyFromObject(pool)
	have := r.have(pool)
	if want.equal(have) {
		return nil
	}
	if decisionOf(want).equal(ptr.To(decisionOf(have))) && !r.statusDue(key, now) {
		return nil
	}
	if err := statusapply.Status(ctx, r.Client, pool, want, FieldManager); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("applying the autoscaling status of pool %s: %w", key, err))
	}
	r.mu.Lock()
	if r.written == nil {
		r.written = map[types.NamespacedName]time.Time{}
	}
	r.written[key] = now
	r.mu.Unlock()
	return nil
}

func (r *Reconciler) statusInterval() time.Duration {
	if r.StatusInterval > 0 {
		return r.StatusInterval
	}
	return DefaultStatusInterval
}

// statusDue: the pool's status was not applied within StatusInterval.
func (r *Reconciler) statusDue(key types.NamespacedName, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	last, ok := r.written[key]
	return !ok || now.Sub(last) >= r.statusInterval()
}

// scale writes spec.replicas alone, by a merge patch under the autoscaler's field manager.
func (r *Reconciler) scale(ctx context.Context, pool *v1alpha1.ProxyPool, replicas int32) error {
	patch := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas)
	if err := r.Client.Patch(ctx, pool, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(FieldManager)); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("scaling pool %s/%s to %d: %w", pool.Namespace, pool.Name, replicas, err))
	}
	return nil
}

// next is when to look again: the decision's time, the time a fresh Lease goes stale (the
// demand then changes with no write to wake the autoscaler), or, when a demand-only
// status change waits for StatusInterval, its end.
func (r *Reconciler) next(pool *v1alpha1.ProxyPool, d autoscale.Decision, leases []coordinationv1.Lease, now time.Time) time.Duration {
	at := d.Next
	earliest := func(t time.Time) {
		if !t.IsZero() && t.After(now) && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	for i := range leases {
		if rt := leases[i].Spec.RenewTime; rt != nil {
			earliest(rt.Add(r.staleAfter() + time.Second))
		}
	}
	r.mu.Lock()
	last, ok := r.written[client.ObjectKeyFromObject(pool)]
	r.mu.Unlock()
	if ok && !r.want(pool, d, now).equal(r.have(pool)) {
		earliest(last.Add(r.statusInterval()))
	}
	if at.IsZero() {
		return 0
	}
	return max(at.Sub(now), time.Second)
}

// export sets the pool's demand metrics.
func (r *Reconciler) export(key types.NamespacedName, d autoscale.Demand) {
	demandSessions.WithLabelValues(key.Namespace, key.Name).Set(d.Sessions)
	demandHeld.WithLabelValues(key.Namespace, key.Name).Set(float64(d.Held))
	demandRate.WithLabelValues(key.Namespace, key.Name).Set(d.RequestsPerSecond)
}

// forget drops a pool that is gone or no longer autoscaled from the metrics and memory.
func (r *Reconciler) forget(key types.NamespacedName) {
	for _, g := range []*prometheus.GaugeVec{demandSessions, demandHeld, demandRate} {
		g.DeleteLabelValues(key.Namespace, key.Name)
	}
	r.mu.Lock()
	delete(r.written, key)
	r.mu.Unlock()
}
