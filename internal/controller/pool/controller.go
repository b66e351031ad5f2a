package pool

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
)

// Event reasons of the ProxyPool controller.
const (
	EventChildCreated = "ChildCreated"
	EventChildDeleted = "ChildDeleted"
	EventPoolStalled  = "Stalled"
	// EventProgressDeadlineExceeded (Warning): once when the pool goes
	// progressDeadlineSeconds without progress.
	EventProgressDeadlineExceeded = v1alpha1.PoolReasonProgressDeadlineExceeded
)

// ProxyPoolReconciler keeps each ProxyPool's child Proxies: it creates and deletes them,
// never edits one, and publishes the healthy ones as an EndpointSlice when asked.
type ProxyPoolReconciler struct {
	Client   client.Client
	Scheme   *runtime.Scheme
	Recorder events.EventRecorder
	// APIReader lists children fresh from the API server, so that a reconcile never acts
	// on a cache that has not yet seen its own creates and deletes (the manager's API
	// reader); Client is used when nil.
	APIReader client.Reader
	// Zones are the configured providers by name, each with the zones (kvm2: host names)
	// its config lists; a provider missing here is not configured, one with no zones
	// accepts any zone.
	Zones map[string][]string
	// Clock is the source of time for availability and rotation (the real clock when nil).
	Clock clock.PassiveClock
	// Remediation is the remediation policy; the pool reports its children's brake with
	// its MaxUnhealthy when spec.remediation.maxUnhealthy is unset, and the timeouts of
	// its template's children without their own.
	Remediation remediation.Policy
	// ProbeTarget says whether the probe target itself is down (the health engine);
	// children failing meanwhile are not counted by the brake. nil: never known down.
	ProbeTarget common.ProbeTargetWatch

	// defaults fills the unset fields once (setDefaults).
	defaults sync.Once
	// writes are the reconciler's last writes of each pool not yet seen in its cache.
	writes common.OwnWrites
	// deadlineReported holds, by pool UID, the progress time of the stall last reported
	// with a ProgressDeadlineExceeded Event.
	deadlineReported sync.Map
}

// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxypools,verbs=get;list;watch;update;patch
// A pool makes and removes its child Proxies.
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxies,verbs=create;delete
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxypools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxypools/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch;create;update;patch;delete

// PoolSecretRefIndex is the field index of ProxyPools by the name of the Secret their
// template's spec.proxy.basicAuth.secretRef names, which maps a changed Secret to its pools.
const PoolSecretRefIndex = "spec.template.spec.proxy.basicAuth.secretRef.name"

func indexPoolSecretRef(obj client.Object) []string {
	pool, ok := obj.(*v1alpha1.ProxyPool)
	if !ok {
		return nil
	}
	t := &pool.Spec.Template.Spec
	if t.Proxy == nil || t.Proxy.BasicAuth == nil {
		return nil
	}
	return []string{string(t.Proxy.BasicAuth.SecretRef.Name)}
}

