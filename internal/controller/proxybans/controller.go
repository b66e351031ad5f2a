package proxybans

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
)

// saturatedShown is how many saturated sites the Saturated condition's message names.
const saturatedShown = 5

var (
	poolCoolingPairs = common.PoolGauge(prometheus.GaugeOpts{Name: "proxy_operator_pool_cooling_pairs",
		Help: "(proxy, site) pairs of the pool's children cooling now: the sum of their status.coolingSites."})
	poolSaturatedSites = common.PoolGauge(prometheus.GaugeOpts{Name: "proxy_operator_pool_saturated_sites",
		Help: "Sites for which more of the pool's serving children are cooling than maxCoolingPercent allows (status.saturatedSites)."})
	proxyRetirements = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_proxy_retirements_total",
		Help: "Proxies retired (cordoned) because crawlers reported them banned on retireAfterSites sites within the retirement window; pool is empty for a standalone Proxy."},
		[]string{"namespace", "pool"})
)

func init() {
	metrics.Registry.MustRegister(poolCoolingPairs, poolSaturatedSites, proxyRetirements)
}

// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxies;proxypools,verbs=get;list;watch
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxies,verbs=patch
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxies/status;proxypools/status,verbs=get;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// BansReconciler acts, on the leader alone, on what crawlers reported into the Proxies'
// status.cooldowns (internal/bans.Recorder writes them on every replica). For each Proxy
// it keeps status.coolingSites and the Retired condition, and retires a standalone proxy
// banned on too many sites: it sets the cordon and retired annotations and records a
// Warning event. For each ProxyPool it keeps status.saturatedSites and the Saturated
// condition, and retires the children banned on too many sites within the pool's
// retirement budget (budget.go), kept in status.retirements; the pool then replaces
// a cordoned child as it replaces any (surge-first). Its status fields are applied under
// the proxy-bans field manager.
type BansReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Policy is that of standalone Proxies and the default of pools' spec.bans.
	Policy bans.Policy
	// MaxCoolingPercent is the saturation threshold of pools without
	// spec.bans.maxCoolingPercent; 0 or less means bans.DefaultMaxCoolingPercent.
	MaxCoolingPercent int
	// MaxRetirementsPerHour is the retirement budget of pools without
	// spec.bans.maxRetirementsPerHour; nil means bans.DefaultMaxRetirementsPerHour.
	MaxRetirementsPerHour *intstr.IntOrString
	Clock                 clock.Clock
}

// SetupWithManager adds two controllers: proxy-bans (Proxies) and proxypool-saturation
// (ProxyPools, woken by their children's cooldowns and serving state).
func (r *BansReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if err := ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.Proxy{}, builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
			return proxyBansChanged(e.ObjectOld.(*v1alpha1.Proxy), e.ObjectNew.(*v1alpha1.Proxy))
		}})).
		Named("proxy-bans").
		Complete(reconcile.Func(r.reconcileProxy)); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.ProxyPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1alpha1.Proxy{}, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &v1alpha1.ProxyPool{}, handler.OnlyControllerOwner()),
			builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				o, n := e.ObjectOld.(*v1alpha1.Proxy), e.ObjectNew.(*v1alpha1.Proxy)
				return !equality.Semantic.DeepEqual(o.Status.Cooldowns, n.Status.Cooldowns) || serving(o) != serving(n)
			}})).
		Named("proxypool-saturation").
		Complete(reconcile.Func(r.reconcilePool))
}

// proxyBansChanged: the cooldowns, the cordon or retired annotations, or what this
// controller writes changed.
func proxyBansChanged(o, n *v1alpha1.Proxy) bool {
	return !equality.Semantic.DeepEqual(o.Status.Cooldowns, n.Status.Cooldowns) ||
		o.Status.CoolingSites != n.Status.CoolingSites ||
		o.Annotations[v1alpha1.CordonAnnotation] != n.Annotations[v1alpha1.CordonAnnotation] ||
		o.Annotations[v1alpha1.RetiredAnnotation] != n.Annotations[v1alpha1.RetiredAnnotation] ||
		!equality.Semantic.DeepEqual(meta.FindStatusCondition(o.Status.Conditions, v1alpha1.ConditionRetired),
			meta.FindStatusCondition(n.Status.Conditions, v1alpha1.ConditionRetired))
}

// serving: discovery hands the proxy out (bans.HandedOut).
func serving(px *v1alpha1.Proxy) bool { return bans.HandedOut(px) }

// proxyBansStatus is the part of a Proxy's status proxy-bans owns.
type proxyBansStatus struct {
	CoolingSites int32              `json:"coolingSites,omitempty"`
	Conditions   []metav1.Condition `json:"conditions,omitempty"`
}

// poolBansStatus is the part of a ProxyPool's status proxy-bans owns.
type poolBansStatus struct {
	SaturatedSites int32                     `json:"saturatedSites,omitempty"`
	Retirements    *v1alpha1.PoolRetirements `json:"retirements,omitempty"`
	Conditions     []metav1.Condition        `json:"conditions,omitempty"`
}

