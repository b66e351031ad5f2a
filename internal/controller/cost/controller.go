// Package cost keeps what each Proxy and each ProxyPool costs per hour in their status
// (status.cost), and in two gauges, by the prices of the providers config
// (provider.ProviderConfig.PriceTable: a type's default table under the entry's own
// prices). Its fields are applied under the egress-proxies-cost field manager.
//
// A Managed Proxy costs, while it has an instance (status.providerID), the price of its
// provider's machine type for placement.machineType plus one external IPv4 address where
// the provider gives it one (gce unless gce.externalIP is false, hcloud always). A Proxy
// without an instance, an External one, or one whose provider has no price for its
// machine type (kvm2 without a prices block) has no status.cost.
//
// A pool costs the sum of its children that are not being deleted, in their one
// currency; a child without an instance adds nothing. The pool has no status.cost while
// one of those children has an instance without a price (a sum without it would
// understate the pool), or when the children are priced in more than one currency (a
// Warning event CostCurrenciesDiffer says which). A pool without children costs 0 in the
// currency of its template's providers, when they price its machine type.
package cost

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
)

// EventCostCurrenciesDiffer: a pool's children are priced in more than one currency, so
// the pool has no status.cost.
const EventCostCurrenciesDiffer = "CostCurrenciesDiffer"

var (
	proxyCostHourly = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "proxy_operator_proxy_cost_hourly",
		Help: "What the Proxy's instance costs per hour by its provider's prices (status.cost.hourly), in currency."},
		[]string{"namespace", "proxy", "currency"})
	poolCostHourly = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "proxy_operator_pool_cost_hourly",
		Help: "What the pool's children not being deleted cost per hour together (status.cost.hourly), in currency."},
		[]string{"namespace", "pool", "currency"})
)

func init() {
	metrics.Registry.MustRegister(proxyCostHourly, poolCostHourly)
}

// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxies;proxypools,verbs=get;list;watch
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxies/status;proxypools/status,verbs=get;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// CostReconciler writes status.cost of Proxies and ProxyPools (see the package
// documentation).
type CostReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Providers are the entries of the providers config, by name.
	Providers map[string]provider.ProviderConfig

	// warned holds, by pool (namespace/name), the currencies last reported in a
	// CostCurrenciesDiffer event, so that the event is made once per change.
	warned sync.Map
}

// Entries indexes the entries of cfg by name (none for a nil cfg).
func Entries(cfg *provider.Config) map[string]provider.ProviderConfig {
	out := map[string]provider.ProviderConfig{}
	if cfg != nil {
		for _, pc := range cfg.Providers {
			out[pc.Name] = pc
		}
	}
	return out
}

// SetupWithManager adds two controllers: proxy-cost (Proxies) and proxypool-cost
// (ProxyPools, woken by their children's changes that move the sum).
func (r *CostReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.Proxy{}, builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*v1alpha1.Proxy), e.ObjectNew.(*v1alpha1.Proxy)
			return costInputsChanged(o, n) || !equality.Semantic.DeepEqual(o.Status.Cost, n.Status.Cost)
		}})).
		Named("proxy-cost").
		Complete(reconcile.Func(r.ReconcileProxy)); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.ProxyPool{}, builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*v1alpha1.ProxyPool), e.ObjectNew.(*v1alpha1.ProxyPool)
			return o.Generation != n.Generation || !equality.Semantic.DeepEqual(o.Status.Cost, n.Status.Cost)
		}})).
		Watches(&v1alpha1.Proxy{}, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &v1alpha1.ProxyPool{}, handler.OnlyControllerOwner()),
			builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				return costInputsChanged(e.ObjectOld.(*v1alpha1.Proxy), e.ObjectNew.(*v1alpha1.Proxy))
			}})).
		Named("proxypool-cost").
		Complete(reconcile.Func(r.ReconcilePool))
}

// costInputsChanged: what a Proxy's cost is computed from changed (its provider,
// machine type or mode, whether it has an instance, its deletion).
func costInputsChanged(o, n *v1alpha1.Proxy) bool {
	return o.Spec.Provider != n.Spec.Provider || o.Spec.Placement.MachineType != n.Spec.Placement.MachineType ||
		o.Spec.Mode != n.Spec.Mode || (o.Status.ProviderID == "") != (n.Status.ProviderID == "") ||
		o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
}