// poolsForSecret maps a Secret to the pools of its namespace whose template names it (a
// rotated password changes their template hash) and those whose
// spec.egress.wireguard.secretSelector matches it.
func (r *ProxyPoolReconciler) poolsForSecret(ctx context.Context, sec client.Object) []reconcile.Request {
	list := &v1alpha1.ProxyPoolList{}
	if err := r.Client.List(ctx, list, client.InNamespace(sec.GetNamespace()), client.MatchingFields{PoolSecretRefIndex: sec.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing the proxy pools that use a secret", "secret", client.ObjectKeyFromObject(sec))
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	for _, key := range r.poolsForWireGuardSecret(ctx, sec) {
		if !slices.ContainsFunc(reqs, func(q reconcile.Request) bool { return q.NamespacedName == key }) {
			reqs = append(reqs, reconcile.Request{NamespacedName: key})
		}
	}
	return reqs
}

// SetupWithManager registers the reconciler with mgr. A pool is reconciled when its spec
// or annotations change (so `kubectl annotate` forces a pass), when a child changes in a
// way the pool reads (childPredicate), whenever its Service or its EndpointSlices change
// (the changes of 250 ms to children, Service and slices come to one pass), and when the
// Secret its template names changes. Its work queue is newPoolQueue's, on the real clock,
// with controller-runtime's default rate limiter for that queue.
func (r *ProxyPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	r.setDefaults()
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.ProxyPool{}, PoolSecretRefIndex, indexPoolSecretRef); err != nil {
		return fmt.Errorf("indexing proxy pools by %s: %w", PoolSecretRefIndex, err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.ProxyPool{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		WatchesRawSource(source.Kind(mgr.GetCache(), &v1alpha1.Proxy{}, ownedHandler[*v1alpha1.Proxy]{window: childWindow}, childPredicate)).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.poolsForSecret)).
		WatchesRawSource(source.Kind(mgr.GetCache(), &corev1.Service{}, ownedHandler[*corev1.Service]{window: childWindow})).
		WatchesRawSource(source.Kind(mgr.GetCache(), &discoveryv1.EndpointSlice{}, ownedHandler[*discoveryv1.EndpointSlice]{window: childWindow})).
		Named("proxypool").
		WithOptions(controller.Options{UsePriorityQueue: ptr.To(false), NewQueue: newPoolQueue(clock.RealClock{})}).
		Complete(r)
}

// Reconcile brings one pool's children, publication and status in line with its spec.
// It returns a result or an error, never both.
func (r *ProxyPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	r.setDefaults()
	log := ctrl.LoggerFrom(ctx)
	pool := &v1alpha1.ProxyPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.writes.Forget(req.NamespacedName)
			forgetPoolMetrics(req.NamespacedName)
			remediation.ForgetGroup(remediation.PoolGroup(req.Namespace, req.Name))
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("getting proxy pool %s: %w", req.NamespacedName, err)
	}
	if !pool.DeletionTimestamp.IsZero() {
		forgetPoolMetrics(req.NamespacedName)
		remediation.ForgetGroup(remediation.PoolGroup(req.Namespace, req.Name))
		// The children, the Service and the EndpointSlices carry the pool as controller
		// owner: the cluster's garbage collector deletes them.
		return ctrl.Result{}, nil
	}
	switch behind, err := r.writes.Behind(ctx, r.APIReader, v1alpha1.GroupVersion.WithKind("ProxyPool"), pool); {
	case err != nil:
		return ctrl.Result{}, err
	case behind:
		// Nothing is decided from a copy older than this reconciler's last write of the
		// pool (common.OwnWrites): the cache delivers that write in a moment.
		log.V(1).Info("proxy pool copy older than the reconciler's last write; reconciling again", "version", pool.ResourceVersion)
		return ctrl.Result{RequeueAfter: common.StaleRetry}, nil
	}
	read := pool.ResourceVersion
	defer func() {
		if pool.ResourceVersion != read {
			r.writes.Record(pool)
		}
	}()
	s, err := r.readChildren(ctx, pool)
	if err != nil {
		return ctrl.Result{}, err
	}
	actErr := r.act(ctx, s)
	if actErr == nil {
		actErr = r.publish(ctx, s)
	}
	r.reportDeadline(s)
	brakeNext := r.remediationBrake(s) // remediation.go
	if err := r.applyPoolStatus(ctx, s); err != nil {
		if actErr == nil {
			return ctrl.Result{}, err
		}
		log.Error(err, "patching proxy pool status")
	}
	if actErr != nil {
		return ctrl.Result{}, actErr
	}
	d, ok := s.nextDeadline()
	if brakeNext > 0 && (!ok || brakeNext < d) {
		d, ok = brakeNext, true
	}
	if ok {
		return ctrl.Result{RequeueAfter: max(d, time.Second)}, nil
	}
	return ctrl.Result{}, nil
}

// setDefaults fills, once, what was left unset: the live reader (Client) and the clock
// (the real one). SetupWithManager calls it, and Reconcile for a reconciler built
// without it.
func (r *ProxyPoolReconciler) setDefaults() {
	r.defaults.Do(func() {
		if r.APIReader == nil {
			r.APIReader = r.Client
		}
		if r.Clock == nil {
			r.Clock = clock.RealClock{}
		}
	})
}

func (r *ProxyPoolReconciler) event(pool *v1alpha1.ProxyPool, typ, reason, action, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(pool, nil, typ, reason, action, format, args...)
	}
}
