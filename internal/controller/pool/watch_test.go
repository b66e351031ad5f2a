package pool

import (
	"context"
	"fmt"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// watchedChild is a Ready child of pool "news" as the health engine leaves it.
func watchedChild(name string) *v1alpha1.Proxy {
	t0 := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	return &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "ns", Generation: 1, UID: types.UID("uid-" + name),
			Labels:      map[string]string{v1alpha1.PoolLabel: "news", v1alpha1.TemplateHashLabel: "abc"},
			Annotations: map[string]string{v1alpha1.BornAnnotation: t0.Format(time.RFC3339Nano)},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: "news", UID: "pool-uid", Controller: ptr.To(true),
			}},
		},
		Status: v1alpha1.ProxyStatus{
			Phase: v1alpha1.PhaseReady, Healthy: true, IP: "10.0.0.7", ProbeLatencyMilliseconds: 12,
			LastProbeTime: &t0, EgressIP: "198.51.100.7", SpecHash: "s1", RenderedHash: "r1",
			Conditions: []metav1.Condition{
				{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded, Message: "probe succeeded", LastTransitionTime: t0},
			},
		},
	}
}

func TestChildChangeWakesPool(t *testing.T) {
	later := metav1.NewTime(time.Date(2026, 1, 2, 3, 5, 0, 0, time.UTC))
	setHealthy := func(mutate func(*metav1.Condition)) func(*v1alpha1.Proxy) {
		return func(px *v1alpha1.Proxy) {
			mutate(meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy))
		}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*v1alpha1.Proxy)
		wakes  bool
	}{
		// What the pool reads.
		{"deletion timestamp", func(px *v1alpha1.Proxy) { px.DeletionTimestamp = &later }, true},
		{"phase", func(px *v1alpha1.Proxy) { px.Status.Phase = v1alpha1.PhaseFailed }, true},
		{"healthy", func(px *v1alpha1.Proxy) { px.Status.Healthy = false }, true},
		{"cordon annotation", func(px *v1alpha1.Proxy) { px.Annotations[v1alpha1.CordonAnnotation] = "true" }, true},
		{"born annotation", func(px *v1alpha1.Proxy) { px.Annotations[v1alpha1.BornAnnotation] = later.Format(time.RFC3339Nano) }, true},
		{"template-hash label", func(px *v1alpha1.Proxy) { px.Labels[v1alpha1.TemplateHashLabel] = "def" }, true},
		{"pool label removed", func(px *v1alpha1.Proxy) { delete(px.Labels, v1alpha1.PoolLabel) }, true},
		{"controller owner", func(px *v1alpha1.Proxy) { px.OwnerReferences[0].UID = "other-pool" }, true},
		{"spec (generation)", func(px *v1alpha1.Proxy) { px.Generation++ }, true},
		{"address", func(px *v1alpha1.Proxy) { px.Status.IP = "10.0.0.8" }, true},
		{"egress address", func(px *v1alpha1.Proxy) { px.Status.EgressIP = "198.51.100.8" }, true},
		{"status message", func(px *v1alpha1.Proxy) { px.Status.Message = "creating the instance" }, true},
		{"first successful probe", func(px *v1alpha1.Proxy) { px.Status.ProbeLatencyMilliseconds = 0 }, true},
		{"Healthy condition status", setHealthy(func(c *metav1.Condition) { c.Status = metav1.ConditionFalse }), true},
		{"Healthy condition transition", setHealthy(func(c *metav1.Condition) { c.LastTransitionTime = later }), true},
		{"Healthy condition message", setHealthy(func(c *metav1.Condition) { c.Message = "probe failed: timeout" }), true},
		{"ConfigOutdated true", func(px *v1alpha1.Proxy) {
			meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionConfigOutdated, Status: metav1.ConditionTrue, Reason: "RenderingChanged"})
		}, true},
		// Status churn the pool does not read.
		{"probe latency", func(px *v1alpha1.Proxy) { px.Status.ProbeLatencyMilliseconds = 40 }, false},
		{"heartbeat (last probe time)", func(px *v1alpha1.Proxy) { px.Status.LastProbeTime = &later }, false},
		{"probe failure count", func(px *v1alpha1.Proxy) { px.Status.ConsecutiveProbeFailures = 1 }, false},
		{"spec and rendered hashes", func(px *v1alpha1.Proxy) { px.Status.SpecHash, px.Status.RenderedHash = "s2", "r2" }, false},
		{"observed generation", func(px *v1alpha1.Proxy) { px.Status.ObservedGeneration = 1 }, false},
		{"resource version", func(px *v1alpha1.Proxy) { px.ResourceVersion = "99" }, false},
		{"Healthy condition observed generation", setHealthy(func(c *metav1.Condition) { c.ObservedGeneration = 1 }), false},
		{"ConfigOutdated false", func(px *v1alpha1.Proxy) {
			meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionConfigOutdated, Status: metav1.ConditionFalse, Reason: "UpToDate"})
		}, false},
		{"another condition", func(px *v1alpha1.Proxy) {
			meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: "Provisioned", Status: metav1.ConditionTrue, Reason: "Created"})
		}, false},
		{"another label", func(px *v1alpha1.Proxy) { px.Labels["team"] = "sport" }, false},
		{"another annotation", func(px *v1alpha1.Proxy) { px.Annotations["note"] = "x" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := watchedChild("news-a")
			upd := old.DeepCopy()
			tc.mutate(upd)
			e := event.TypedUpdateEvent[*v1alpha1.Proxy]{ObjectOld: old, ObjectNew: upd}
			if got := childPredicate.Update(e); got != tc.wakes {
				t.Errorf("%s: the pool is woken %v, want %v", tc.name, got, tc.wakes)
			}
		})
	}
	t.Run("create and delete", func(t *testing.T) {
		px := watchedChild("news-a")
		if !childPredicate.Create(event.TypedCreateEvent[*v1alpha1.Proxy]{Object: px}) {
			t.Error("a child's creation does not wake the pool")
		}
		if !childPredicate.Delete(event.TypedDeleteEvent[*v1alpha1.Proxy]{Object: px}) {
			t.Error("a child's deletion does not wake the pool")
		}
	})
}

