package pool

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// What the pool tests do to children and read back: a bounds sampler, status and
// annotation changes as the health engine, the reconciler or a user would make them,
// the EndpointSlice, the pool's Events and what the pool owns.

// bounds samples a pool's children until stopped and records the most that existed at
// once and the fewest available (Ready for minReady by the fake clock, not cordoned, not
// being deleted).
type bounds struct {
	stop               func()
	mu                 sync.Mutex
	maxTotal, minAvail int
	minTotal           int // the fewest children (those being deleted counted) seen at once
	samples            int
}

func (e *poolEnv) watchBounds(pool string, minReady time.Duration) *bounds {
	b := &bounds{maxTotal: -1, minAvail: 1 << 30, minTotal: 1 << 30}
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			list := &v1alpha1.ProxyList{}
			if err := e.C.List(ctx, list, client.InNamespace(e.NS), client.MatchingLabels{v1alpha1.PoolLabel: pool}); err == nil {
				avail := 0
				for i := range list.Items {
					if availableAt(&list.Items[i], e.Clock.Now(), minReady) {
						avail++
					}
				}
				b.mu.Lock()
				b.maxTotal, b.minAvail = max(b.maxTotal, len(list.Items)), min(b.minAvail, avail)
				b.minTotal = min(b.minTotal, len(list.Items))
				b.samples++
				b.mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond) // sampling period, not a wait for a condition
		}
	}()
	b.stop = func() { cancel(); <-done }
	return b
}

// check stops the sampler and fails the test unless every sample kept the bounds.
func (b *bounds) check(t testing.TB, maxTotal, minAvail int) {
	t.Helper()
	b.stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	checkSamples(t, b.samples, b.maxTotal, b.minAvail, maxTotal, minAvail, "")
}

// checkSamples fails the test unless there were enough samples, none with more than
// maxTotal children (seen: maxSeen) nor fewer than minAvail available (seen: minSeen,
// with the children then described by atMin).
func checkSamples(t testing.TB, samples, maxSeen, minSeen, maxTotal, minAvail int, atMin string) {
	t.Helper()
	if samples < 10 {
		t.Fatalf("only %d samples of the pool", samples)
	}
	if maxSeen > maxTotal {
		t.Errorf("%d children existed at once, bound replicas + maxSurge = %d (%d samples)", maxSeen, maxTotal, samples)
	}
	if minSeen < minAvail {
		t.Errorf("only %d children were available at one point, bound replicas - maxUnavailable = %d (%d samples) %s", minSeen, minAvail, samples, atMin)
	}
	t.Logf("%d samples: at most %d children, at least %d available", samples, maxSeen, minSeen)
}

func availableAt(px *v1alpha1.Proxy, now time.Time, minReady time.Duration) bool {
	if px.Status.Phase != v1alpha1.PhaseReady || !px.Status.Healthy || !px.DeletionTimestamp.IsZero() ||
		px.Annotations[v1alpha1.CordonAnnotation] == "true" {
		return false
	}
	return !now.Before(readySince(px).Add(minReady))
}

// cordon sets the cordon annotation on a child, as `kubectl annotate` would.
func (e *poolEnv) cordon(name string) {
	e.PatchChild(name, false, func(px *v1alpha1.Proxy) {
		if px.Annotations == nil {
			px.Annotations = map[string]string{}
		}
		px.Annotations[v1alpha1.CordonAnnotation] = "true"
	})
}

// setUnhealthy marks a child unhealthy as the health engine does after failed probes.
func (e *poolEnv) setUnhealthy(name string) {
	e.Hold(name)
	e.PatchChild(name, true, func(px *v1alpha1.Proxy) {
		px.Status.Phase, px.Status.Healthy = v1alpha1.PhaseRunning, false
		meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonProbeFailed,
			Message: "3 consecutive failed probes", LastTransitionTime: metav1.NewTime(e.Clock.Now()),
		})
	})
}

// setFailed marks a child Failed as the Proxy reconciler does on a permanent error.
func (e *poolEnv) setFailed(name string) {
	e.Hold(name)
	e.PatchChild(name, true, func(px *v1alpha1.Proxy) {
		px.Status.Phase, px.Status.Healthy = v1alpha1.PhaseFailed, false
		px.Status.ObservedGeneration = px.Generation
		meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionProvisioned, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonPermanentError,
			Message: "instance is gone for good",
		})
	})
}

// waitSlice waits until the EndpointSlice's endpoints, as child name → ready, satisfy cond.
func (e *poolEnv) waitSlice(name, what string, cond func(map[string]bool) bool) *discoveryv1.EndpointSlice {
	e.T.Helper()
	es := &discoveryv1.EndpointSlice{}
	waitFor(e.T, waitLong, "endpoint slice "+name+": "+what, func() (bool, error) {
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: name}, es); err != nil {
			return false, err
		}
		eps := map[string]bool{}
		for _, ep := range es.Endpoints {
			eps[ep.TargetRef.Name] = ep.Conditions.Ready != nil && *ep.Conditions.Ready
		}
		return cond(eps), fmt.Errorf("endpoints %v", eps)
	})
	return es
}

// ownedBy lists the Proxies, Services and EndpointSlices whose controller is uid.
func (e *poolEnv) ownedBy(uid types.UID) []client.Object {
	e.T.Helper()
	var out []client.Object
	for _, l := range []client.ObjectList{&v1alpha1.ProxyList{}, &corev1.ServiceList{}, &discoveryv1.EndpointSliceList{}} {
		if err := e.C.List(e.Ctx, l, client.InNamespace(e.NS)); err != nil {
			e.T.Fatal(err)
		}
		objs, err := meta.ExtractList(l)
		if err != nil {
			e.T.Fatal(err)
		}
		for _, o := range objs {
			obj := o.(client.Object)
			if ref := metav1.GetControllerOf(obj); ref != nil && ref.UID == uid {
				out = append(out, obj)
			}
		}
	}
	return out
}

// waitNewChild waits for a child of pool not in old to reach phase and returns its name.
func (e *poolEnv) waitNewChild(pool string, old []string, phase v1alpha1.ProxyPhase) string {
	e.T.Helper()
	var name string
	e.WaitPool(pool, "a new child "+string(phase), func(_ *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		for _, k := range kids {
			if !slices.Contains(old, k.Name) && k.Status.Phase == phase {
				name = k.Name
			}
		}
		return name != ""
	})
	return name
}
