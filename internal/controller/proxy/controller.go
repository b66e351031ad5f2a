// Package controller holds the reconcilers of the operator: the Proxy reconciler, which
// drives providers to create, replace and delete proxy instances, and the components that
// watch over providers and instances.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

// tracerName is the instrumentation scope of the reconciler's spans.
const tracerName = "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller"

// Finalizer keeps a Proxy until its instance is gone.
const Finalizer = "egress.hrajfrisbee.cz/finalizer"

// Defaults of the reconciler's timings.
const (
	DefaultQuotaRetry   = 5 * time.Minute
	DefaultPendingRetry = 10 * time.Second
	// DefaultPollInterval is how often a booting instance (no address yet) is looked at:
	// short, so a Proxy turns Running within about a second of its VM reporting an
	// address, and fixed, off the error backoff curve.
	DefaultPollInterval     = time.Second
	DefaultResyncInterval   = 5 * time.Minute
	DefaultProgressInterval = 3 * time.Second
	// DefaultFailedRecheckInterval is how often a Proxy Failed with OwnedByOther tries
	// its Create again.
	DefaultFailedRecheckInterval = 10 * time.Minute
	// DefaultDeletionDrain is how long a deleted Proxy that was healthy keeps its instance
	// after the deletion began (--deletion-drain).
	DefaultDeletionDrain = 10 * time.Second
)

// ProxyReconciler turns Proxy objects into provider instances.
type ProxyReconciler struct {
	Client   client.Client
	Scheme   *runtime.Scheme
	Recorder events.EventRecorder
	// Providers are the configured providers by name (spec.provider).
	Providers map[string]provider.Provider
	// QuotaRetry is how long a Proxy waits after ErrQuotaExceeded (DefaultQuotaRetry).
	QuotaRetry time.Duration
	// PendingRetry is how long a Proxy waits after a pending Create (provider.ErrPending)
	// before asking again (DefaultPendingRetry).
	PendingRetry time.Duration

	// APIReader reads past the manager's cache (the manager's API reader): a Secret's
	// metadata, the credentials snapshot. Client is used when nil.
	APIReader client.Reader
	// PollInterval is how often a booting instance (not running yet, or running without
	// an address) is looked at again, at a fixed interval (DefaultPollInterval,
	// --boot-poll-interval).
	PollInterval time.Duration
	// ResyncInterval is how often a running instance is looked at, so one that vanished
	// behind the operator's back is created again.
	ResyncInterval time.Duration
	// ProgressInterval is the least time between two progress patches of one Proxy.
	ProgressInterval time.Duration
	// FailedRecheckInterval is how often a Proxy Failed because an instance of its name
	// belongs to another owner (reason OwnedByOther) tries its Create again
	// (DefaultFailedRecheckInterval). Proxies Failed for any other reason are not
	// re-checked and cost nothing: they wait for a spec change.
	FailedRecheckInterval time.Duration

	// Credentials reads a Proxy's basic-auth credentials for the configuration rendered
	// from spec.proxy; nil reads the Secrets through Client. The manager passes the same
	// lookup to the health engine and the discovery API.
	Credentials proxyconfig.CredentialsFunc
	// WireGuard reads the WireGuard configuration spec.proxy.egress.wireguard names; nil
	// reads the Secrets through Client.
	WireGuard proxyconfig.WireGuardFunc

	// DeletionDrain is how long a Proxy that was healthy when its deletion began keeps
	// its instance, counted from its deletion timestamp (DefaultDeletionDrain,
	// --deletion-drain). Discovery and a pool's EndpointSlice drop the Proxy the moment
	// it is deleted, but a crawler may have been handed it just before, and destroying the
	// VM would cut that request; 0 deletes at once.
	DeletionDrain time.Duration

	// AddressHold is how long a running instance that stops reporting an address keeps
	// its last address and phase before the Proxy goes back to Provisioning
	// (DefaultAddressHold, --address-hold).
	AddressHold time.Duration
	// Clock is the source of time of the address hold (the real clock when nil).
	Clock clock.PassiveClock

	// Remediation is the policy of remediation (internal/remediation): the timeouts of
	// Proxies without spec.remediation's, and the brake of groups without a pool's
	// spec.remediation.maxUnhealthy (--remediation-boot-timeout,
	// --remediation-unhealthy-timeout, --max-unhealthy). Zero fields take
	// remediation.DefaultPolicy's.
	Remediation remediation.Policy
	// ProbeTarget says whether the probe target itself is down (the health engine): while
	// it is, nothing is remediated. nil: never known to be down.
	ProbeTarget common.ProbeTargetWatch
	// NoProviderEvents records no remediation brake Events on ProviderHealth objects
	// (their Events go to the default namespace, which a manager with
	// --watch-namespaces may not write).
	NoProviderEvents bool
	// brakes holds, by group, whether the brake of a provider's standalone Proxies was
	// engaged when last reported on its ProviderHealth.
	brakes sync.Map

	holds addressHolds
	// writes are the reconciler's last writes of each Proxy not yet seen in its cache.
	writes common.OwnWrites
	// defaults fills the unset fields once (setDefaults).
	defaults sync.Once

	// wake carries the Proxies Wake asks to reconcile; made by SetupWithManager.
	wake chan event.TypedGenericEvent[*v1alpha1.Proxy]
}

