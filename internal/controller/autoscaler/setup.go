package autoscaler

import (
	"context"
	"fmt"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
)

// SetupWithManager adds the autoscaler (controller "proxypool-autoscaler"): woken by a
// pool's spec or available children changing, by its demand Leases, and by the
// HorizontalPodAutoscalers and (when KEDA's CRD is installed at start) ScaledObjects
// that target it.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.DemandNamespace == "" {
		return fmt.Errorf("the autoscaler has no demand namespace")
	}
	if _, err := mgr.GetRESTMapper().RESTMapping(ScaledObjectGVK.GroupKind(), ScaledObjectGVK.Version); err == nil {
		r.ScaledObjects = true
	} else if !meta.IsNoMatchError(err) {
		return fmt.Errorf("looking for KEDA's ScaledObject kind: %w", err)
	}
	if r.External == nil {
		r.External = mgr.GetCache()
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("proxypool-autoscaler").
		For(&v1alpha1.ProxyPool{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{},
			predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				return e.ObjectOld.(*v1alpha1.ProxyPool).Status.AvailableReplicas != e.ObjectNew.(*v1alpha1.ProxyPool).Status.AvailableReplicas
			}}))).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(leasePool),
			builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
				_, ok := demand.PoolOf(o)
				return ok && o.GetNamespace() == r.DemandNamespace
			}))).
		Watches(&autoscalingv2.HorizontalPodAutoscaler{}, handler.EnqueueRequestsFromMapFunc(hpaPool))
	if r.ScaledObjects {
		so := &unstructured.Unstructured{}
		so.SetGroupVersionKind(ScaledObjectGVK)
		b = b.Watches(so, handler.EnqueueRequestsFromMapFunc(scaledObjectPool))
	}
	return b.Complete(r)
}

// LeaseCache limits a cache of Leases to the demand Leases: those labelled
// egress.hrajfrisbee.cz/demand-for in the demand namespace namespace (a cluster's own
// Leases are many, one per node among them, and a Lease elsewhere is no demand).
func LeaseCache(namespace string) cache.ByObject {
	req, err := labels.NewRequirement(demand.LabelFor, selection.Exists, nil)
	if err != nil { // a constant, valid label key
		panic(err)
	}
	return cache.ByObject{Label: labels.NewSelector().Add(*req), Namespaces: map[string]cache.Config{namespace: {}}}
}

func poolRequest(ns, name string) []reconcile.Request {
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: ns, Name: name}}}
}

// leasePool is the pool a demand Lease names by its labels (never by its own namespace,
// the demand namespace).
func leasePool(_ context.Context, o client.Object) []reconcile.Request {
	pool, ok := demand.PoolOf(o)
	if !ok {
		return nil
	}
	return poolRequest(pool.Namespace, pool.Name)
}

func hpaPool(_ context.Context, o client.Object) []reconcile.Request {
	h, ok := o.(*autoscalingv2.HorizontalPodAutoscaler)
	if !ok {
		return nil
	}
	ref := h.Spec.ScaleTargetRef
	if !targetsPool(ref.APIVersion, ref.Kind, ref.Name, ref.Name) {
		return nil
	}
	return poolRequest(h.Namespace, ref.Name)
}

func scaledObjectPool(_ context.Context, o client.Object) []reconcile.Request {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil
	}
	apiVersion, kind, name := scaleTarget(u)
	if !targetsPool(apiVersion, kind, name, name) {
		return nil
	}
	return poolRequest(u.GetNamespace(), name)
}