// conditionOf keeps the condition of type t of conds, nil when there is none.
func conditionOf(conds []metav1.Condition, t string) []metav1.Condition {
	if c := meta.FindStatusCondition(conds, t); c != nil {
		return []metav1.Condition{*c}
	}
	return nil
}

func (r *BansReconciler) reconcileProxy(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	px := &v1alpha1.Proxy{}
	if err := r.Client.Get(ctx, req.NamespacedName, px); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !px.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	now := r.Clock.Now()
	cds := px.Status.Cooldowns
	// A pool's children are retired by the pool's pass, within its budget.
	if px.Annotations[v1alpha1.RetiredAnnotation] == "" && !isPoolChild(px) {
		if sites, ok := bans.Retire(cds, now, r.Policy); ok {
			if err := r.retire(ctx, px, sites, r.Policy, now); err != nil {
				return reconcile.Result{}, err
			}
		}
	}
	want := &proxyBansStatus{CoolingSites: int32(bans.CoolingSites(cds, now))}
	if reason := px.Annotations[v1alpha1.RetiredAnnotation]; reason != "" && px.Annotations[v1alpha1.CordonAnnotation] == "true" {
		want.Conditions = conditionOf(px.Status.Conditions, v1alpha1.ConditionRetired)
		meta.SetStatusCondition(&want.Conditions, metav1.Condition{Type: v1alpha1.ConditionRetired, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonBannedOnManySites, Message: reason, ObservedGeneration: px.Generation})
	}
	have := &proxyBansStatus{CoolingSites: px.Status.CoolingSites, Conditions: conditionOf(px.Status.Conditions, v1alpha1.ConditionRetired)}
	if !equality.Semantic.DeepEqual(want, have) {
		if err := statusapply.Status(ctx, r.Client, px.DeepCopy(), want, statusapply.ProxyBans); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("applying the cooling sites of proxy %s: %w", req.NamespacedName, err))
		}
	}
	// Count again when the next cooldown ends.
	if next := bans.NextEnd(cds, now); !next.IsZero() {
		return reconcile.Result{RequeueAfter: next.Sub(now)}, nil
	}
	return reconcile.Result{}, nil
}

// retire cordons px with the retired annotation saying why, by a patch that holds only
// if px is still the version read (a retirement the cache has not seen yet is not made
// twice), and records a Warning event.
func (r *BansReconciler) retire(ctx context.Context, px *v1alpha1.Proxy, sites []string, p bans.Policy, now time.Time) error {
	shown := sites
	if len(shown) > 10 {
		shown = append(slices.Clone(shown[:10]), "...")
	}
	reason := fmt.Sprintf("banned on %d sites within %s (retireAfterSites %d), retired at %s: %s",
		len(sites), p.RetireWindow, p.RetireAfterSites, now.UTC().Format(time.RFC3339), strings.Join(shown, ", "))
	base := px.DeepCopy()
	if px.Annotations == nil {
		px.Annotations = map[string]string{}
	}
	px.Annotations[v1alpha1.CordonAnnotation] = "true"
	px.Annotations[v1alpha1.RetiredAnnotation] = reason
	if err := r.Client.Patch(ctx, px, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}),
		client.FieldOwner(statusapply.ProxyBans)); err != nil {
		return fmt.Errorf("retiring proxy %s/%s (%s): %w", px.Namespace, px.Name, reason, err)
	}
	pool, _ := v1alpha1.ControllingPool(px)
	proxyRetirements.WithLabelValues(px.Namespace, pool.Name).Inc()
	if r.Recorder != nil {
		r.Recorder.Eventf(px, nil, corev1.EventTypeWarning, v1alpha1.ConditionRetired, "Retire", "Cordoned: %s", reason)
	}
	ctrl.LoggerFrom(ctx).Info("retired a proxy banned on too many sites", "proxy", client.ObjectKeyFromObject(px), "sites", len(sites))
	return nil
}

// siteCount is how many of a pool's serving children cool for a site.
type siteCount struct {
	site    string
	cooling int
}

