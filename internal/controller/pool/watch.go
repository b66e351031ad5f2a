package pool

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
)

// How child Proxies wake their pool. A pool of a thousand sees a thousand status writes
// a minute from the health engine alone, and each pass lists every child live: so only a
// change the pool reads wakes it (childPredicate), and the changes of one window
// (childWindow) come to one pass (ownedHandler). A pass started after the window lists
// the children live, so it sees every change the window held.

// childWindow is how long a child event waits for others of its pool before the pool
// reconciles.
const childWindow = 250 * time.Millisecond

// childPredicate passes a child's creation, deletion and every update childChangeMatters
// says the pool reads.
var childPredicate = predicate.TypedFuncs[*v1alpha1.Proxy]{
	UpdateFunc: func(e event.TypedUpdateEvent[*v1alpha1.Proxy]) bool {
		return childChangeMatters(e.ObjectOld, e.ObjectNew)
	},
}

// childChangeMatters: whether going from old to new changes anything the pool decides or
// publishes from: the child's spec (its generation), deletion timestamp, owner, pool and
// template-hash labels, cordon, born and remediation-replace annotations, phase, healthy flag, address and
// message, egress address, whether it has ever been probed successfully, its Healthy
// condition (status, reason, message and transition time) and whether ConfigOutdated is
// true. Probe times, latencies, failure counts, hashes and the other conditions do not.
func childChangeMatters(old, new *v1alpha1.Proxy) bool {
	return childView(old) != childView(new)
}

// poolChildView is the part of a child Proxy the pool reads.
type poolChildView struct {
	generation     int64
	deleting       bool
	owner          types.UID
	pool, hash     string
	cordon, born   string
	remediate      string
	phase          v1alpha1.ProxyPhase
	healthy        bool
	ip, message    string
	egressIP       string
	probed         bool
	healthyCond    metav1.Condition
	configOutdated bool
}

func childView(px *v1alpha1.Proxy) poolChildView {
	v := poolChildView{
		generation:     px.Generation,
		deleting:       !px.DeletionTimestamp.IsZero(),
		pool:           px.Labels[v1alpha1.PoolLabel],
		hash:           px.Labels[v1alpha1.TemplateHashLabel],
		cordon:         px.Annotations[v1alpha1.CordonAnnotation],
		born:           px.Annotations[v1alpha1.BornAnnotation],
		remediate:      px.Annotations[common.RemediationReplaceAnnotation],
		phase:          px.Status.Phase,
		healthy:        px.Status.Healthy,
		ip:             px.Status.IP,
		egressIP:       px.Status.EgressIP,
		message:        px.Status.Message,
		probed:         px.Status.ProbeLatencyMilliseconds > 0,
		configOutdated: meta.IsStatusConditionTrue(px.Status.Conditions, v1alpha1.ConditionConfigOutdated),
	}
	if ref := metav1.GetControllerOf(px); ref != nil {
		v.owner = ref.UID
	}
	if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy); c != nil {
		v.healthyCond = metav1.Condition{Status: c.Status, Reason: c.Reason, Message: c.Message, LastTransitionTime: c.LastTransitionTime}
	}
	return v
}

// ownedHandler enqueues the pool that controls an object (a child Proxy, the pool's
// Service or one of its EndpointSlices) window after the object's event. The work queue
// keeps one entry per pool and, for an entry already waiting, the earlier time, so that
// every event of the window joins the first one's pass; the pool's own writes to its
// Service and EndpointSlices join the pass that follows the children's changes rather
// than start one of their own.
type ownedHandler[T client.Object] struct{ window time.Duration }

var _ handler.TypedEventHandler[*v1alpha1.Proxy, reconcile.Request] = ownedHandler[*v1alpha1.Proxy]{}

type poolQueue = workqueue.TypedRateLimitingInterface[reconcile.Request]

// newPoolQueue is the pool controller's work queue constructor: client-go's rate-limiting
// queue on clk. controller-runtime would otherwise give the controller its priority
// queue, which coalesces AddAfter the same way but runs on the real clock only; this
// one's clock can be a fake, so TestChildEventsCoalesce drives the very queue the
// controller runs. Its AddAfter keeps one entry per pool, at the earliest time asked;
// an entry handed to a worker and queued again meanwhile runs once more after Done.
func newPoolQueue(clk clock.WithTicker) func(string, workqueue.TypedRateLimiter[reconcile.Request]) poolQueue {
	return func(name string, rl workqueue.TypedRateLimiter[reconcile.Request]) poolQueue {
		return workqueue.NewTypedRateLimitingQueueWithConfig(rl, workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{
			Name: name, Clock: clk,
		})
	}
}

func (h ownedHandler[T]) Create(_ context.Context, e event.TypedCreateEvent[T], q poolQueue) {
	h.add(e.Object, q)
}

func (h ownedHandler[T]) Update(_ context.Context, e event.TypedUpdateEvent[T], q poolQueue) {
	h.add(e.ObjectOld, q)
	h.add(e.ObjectNew, q)
}

func (h ownedHandler[T]) Delete(_ context.Context, e event.TypedDeleteEvent[T], q poolQueue) {
	h.add(e.Object, q)
}

func (h ownedHandler[T]) Generic(_ context.Context, e event.TypedGenericEvent[T], q poolQueue) {
	h.add(e.Object, q)
}

func (h ownedHandler[T]) add(obj T, q poolQueue) {
	ref, ok := v1alpha1.ControllingPool(obj)
	if !ok {
		return
	}
	q.AddAfter(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: ref.Name}}, h.window)
}
