package pool

import (
	"context"
	"fmt"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// sliceChild is a Ready child named c-<i> with an address.
func sliceChild(i int) *v1alpha1.Proxy {
	return testbuild.Proxy("ns", fmt.Sprintf("c-%04d", i), testbuild.WithUID(fmt.Sprintf("uid-%d", i)), testbuild.WithPort(3128),
		testbuild.WithPhase(v1alpha1.PhaseReady), testbuild.Healthy(), testbuild.WithIP(fmt.Sprintf("10.0.%d.%d", i/256, i%256)))
}

func sliceChildren(from, to int) []*v1alpha1.Proxy {
	var out []*v1alpha1.Proxy
	for i := from; i < to; i++ {
		out = append(out, sliceChild(i))
	}
	return out
}

func slicesByName(ess []*discoveryv1.EndpointSlice) map[string]*discoveryv1.EndpointSlice {
	m := map[string]*discoveryv1.EndpointSlice{}
	for _, es := range ess {
		m[es.Name] = es
	}
	return m
}

// changedSlices names the slices of after that differ from before, or are new or gone.
func changedSlices(before, after []*discoveryv1.EndpointSlice) []string {
	b, a := slicesByName(before), slicesByName(after)
	var out []string
	for name, es := range a {
		if old, ok := b[name]; !ok || !equality.Semantic.DeepEqual(old.Endpoints, es.Endpoints) {
			out = append(out, name)
		}
	}
	for name := range b {
		if _, ok := a[name]; !ok {
			out = append(out, name+" (gone)")
		}
	}
	return out
}

// Children keep the slice that holds them: one child's change rewrites one slice, a new
// child fills a gap, and a scale down packs the endpoints into as few slices as they need.
func TestDesiredSlicesSharded(t *testing.T) {
	pool := &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	kids := sliceChildren(0, 250)
	first := desiredSlices(pool, "svc", kids, nil)
	if len(first) != 3 {
		t.Fatalf("%d slices for 250 endpoints, want 3", len(first))
	}
	byName := slicesByName(first)
	for _, name := range []string{"svc-3128", "svc-3128-1", "svc-3128-2"} {
		if byName[name] == nil {
			t.Fatalf("no slice %s among %v", name, changedSlices(nil, first))
		}
	}
	if n := len(byName["svc-3128-2"].Endpoints); n != 50 {
		t.Errorf("the third slice holds %d endpoints, want 50", n)
	}

	// One child turns unhealthy: only its slice changes.
	victim := byName["svc-3128-1"].Endpoints[7].TargetRef.Name
	for _, k := range kids {
		if k.Name == victim {
			k.Status.Healthy = false
		}
	}
	second := desiredSlices(pool, "svc", kids, first)
	if got := changedSlices(first, second); len(got) != 1 || got[0] != "svc-3128-1" {
		t.Errorf("one child's change rewrote %v, want only svc-3128-1", got)
	}

	// One child of the first slice goes and a new one comes: the new one takes its place.
	gone := byName["svc-3128"].Endpoints[3].TargetRef.Name
	var next []*v1alpha1.Proxy
	for _, k := range kids {
		if k.Name != gone {
			next = append(next, k)
		}
	}
	next = append(next, sliceChild(900))
	third := desiredSlices(pool, "svc", next, second)
	if got := changedSlices(second, third); len(got) != 1 || got[0] != "svc-3128" {
		t.Errorf("a replacement rewrote %v, want only svc-3128", got)
	}

	// Down to 130 children, 40 of them in each of the first two slices and all 50 of the
	// third: two slices remain, every child once.
	var keep []*v1alpha1.Proxy
	perSlice := map[string]int{"svc-3128": 40, "svc-3128-1": 40, "svc-3128-2": 50}
	for name, n := range perSlice {
		for _, ep := range slicesByName(third)[name].Endpoints[:n] {
			for _, k := range next {
				if k.Name == ep.TargetRef.Name {
					keep = append(keep, k)
				}
			}
		}
	}
	fourth := desiredSlices(pool, "svc", keep, third)
	seen := map[string]int{}
	for _, es := range fourth {
		if len(es.Endpoints) > maxEndpointsPerSlice {
			t.Errorf("slice %s holds %d endpoints", es.Name, len(es.Endpoints))
		}
		for _, ep := range es.Endpoints {
			seen[ep.TargetRef.Name]++
		}
	}
	if len(fourth) != 2 || len(seen) != 130 {
		t.Errorf("%d slices with %d endpoints for 130 children, want 2", len(fourth), len(seen))
	}
	for name, n := range seen {
		if n != 1 {
			t.Errorf("child %s published %d times", name, n)
		}
	}
}

// A child the pool deletes in a pass is published as terminating, not ready, by that
// same pass (its Proxy still exists while its instance is deleted).
func TestPoolDeletedChildUnpublishedInThePass(t *testing.T) {
	pool := &v1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "pool-uid", Generation: 1},
		Spec: v1alpha1.ProxyPoolSpec{
			Replicas: ptr.To[int32](1),
			Template: v1alpha1.ProxyTemplate{Spec: v1alpha1.ProxySpec{Provider: testProvider, Port: 3128}},
			Service:  &v1alpha1.PoolService{Name: "svc"},
		},
	}
	hash := TemplateHash(&pool.Spec.Template)
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var objs []client.Object
	for i := 0; i < 2; i++ {
		px := sliceChild(i)
		px.Labels = map[string]string{v1alpha1.PoolLabel: "p", v1alpha1.TemplateHashLabel: hash}
		px.Annotations = map[string]string{v1alpha1.BornAnnotation: now.Add(time.Duration(i-10) * time.Minute).Format(time.RFC3339Nano)}
		px.Spec.Provider = testProvider
		px.Finalizers = []string{"egress.hrajfrisbee.cz/instance"}
		px.Status.ProbeLatencyMilliseconds = 1
		if err := controllerutil.SetControllerReference(pool, px, scheme); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, px)
	}
	c := testenv.FakeClient(t, interceptor.Funcs{}, append(objs, pool)...)
	r := &ProxyPoolReconciler{Client: c, APIReader: c, Scheme: scheme, Zones: controllertest.PoolZones, Clock: clocktesting.NewFakeClock(now)}
	_, _ = r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "p"}})

	oldest := objs[0].GetName()
	px := &v1alpha1.Proxy{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: oldest}, px); err != nil || px.DeletionTimestamp.IsZero() {
		t.Fatalf("the oldest child %s after the scale down: %v, deletion %v", oldest, err, px.DeletionTimestamp)
	}
	es := &discoveryv1.EndpointSlice{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "svc-3128"}, es); err != nil {
		t.Fatal(err)
	}
	for _, ep := range es.Endpoints {
		if ep.TargetRef.Name == oldest && (*ep.Conditions.Ready || !*ep.Conditions.Terminating) {
			t.Errorf("the child deleted in the pass is published %+v, want not ready and terminating", ep.Conditions)
		}
	}
}