// poolQueueOn is the pool controller's work queue (newPoolQueue, with the rate limiter
// controller-runtime gives a controller without its priority queue), on clock.
func poolQueueOn(clock *clocktesting.FakeClock) poolQueue {
	return newPoolQueue(clock)("", workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
}

// waitQueueLen waits (in real time: the queue moves waiting items on its own goroutine)
// until q holds n items.
func waitQueueLen(t *testing.T, q poolQueue, n int, what string) {
	t.Helper()
	waitFor(t, waitLong, what, func() (bool, error) {
		return q.Len() == n, fmt.Errorf("%d items queued, want %d", q.Len(), n)
	})
}

func TestChildEventsCoalesce(t *testing.T) {
	ctx := context.Background()
	clock := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	q := poolQueueOn(clock)
	defer q.ShutDown()
	h := ownedHandler[*v1alpha1.Proxy]{window: childWindow}
	news := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "news"}}

	// A burst: 1,000 children change within 200 ms.
	for i := 0; i < 1000; i++ {
		old := watchedChild(fmt.Sprintf("news-%04d", i))
		upd := old.DeepCopy()
		upd.Status.Healthy = false
		h.Update(ctx, event.TypedUpdateEvent[*v1alpha1.Proxy]{ObjectOld: old, ObjectNew: upd}, q)
		if i%5 == 4 {
			clock.Step(time.Millisecond)
		}
	}
	// The pool's own write to one of its EndpointSlices, within the window, joins the pass.
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "news-3128-0", Namespace: "ns",
		OwnerReferences: watchedChild("x").OwnerReferences}}
	ownedHandler[*discoveryv1.EndpointSlice]{window: childWindow}.Update(ctx,
		event.TypedUpdateEvent[*discoveryv1.EndpointSlice]{ObjectOld: slice, ObjectNew: slice}, q)
	if q.Len() != 0 {
		t.Fatalf("%d pool passes queued before the window is over, want 0", q.Len())
	}
	clock.Step(childWindow)
	waitQueueLen(t, q, 1, "the burst's one pass queued")
	got, _ := q.Get()
	if got != news {
		t.Fatalf("queued %v, want %v", got, news)
	}
	q.Done(got)
	// Nothing more comes of the burst.
	clock.Step(10 * childWindow)
	if q.Len() != 0 {
		t.Fatalf("%d more passes queued after the burst's", q.Len())
	}

	// A change after the window gets a pass of its own; a child of another pool, or one
	// no pool controls, never joins the pool's.
	h.Create(ctx, event.TypedCreateEvent[*v1alpha1.Proxy]{Object: watchedChild("news-new")}, q)
	other := watchedChild("sport-a")
	other.OwnerReferences[0].Name = "sport"
	h.Delete(ctx, event.TypedDeleteEvent[*v1alpha1.Proxy]{Object: other}, q)
	bare := watchedChild("bare")
	bare.OwnerReferences = nil
	h.Delete(ctx, event.TypedDeleteEvent[*v1alpha1.Proxy]{Object: bare}, q)
	clock.Step(childWindow)
	waitQueueLen(t, q, 2, "one pass for each of the two pools")
	seen := map[string]bool{}
	for range 2 {
		r, _ := q.Get()
		seen[r.Name] = true
		q.Done(r)
	}
	if !seen["news"] || !seen["sport"] {
		t.Errorf("passes queued for %v, want news and sport", seen)
	}

	// Events that come while the pool's pass runs (after its live list) bring one more
	// pass, once that one is done: never a second worker on the same pool, never none.
	h.Create(ctx, event.TypedCreateEvent[*v1alpha1.Proxy]{Object: watchedChild("news-b")}, q)
	clock.Step(childWindow)
	waitQueueLen(t, q, 1, "the pass for news-b queued")
	running, _ := q.Get()
	for i := range 100 {
		old := watchedChild(fmt.Sprintf("news-%04d", i))
		upd := old.DeepCopy()
		upd.Status.Phase = v1alpha1.PhaseRunning
		h.Update(ctx, event.TypedUpdateEvent[*v1alpha1.Proxy]{ObjectOld: old, ObjectNew: upd}, q)
	}
	clock.Step(childWindow)
	time.Sleep(50 * time.Millisecond) // let the queue move the waiting entry, if it would
	if q.Len() != 0 {
		t.Fatalf("%d passes queued while the pool's pass runs, want 0 until it is done", q.Len())
	}
	q.Done(running)
	waitQueueLen(t, q, 1, "one more pass after the running one")
	again, _ := q.Get()
	if again != news {
		t.Fatalf("queued %v, want %v", again, news)
	}
	q.Done(again)
	clock.Step(10 * childWindow)
	time.Sleep(50 * time.Millisecond)
	if q.Len() != 0 {
		t.Errorf("%d passes queued after the follow-up, want 0", q.Len())
	}
}