// costStatus is the part of a status (a Proxy's or a pool's) egress-proxies-cost owns.
type costStatus struct {
	Cost *v1alpha1.Cost `json:"cost,omitempty"`
}

// rate is what px costs per hour while it has an instance: false when it is not Managed
// or its provider has no price for its machine type.
func (r *CostReconciler) rate(px *v1alpha1.Proxy) (v1alpha1.Cost, bool) {
	if px.Spec.Mode != "" && px.Spec.Mode != v1alpha1.ProxyModeManaged {
		return v1alpha1.Cost{}, false
	}
	pc, ok := r.Providers[px.Spec.Provider]
	if !ok {
		return v1alpha1.Cost{}, false
	}
	return pc.Hourly(px.Spec.Placement.MachineType)
}

// billed: px has an instance, which its provider bills.
func billed(px *v1alpha1.Proxy) bool {
	return (px.Spec.Mode == "" || px.Spec.Mode == v1alpha1.ProxyModeManaged) && px.Status.ProviderID != ""
}

// ProxyCost is px's status.cost as the reconciler writes it: its rate while it has an
// instance, nil otherwise or when it has no price.
func (r *CostReconciler) ProxyCost(px *v1alpha1.Proxy) *v1alpha1.Cost {
	if !billed(px) {
		return nil
	}
	if c, ok := r.rate(px); ok {
		return &c
	}
	return nil
}

// ReconcileProxy applies a Proxy's status.cost and sets its gauge.
func (r *CostReconciler) ReconcileProxy(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	px := &v1alpha1.Proxy{}
	if err := r.Client.Get(ctx, req.NamespacedName, px); err != nil {
		if apierrors.IsNotFound(err) {
			proxyCostHourly.DeletePartialMatch(prometheus.Labels{"namespace": req.Namespace, "proxy": req.Name})
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	want := r.ProxyCost(px)
	setGauge(proxyCostHourly, prometheus.Labels{"namespace": px.Namespace, "proxy": px.Name}, want)
	if err := r.apply(ctx, px, px.Status.Cost, want); err != nil {
		return reconcile.Result{}, fmt.Errorf("applying the cost of proxy %s: %w", req.NamespacedName, err)
	}
	return reconcile.Result{}, nil
}

// apply writes want as obj's status.cost unless that is what obj has.
func (r *CostReconciler) apply(ctx context.Context, obj client.Object, have, want *v1alpha1.Cost) error {
	if equality.Semantic.DeepEqual(have, want) {
		return nil
	}
	return client.IgnoreNotFound(statusapply.Status(ctx, r.Client, obj.DeepCopyObject().(client.Object), &costStatus{Cost: want}, statusapply.Cost))
}

// setGauge sets the series of who (its namespace and name) to c in c's currency, and
// deletes its series in any other currency; with c nil, all of its series.
func setGauge(g *prometheus.GaugeVec, who prometheus.Labels, c *v1alpha1.Cost) {
	g.DeletePartialMatch(who)
	if c == nil {
		return
	}
	labels := prometheus.Labels{"currency": c.Currency}
	for k, v := range who {
		labels[k] = v
	}
	q := c.Hourly.Quantity()
	g.With(labels).Set(q.AsApproximateFloat64())
}

// poolSum is what a pool's children add up to.
type poolSum struct {
	total      resource.Quantity
	currencies []string // sorted, without duplicates
	unpriced   []string // children with an instance and no price
}

func (s *poolSum) currency(c string) {
	if !slices.Contains(s.currencies, c) {
		s.currencies = append(s.currencies, c)
		slices.Sort(s.currencies)
	}
}

// ReconcilePool applies a pool's status.cost, the sum of its children's, and sets its
// gauge.
func (r *CostReconciler) ReconcilePool(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pool := &v1alpha1.ProxyPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			poolCostHourly.DeletePartialMatch(prometheus.Labels{"namespace": req.Namespace, "pool": req.Name})
			r.warned.Delete(req.String())
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	var list v1alpha1.ProxyList
	if err := r.Client.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{v1alpha1.PoolLabel: pool.Name}); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing the children of proxy pool %s: %w", req.NamespacedName, err)
	}
	s := r.sum(pool, list.Items)
	want := r.poolCost(ctx, pool, s)
	setGauge(poolCostHourly, prometheus.Labels{"namespace": pool.Namespace, "pool": pool.Name}, want)
	if err := r.apply(ctx, pool, pool.Status.Cost, want); err != nil {
		return reconcile.Result{}, fmt.Errorf("applying the cost of proxy pool %s: %w", req.NamespacedName, err)
	}
	return reconcile.Result{}, nil
}