// wakeBuffer is how many Wake calls may wait for the controller to take them.
const wakeBuffer = 256

// The manager's cluster-wide grants. Leader election's Lease lives in the manager's own
// namespace and is granted there by the namespaced Role in config/rbac; nothing here may
// write leases (role_test.go checks the generated role).
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxies,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=proxies/finalizers,verbs=update
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=providerhealths,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=egress.hrajfrisbee.cz,resources=providerhealths/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get

// SetupWithManager registers the reconciler with mgr, running maxConcurrent reconciles
// at once. Only spec changes (a new generation), a new replace annotation, deletions,
// Wake, changes of a Secret a Proxy's spec.proxy.basicAuth names or of its credentials
// snapshot, and the health engine's Healthy condition changing (which moves the phase
// between Running and Ready) wake it; other status writes do not.
func (r *ProxyReconciler) SetupWithManager(mgr ctrl.Manager, maxConcurrent int) error {
	r.setDefaults()
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.Proxy{}, SecretRefIndex, indexSecretRef); err != nil {
		return fmt.Errorf("indexing proxies by %s: %w", SecretRefIndex, err)
	}
	r.wake = make(chan event.TypedGenericEvent[*v1alpha1.Proxy], wakeBuffer)
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.Proxy{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, replaceAnnotationChanged, healthChanged))).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.proxiesForSecret), builder.WithPredicates(snapshotWrites)).
		WatchesRawSource(source.Channel(r.wake, &handler.TypedEnqueueRequestForObject[*v1alpha1.Proxy]{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: maxConcurrent, RateLimiter: errorBackoff()}).
		Named("proxy").
		Complete(r)
}

// Wake has the Proxy named key reconciled soon, whatever its generation. Orphan GC calls
// it (OrphanGC.Wake) after deleting an instance of the Proxy's name, the one that kept it
// Failed with OwnedByOther. It returns without waking anything before SetupWithManager,
// or when ctx ends while the controller is not taking requests.
func (r *ProxyReconciler) Wake(ctx context.Context, key client.ObjectKey) {
	if r.wake == nil {
		return
	}
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	select {
	case r.wake <- event.TypedGenericEvent[*v1alpha1.Proxy]{Object: px}:
	case <-ctx.Done():
	}
}

// staleRetry is how soon a reconcile that read a stale copy runs again.
const staleRetry = common.StaleRetry

// maxErrorBackoff caps the retry delay after transient errors. controller-runtime's
// default curve grows to about 17 minutes, which would leave a Proxy idle long after a
// brief outage (a hypervisor reboot, a booting guest) has passed.
const maxErrorBackoff = 2 * time.Minute

// errorBackoff is the per-Proxy retry curve for transient errors (5 ms doubling up to
// maxErrorBackoff) under an overall bucket limit, as in controller-runtime's default.
func errorBackoff() workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](5*time.Millisecond, maxErrorBackoff),
		&workqueue.TypedBucketRateLimiter[reconcile.Request]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
	)
}