func (r *BansReconciler) reconcilePool(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pool := &v1alpha1.ProxyPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			poolCoolingPairs.DeleteLabelValues(req.Namespace, req.Name)
			poolSaturatedSites.DeleteLabelValues(req.Namespace, req.Name)
			poolRetirementsHeldBack.DeleteLabelValues(req.Namespace, req.Name)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if !pool.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	var list v1alpha1.ProxyList
	if err := r.Client.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{v1alpha1.PoolLabel: pool.Name}); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing the children of proxy pool %s: %w", req.NamespacedName, err)
	}
	now := r.Clock.Now()
	pairs, matched := 0, 0
	perSite := map[string]int{}
	var next time.Time
	var kids []*v1alpha1.Proxy
	for i := range list.Items {
		px := &list.Items[i]
		if ref := metav1.GetControllerOfNoCopy(px); ref == nil || ref.UID != pool.UID {
			continue
		}
		kids = append(kids, px)
		pairs += bans.CoolingSites(px.Status.Cooldowns, now)
		if !serving(px) {
			continue
		}
		matched++
		for _, c := range px.Status.Cooldowns {
			if now.Before(c.Until.Time) {
				perSite[c.Site]++
			}
		}
		if n := bans.NextEnd(px.Status.Cooldowns, now); !n.IsZero() && (next.IsZero() || n.Before(next)) {
			next = n
		}
	}
	pct := r.MaxCoolingPercent
	if pct <= 0 {
		pct = bans.DefaultMaxCoolingPercent
	}
	if b := pool.Spec.Bans; b != nil && b.MaxCoolingPercent != nil {
		pct = int(*b.MaxCoolingPercent)
	}
	var saturated []siteCount
	for site, n := range perSite {
		if bans.Saturated(n, matched, pct) {
			saturated = append(saturated, siteCount{site, n})
		}
	}
	slices.SortFunc(saturated, func(a, b siteCount) int {
		return cmp.Or(cmp.Compare(b.cooling, a.cooling), strings.Compare(a.site, b.site))
	})
	poolCoolingPairs.WithLabelValues(pool.Namespace, pool.Name).Set(float64(pairs))
	poolSaturatedSites.WithLabelValues(pool.Namespace, pool.Name).Set(float64(len(saturated)))

	pass, err := r.planPoolRetirements(pool, kids, now)
	if err != nil {
		return reconcile.Result{}, err
	}
	want := &poolBansStatus{SaturatedSites: int32(len(saturated)), Retirements: pass.status,
		Conditions: conditionOf(pool.Status.Conditions, v1alpha1.PoolConditionSaturated)}
	cond := metav1.Condition{Type: v1alpha1.PoolConditionSaturated, Status: metav1.ConditionFalse, Reason: v1alpha1.PoolReasonNoSiteSaturated,
		Message: fmt.Sprintf("no site has more than %d%% of the %d serving children cooling for it", pct, matched), ObservedGeneration: pool.Generation}
	if len(saturated) > 0 {
		shown := make([]string, 0, saturatedShown)
		for _, s := range saturated[:min(len(saturated), saturatedShown)] {
			shown = append(shown, fmt.Sprintf("%s (%d)", s.site, s.cooling))
		}
		more := ""
		if len(saturated) > saturatedShown {
			more = fmt.Sprintf(" and %d more", len(saturated)-saturatedShown)
		}
		cond.Status, cond.Reason = metav1.ConditionTrue, v1alpha1.PoolReasonSitesSaturated
		cond.Message = fmt.Sprintf("%d sites have more than %d%% of the %d serving children cooling for them, discovery answers 503 for them: %s%s",
			len(saturated), pct, matched, strings.Join(shown, ", "), more)
	}
	meta.SetStatusCondition(&want.Conditions, cond)
	have := &poolBansStatus{SaturatedSites: pool.Status.SaturatedSites, Retirements: pool.Status.Retirements,
		Conditions: conditionOf(pool.Status.Conditions, v1alpha1.PoolConditionSaturated)}
	if !equality.Semantic.DeepEqual(want, have) {
		// Retirements are recorded before they are made, and only on the version they
		// were counted from: a write from a stale copy of the pool (the cache behind
		// this controller's own last write) is refused rather than spend the budget
		// again or drop a recorded retirement.
		if err := statusapply.Status(ctx, r.Client, pool.DeepCopy(), want, statusapply.ProxyBans, statusapply.IfVersion(pool.ResourceVersion)); err != nil {
			if apierrors.IsConflict(err) { // read again, once the cache has the pool's new version
				return reconcile.Result{RequeueAfter: time.Second}, nil
			}
			return reconcile.Result{}, client.IgnoreNotFound(fmt.Errorf("applying the saturated sites and retirements of proxy pool %s: %w", req.NamespacedName, err))
		}
	}
	var heldBefore int32
	if st := pool.Status.Retirements; st != nil {
		heldBefore = st.HeldBack
	}
	if err := r.carryOut(ctx, pool, pass, heldBefore, now); err != nil {
		if apierrors.IsConflict(err) { // a child's copy older than its retirement: read again
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{}, err
	}
	// Look again when the budget frees, for the children it holds back.
	if st := pass.status; st != nil && st.NextFreeAt != nil && (next.IsZero() || st.NextFreeAt.Time.Before(next)) {
		next = st.NextFreeAt.Time
	}
	if !next.IsZero() {
		return reconcile.Result{RequeueAfter: next.Sub(now)}, nil
	}
	return reconcile.Result{}, nil
}

// isPoolChild: a ProxyPool controls px.
func isPoolChild(px *v1alpha1.Proxy) bool {
	_, ok := v1alpha1.ControllingPool(px)
	return ok
}