// sum adds up the children of pool not being deleted; with none priced, the currencies
// are those of the template's providers.
func (r *CostReconciler) sum(pool *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) poolSum {
	var s poolSum
	for i := range kids {
		px := &kids[i]
		if ref := metav1.GetControllerOfNoCopy(px); ref == nil || ref.UID != pool.UID || !px.DeletionTimestamp.IsZero() {
			continue
		}
		c, ok := r.rate(px)
		switch {
		case ok && billed(px):
			s.total.Add(c.Hourly.Quantity())
			s.currency(c.Currency)
		case ok:
			s.currency(c.Currency)
		case billed(px):
			s.unpriced = append(s.unpriced, px.Name)
		}
	}
	if len(s.currencies) > 0 || len(s.unpriced) > 0 {
		return s
	}
	for _, name := range templateProviders(pool) {
		px := &v1alpha1.Proxy{Spec: pool.Spec.Template.Spec}
		px.Spec.Provider = name
		c, ok := r.rate(px)
		if !ok {
			return poolSum{}
		}
		s.currency(c.Currency)
	}
	return s
}

// templateProviders are the providers the pool places children on: the spread entries'
// (the template's for an entry without one), or the template's.
func templateProviders(pool *v1alpha1.ProxyPool) []string {
	var out []string
	for _, e := range pool.Spec.Spread {
		name := e.Provider
		if name == "" {
			name = pool.Spec.Template.Spec.Provider
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		out = append(out, pool.Spec.Template.Spec.Provider)
	}
	return out
}

// poolCost is the pool's status.cost from s: nil while a child is unpriced or the
// currencies differ (an event says so, once per set of currencies).
func (r *CostReconciler) poolCost(ctx context.Context, pool *v1alpha1.ProxyPool, s poolSum) *v1alpha1.Cost {
	log := ctrl.LoggerFrom(ctx)
	if len(s.currencies) < 2 {
		r.warned.Delete(client.ObjectKeyFromObject(pool).String())
	}
	switch {
	case len(s.unpriced) > 0:
		slices.Sort(s.unpriced)
		log.V(1).Info("the pool's cost is not known: children with an instance have no price",
			"children", common.NameList(s.unpriced))
		return nil
	case len(s.currencies) > 1:
		r.warnCurrencies(ctx, pool, s.currencies)
		return nil
	case len(s.currencies) == 0:
		return nil
	}
	return &v1alpha1.Cost{Hourly: v1alpha1.AmountOf(s.total), Currency: s.currencies[0]}
}

func (r *CostReconciler) warnCurrencies(ctx context.Context, pool *v1alpha1.ProxyPool, currencies []string) {
	set := strings.Join(currencies, ", ")
	msg := fmt.Sprintf("the pool's children (without children, its providers) are priced in %s: no sum in one currency, "+
		"so status.cost is left out (give the pool's providers prices in one currency)", set)
	ctrl.LoggerFrom(ctx).Info("the pool's cost is not known: its children are priced in more than one currency", "currencies", set)
	if prev, loaded := r.warned.Swap(client.ObjectKeyFromObject(pool).String(), set); loaded && prev == set {
		return
	}
	if r.Recorder != nil {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, EventCostCurrenciesDiffer, common.ActionReconcile, "%s", msg)
	}
}

// ChildRate is what one child of pool costs per hour by the prices of providers: its
// template's machine type on each provider the pool places children on, the highest of
// them when they differ. False when one of those providers is not configured or has no
// price for it, or when their currencies differ. The autoscaler caps spec.budget with it.
func ChildRate(providers map[string]provider.ProviderConfig, pool *v1alpha1.ProxyPool) (v1alpha1.Cost, bool) {
	var out v1alpha1.Cost
	for i, name := range templateProviders(pool) {
		pc, ok := providers[name]
		if !ok {
			return v1alpha1.Cost{}, false
		}
		c, ok := pc.Hourly(pool.Spec.Template.Spec.Placement.MachineType)
		if !ok || (i > 0 && c.Currency != out.Currency) {
			return v1alpha1.Cost{}, false
		}
		if q := c.Hourly.Quantity(); i == 0 || q.Cmp(out.Hourly.Quantity()) > 0 {
			out = c
		}
	}
	return out, out.Currency != ""
}