// Reconcile brings one Proxy's instance and status in line with its spec. It returns a
// result or an error, never both.
func (r *ProxyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	r.setDefaults()
	// The provider operation spans nest under this one.
	ctx, span := otel.Tracer(tracerName).Start(ctx, "proxy.reconcile", trace.WithAttributes(
		attribute.String("proxy.namespace", req.Namespace), attribute.String("proxy.name", req.Name)))
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	ctx = ctrl.LoggerInto(ctx, tracing.Logger(ctx, ctrl.LoggerFrom(ctx)))

	px := &v1alpha1.Proxy{}
	if err := r.Client.Get(ctx, req.NamespacedName, px); err != nil {
		if apierrors.IsNotFound(err) {
			r.writes.Forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("getting proxy %s: %w", req.NamespacedName, err)
	}
	switch behind, err := r.writes.Behind(ctx, r.APIReader, v1alpha1.GroupVersion.WithKind("Proxy"), px); {
	case err != nil:
		return ctrl.Result{}, err
	case behind:
		// Nothing is decided from a copy older than what this reconciler last wrote
		// (common.OwnWrites): the cache delivers that write in a moment.
		ctrl.LoggerFrom(ctx).V(1).Info("proxy copy older than the reconciler's last write; reconciling again", "version", px.ResourceVersion)
		return ctrl.Result{RequeueAfter: staleRetry}, nil
	}
	read := px.ResourceVersion
	defer func() {
		if px.ResourceVersion != read {
			r.writes.Record(px)
		}
	}()
	if px.DeletionTimestamp.IsZero() && !controllerutil.ContainsFinalizer(px, Finalizer) {
		base := px.DeepCopy()
		controllerutil.AddFinalizer(px, Finalizer)
		if err := r.Client.Patch(ctx, px, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer to proxy %s: %w", req.NamespacedName, err)
		}
	}

	s := r.newScope(ctx, px)
	res, err = r.reconcilePhases(ctx, s)
	if perr := r.applyStatus(ctx, s); perr != nil && !s.gone {
		switch {
		case errors.Is(perr, errStaleRead):
			err = perr
		case err == nil:
			err = perr
			fallthrough
		default:
			s.log.Error(perr, "applying proxy status")
		}
	}
	if errors.Is(err, errStaleRead) {
		// The cache was behind, or another writer wrote meanwhile; the next read catches
		// up. Not an error to report.
		s.log.V(1).Info("proxy changed meanwhile; reconciling again", "reason", err.Error())
		return ctrl.Result{RequeueAfter: staleRetry}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	return res, nil
}

// healthChanged passes a Proxy whose Healthy condition changed status or now speaks of
// another instance or address (status.probeTarget): the reconciler moves its phase
// between Running and Ready (scope.readiness).
var healthChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		old, ok := e.ObjectOld.(*v1alpha1.Proxy)
		cur, ok2 := e.ObjectNew.(*v1alpha1.Proxy)
		return ok && ok2 && (old.ProbedHealthy() != cur.ProbedHealthy() ||
			conditionStatus(old, v1alpha1.ConditionHealthy) != conditionStatus(cur, v1alpha1.ConditionHealthy))
	},
	CreateFunc:  func(event.CreateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

func conditionStatus(px *v1alpha1.Proxy, typ string) metav1.ConditionStatus {
	if c := meta.FindStatusCondition(px.Status.Conditions, typ); c != nil {
		return c.Status
	}
	return ""
}

func (r *ProxyReconciler) reconcilePhases(ctx context.Context, s *scope) (ctrl.Result, error) {
	switch {
	case !s.px.DeletionTimestamp.IsZero():
		return r.reconcileDelete(ctx, s)
	case s.px.Spec.Mode == v1alpha1.ProxyModeExternal:
		return r.reconcileExternal(ctx, s)
	default:
		return r.reconcileManaged(ctx, s)
	}
}

// setDefaults fills, once, what was left unset with its default: the durations not
// above zero (DeletionDrain excepted, where 0 means at once) and the clock.
// SetupWithManager calls it, and Reconcile for a reconciler built without it.
func (r *ProxyReconciler) setDefaults() {
	r.defaults.Do(func() {
		for _, d := range []struct {
			field *time.Duration
			def   time.Duration
		}{
			{&r.QuotaRetry, DefaultQuotaRetry}, {&r.PendingRetry, DefaultPendingRetry},
			{&r.PollInterval, DefaultPollInterval}, {&r.ResyncInterval, DefaultResyncInterval},
			{&r.ProgressInterval, DefaultProgressInterval}, {&r.FailedRecheckInterval, DefaultFailedRecheckInterval},
			{&r.AddressHold, DefaultAddressHold},
		} {
			if *d.field <= 0 {
				*d.field = d.def
			}
		}
		if r.Clock == nil {
			r.Clock = clock.RealClock{}
		}
	})
}
