package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// Event reasons of the ProxyPool controller.
const (
	EventChildCreated = "ChildCreated"
	EventChildDeleted = "ChildDeleted"
	EventPoolStalled  = "Stalled"
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
}

// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxypools,verbs=get;list;watch;update;patch
// A pool makes and removes its child Proxies.
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxies,verbs=create;delete
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxypools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxypools/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch;create;update;patch;delete

// SetupWithManager registers the reconciler with mgr. A pool is reconciled when its spec
// or annotations change (so `kubectl annotate` forces a pass) and whenever a child, its
// Service or its EndpointSlice changes.
func (r *ProxyPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.ProxyPool{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Owns(&v1alpha1.Proxy{}).
		Owns(&corev1.Service{}).
		Owns(&discoveryv1.EndpointSlice{}).
		Named("proxypool").
		Complete(r)
}

// Reconcile brings one pool's children, publication and status in line with its spec.
// It returns a result or an error, never both.
func (r *ProxyPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	pool := &v1alpha1.ProxyPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("getting proxy pool %s: %w", req.NamespacedName, err)
	}
	if !pool.DeletionTimestamp.IsZero() {
		// The children, the Service and the EndpointSlices carry the pool as controller
		// owner: the cluster's garbage collector deletes them.
		return ctrl.Result{}, nil
	}
	s, err := r.observe(ctx, pool)
	if err != nil {
		return ctrl.Result{}, err
	}
	actErr := r.act(ctx, s)
	if actErr == nil {
		actErr = r.publish(ctx, s)
	}
	if err := r.patchPoolStatus(ctx, s); err != nil {
		if actErr == nil {
			return ctrl.Result{}, err
		}
		log.Error(err, "patching proxy pool status")
	}
	if actErr != nil {
		return ctrl.Result{}, actErr
	}
	if d, ok := s.nextDeadline(); ok {
		return ctrl.Result{RequeueAfter: max(d, time.Second)}, nil
	}
	return ctrl.Result{}, nil
}

func (r *ProxyPoolReconciler) now() time.Time {
	if r.Clock == nil {
		return time.Now()
	}
	return r.Clock.Now()
}

func (r *ProxyPoolReconciler) event(pool *v1alpha1.ProxyPool, typ, reason, action, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(pool, nil, typ, reason, action, format, args...)
	}
}
