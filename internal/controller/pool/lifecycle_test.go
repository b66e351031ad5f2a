package pool

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// Children are named <pool>-<5 random>, carry the template's labels, the pool and
// template-hash labels and the pool as controller owner (with blockOwnerDeletion, so the
// cluster's garbage collector deletes them with the pool), and are spread round-robin
// by weight.
func testPoolChildren(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.NewPool("news", 3)
	pool.Spec.Spread = []v1alpha1.PoolSpreadEntry{{Zone: "beelink"}, {Zone: "nuc", Weight: 2}}
	e.Create(pool)
	e.WaitSettled("news", 3)
	pool = e.GetPool("news")
	zones := map[string]int{}
	for _, px := range e.Children("news") {
		if !strings.HasPrefix(px.Name, "news-") || len(px.Name) != len("news-")+5 {
			t.Errorf("child name %q, want news-<5 random>", px.Name)
		}
		if px.Labels["team"] != "news" || px.Labels[v1alpha1.PoolLabel] != "news" || px.Labels[v1alpha1.TemplateHashLabel] != TemplateHash(&pool.Spec.Template) {
			t.Errorf("child %s labels %v", px.Name, px.Labels)
		}
		ref := metav1.GetControllerOf(&px)
		if ref == nil || ref.UID != pool.UID || ref.Kind != "ProxyPool" || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
			t.Errorf("child %s controller reference %+v, want the pool with blockOwnerDeletion", px.Name, ref)
		}
		if px.Spec.Provider != testProvider || px.Spec.Placement.Image != "debian-12" {
			t.Errorf("child %s spec %+v, want the template's", px.Name, px.Spec)
		}
		zones[px.Spec.Placement.Zone]++
	}
	if zones["beelink"] != 1 || zones["nuc"] != 2 {
		t.Errorf("zones %v, want beelink 1 and nuc 2 (weights 1 and 2)", zones)
	}
	if got := len(e.Fake.Instances()); got != 3 {
		t.Errorf("%d instances, want 3", got)
	}
	if c := controllertest.PoolCondition(pool, v1alpha1.PoolConditionProgressing); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.PoolReasonComplete {
		t.Errorf("Progressing %+v, want False Complete", c)
	}
	if c := controllertest.PoolCondition(pool, v1alpha1.PoolConditionAvailable); c.Status != metav1.ConditionTrue {
		t.Errorf("Available %+v, want True", c)
	}
	if pool.Status.Selector != v1alpha1.PoolLabel+"=news" || pool.Status.ReadyReplicas != 3 {
		t.Errorf("status %+v", pool.Status)
	}
}

// kubectl scale: the scale subresource reads replicas and the selector string and sets
// spec.replicas; a scale down takes cordoned and unhealthy children first, then the
// deletion order.
func testPoolScale(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.NewPool("web", 2)
	pool.Spec.Deletion.Order = v1alpha1.DeletionOrderNewest
	e.Create(pool)
	e.WaitSettled("web", 2)
	first := controllertest.Names(e.Children("web"))

	scale := &autoscalingv1.Scale{}
	if err := e.C.SubResource("scale").Get(e.Ctx, e.GetPool("web"), scale); err != nil {
		t.Fatalf("reading the scale subresource: %v", err)
	}
	if scale.Spec.Replicas != 2 || scale.Status.Replicas != 2 || scale.Status.Selector != v1alpha1.PoolLabel+"=web" {
		t.Fatalf("scale %+v, want 2 replicas and selector %s=web", scale, v1alpha1.PoolLabel)
	}
	e.Clock.Step(time.Minute) // the next children are born a minute later
	e.scale("web", 5)
	if r := e.GetPool("web").Spec.Replicas; r == nil || *r != 5 {
		t.Fatalf("spec.replicas %v after scaling to 5", r)
	}
	e.WaitSettled("web", 5)
	kids := e.Children("web")
	var newer []string
	for _, px := range kids {
		if !slices.Contains(first, px.Name) {
			newer = append(newer, px.Name)
		}
	}
	// One of the old ones is cordoned and one of the new ones unhealthy: they go first.
	cordoned, unhealthy := first[0], newer[0]
	e.cordon(cordoned)
	e.Hold(unhealthy)
	e.setUnhealthy(unhealthy)
	e.scale("web", 2)
	e.WaitPool("web", "2 children", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return len(kids) == 2 && p.Status.Replicas == 2
	})
	left := controllertest.Names(e.Children("web"))
	// Of the other three, order Newest deletes one of the newer children: the older stays.
	if slices.Contains(left, cordoned) || slices.Contains(left, unhealthy) {
		t.Fatalf("left %v: the cordoned %s or the unhealthy %s survived the scale down", left, cordoned, unhealthy)
	}
	if !slices.Contains(left, first[1]) {
		t.Errorf("left %v: the older child %s went before newer ones (order Newest)", left, first[1])
	}
	waitFor(t, waitLong, "2 instances left", func() (bool, error) {
		n := len(e.Fake.Instances())
		return n == 2, fmt.Errorf("%d instances", n)
	})
}

// A template change is rolled out by new children and deletions within maxSurge and
// maxUnavailable, counting a child available only after minReadySeconds.
func testPoolRollout(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.NewPool("roll", 4)
	pool.Spec.MinReadySeconds = 30
	two, one := intstr.FromInt32(2), intstr.FromInt32(1)
	pool.Spec.Strategy.RollingUpdate = v1alpha1.PoolRollingUpdate{MaxSurge: &two, MaxUnavailable: &one}
	e.CreateSettled(pool)
	old := controllertest.Names(e.Children("roll"))

	b := e.watchBounds("roll", 30*time.Second)
	e.Update("roll", func(p *v1alpha1.ProxyPool) { p.Spec.Template.Spec.Placement.Image = "debian-13" })
	hash := TemplateHash(&e.GetPool("roll").Spec.Template)
	for step := 0; ; step++ {
		if step > 20 {
			t.Fatal("rollout did not finish in 20 steps")
		}
		// Wait until the pool has done what it can before the clock moves again.
		e.WaitPool("roll", "the step's new children Ready", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
			for _, k := range kids {
				if k.Labels[v1alpha1.TemplateHashLabel] == hash && k.Status.Phase != v1alpha1.PhaseReady {
					return false
				}
			}
			return p.Status.ObservedGeneration == p.Generation
		})
		st := e.GetPool("roll").Status
		if st.UpToDateReplicas == 4 && st.AvailableReplicas == 4 && len(e.Children("roll")) == 4 {
			break
		}
		e.Clock.Step(30 * time.Second)
		e.Poke("roll")
	}
	b.check(t, 4+2, 4-1)
	for _, px := range e.Children("roll") {
		if slices.Contains(old, px.Name) || px.Spec.Placement.Image != "debian-13" {
			t.Errorf("child %s (image %s) is not a new one", px.Name, px.Spec.Placement.Image)
		}
	}
}

// A child past maxAge is replaced surge-first: the successor is made and becomes
// available before the old one goes, so availability never drops below replicas.
func testPoolRotation(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.NewPool("rot", 2)
	pool.Spec.Rotation = v1alpha1.PoolRotation{MaxAge: &metav1.Duration{Duration: time.Hour}, Jitter: "25%"}
	pool.Spec.MinReadySeconds = 10
	e.CreateSettled(pool)
	old := controllertest.Names(e.Children("rot"))

	b := e.watchBounds("rot", 10*time.Second)
	e.Clock.Step(time.Hour) // past every deadline (at most maxAge)
	e.Poke("rot")
	var successor string
	e.WaitPool("rot", "a successor Ready while both old children remain", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		for _, k := range kids {
			if !slices.Contains(old, k.Name) && k.Status.Phase == v1alpha1.PhaseReady {
				successor = k.Name
			}
		}
		return successor != "" && len(kids) == 3
	})
	controllertest.Consistently(t, "both old children there while the successor is not yet available", func() (bool, error) {
		kids := e.Children("rot")
		live := 0
		for _, k := range kids {
			if slices.Contains(old, k.Name) && k.DeletionTimestamp.IsZero() {
				live++
			}
		}
		return live == 2, fmt.Errorf("children %s", controllertest.Describe(kids))
	})
	// Each step of the clock makes the Ready successor available, so the pool deletes an
	// old child and surges the next successor. Step again only once that successor exists
	// and is Ready (three live children, every new one Ready): checking just "every new
	// child Ready" right after a step can pass before the next successor is made, and the
	// steps then run out before the rotation ends.
	for i := 0; i < 6 && !e.rotated("rot", old); i++ {
		e.Clock.Step(10 * time.Second)
		e.Poke("rot")
		e.WaitPool("rot", "the rotation done, or the next successor made and Ready", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
			if e.rotated("rot", old) {
				return true
			}
			live := 0
			for _, k := range kids {
				if !k.DeletionTimestamp.IsZero() {
					continue
				}
				live++
				if !slices.Contains(old, k.Name) && k.Status.Phase != v1alpha1.PhaseReady {
					return false
				}
			}
			return live == 3
		})
	}
	e.WaitPool("rot", "both old children replaced", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool { return e.rotated("rot", old) })
	b.check(t, 3, 2)
	for _, ev := range e.WaitPoolEvents("rot", EventChildDeleted, "one per replaced child", controllertest.AtLeast(len(old))) {
		if !strings.Contains(ev, "past its rotation deadline") {
			t.Errorf("deletion event %q does not say why", ev)
		}
	}
}

// scale sets replicas through the scale subresource with a merge patch, as
// `kubectl scale` does.
func (e *poolEnv) scale(pool string, replicas int32) {
	e.T.Helper()
	scalePool(e.T, e.Ctx, e.C, e.GetPool(pool), replicas)
}

// scalePool sets pool's replicas through the scale subresource with a merge patch, as
// `kubectl scale` does.
func scalePool(t testing.TB, ctx context.Context, c client.Client, pool *v1alpha1.ProxyPool, replicas int32) {
	t.Helper()
	patch := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)))
	scale := &autoscalingv1.Scale{}
	if err := c.SubResource("scale").Patch(ctx, pool, patch, client.WithSubResourceBody(scale)); err != nil {
		t.Fatalf("scaling pool %s to %d: %v", pool.Name, replicas, err)
	}
	if scale.Spec.Replicas != replicas {
		t.Fatalf("scale after the patch %+v, want %d replicas", scale, replicas)
	}
}

// rotated: two children, none of them in old, all available.
func (e *poolEnv) rotated(pool string, old []string) bool {
	kids := e.Children(pool)
	if len(kids) != 2 {
		return false
	}
	for _, k := range kids {
		if slices.Contains(old, k.Name) || k.Status.Phase != v1alpha1.PhaseReady {
			return false
		}
	}
	return true
}

// A Failed child is replaced surge-first; a template whose children all fail stalls the
// pool rather than deleting it or churning through instances.
func testPoolFailed(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.NewPool("flaky", 3)
	pool.Spec.MinReadySeconds = 30
	e.CreateSettled(pool)
	old := controllertest.Names(e.Children("flaky"))

	failed := old[1]
	e.setFailed(failed)
	e.waitNewChild("flaky", old, v1alpha1.PhaseReady)
	controllertest.Consistently(t, "the failed child kept until its successor is available", func() (bool, error) {
		px := &v1alpha1.Proxy{}
		err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: failed}, px)
		return err == nil && px.DeletionTimestamp.IsZero() && len(e.Children("flaky")) == 4, err
	})
	e.Clock.Step(30 * time.Second)
	e.Poke("flaky")
	e.WaitSettled("flaky", 3)
	if slices.Contains(controllertest.Names(e.Children("flaky")), failed) {
		t.Fatalf("the failed child %s is still there", failed)
	}

	// Now every new child fails (a broken image): one is tried, then the pool stalls.
	e.Fake.SetCreateHook(func(_ context.Context, req provider.CreateRequest) error {
		if req.Placement.Image == "broken" {
			return provider.Errorf(provider.ErrPermanent, "image broken is not in the catalogue")
		}
		return nil
	})
	e.Update("flaky", func(p *v1alpha1.ProxyPool) { p.Spec.Template.Spec.Placement.Image = "broken" })
	p := e.WaitPool("flaky", "Progressing=False Stalled", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		c := controllertest.PoolCondition(p, v1alpha1.PoolConditionProgressing)
		return c.Reason == v1alpha1.PoolReasonStalled && c.Status == metav1.ConditionFalse && p.Status.ObservedGeneration == p.Generation
	})
	if c := controllertest.PoolCondition(p, v1alpha1.PoolConditionAvailable); c.Status != metav1.ConditionTrue || p.Status.AvailableReplicas != 3 {
		t.Errorf("a stalled rollout lost availability: %+v, %d available", c, p.Status.AvailableReplicas)
	}
	creates := e.Fake.CountOf("create")
	e.Clock.Step(time.Minute)
	e.Poke("flaky")
	controllertest.Consistently(t, "the stalled pool holding 3 old children and 1 failed one, creating nothing", func() (bool, error) {
		kids := e.Children("flaky")
		return len(kids) == 4 && e.Fake.CountOf("create") == creates, fmt.Errorf("children %s, %d creates (was %d)", controllertest.Describe(kids), e.Fake.CountOf("create"), creates)
	})
	e.WaitPoolEvents("flaky", EventPoolStalled, "one", controllertest.AtLeast(1))
}

// The cordon annotation takes a child out of the EndpointSlice at once and makes it the
// first to be replaced, surge-first.
func testPoolCordon(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.NewPool("cord", 2)
	pool.Spec.Service = &v1alpha1.PoolService{Name: "cord-proxies"}
	pool.Spec.MinReadySeconds = 5
	e.CreateSettled(pool)
	old := controllertest.Names(e.Children("cord"))
	e.waitSlice("cord-proxies-3128", "both children ready", func(eps map[string]bool) bool { return eps[old[0]] && eps[old[1]] })

	e.cordon(old[0])
	e.waitSlice("cord-proxies-3128", "the cordoned child not ready", func(eps map[string]bool) bool { return !eps[old[0]] && eps[old[1]] })
	e.WaitPool("cord", "a successor Ready", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return len(kids) == 3 && p.Status.ReadyReplicas == 3
	})
	controllertest.Consistently(t, "the cordoned child kept until its successor is available", func() (bool, error) {
		return slices.Contains(controllertest.Names(e.Children("cord")), old[0]), nil
	})
	e.Clock.Step(5 * time.Second)
	e.Poke("cord")
	e.WaitSettled("cord", 2)
	left := controllertest.Names(e.Children("cord"))
	if slices.Contains(left, old[0]) || !slices.Contains(left, old[1]) {
		t.Fatalf("children %v: want %s replaced and %s kept", left, old[0], old[1])
	}
}

// Deleting the pool: every child carries the pool as controller owner, so the cluster's
// garbage collector deletes them; envtest runs no garbage collector, so the test deletes
// what the collector would (the objects the pool controls) and checks that the Proxy
// reconciler then removes every instance.
func testPoolDeletion(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.NewPool("gone", 3)
	pool.Spec.Service = &v1alpha1.PoolService{Name: "gone"}
	e.Create(pool)
	e.WaitSettled("gone", 3)
	pool = e.GetPool("gone")
	if err := e.C.Delete(e.Ctx, pool); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "the pool gone", func() (bool, error) {
		err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(pool), &v1alpha1.ProxyPool{})
		return apierrors.IsNotFound(err), err
	})
	owned := e.ownedBy(pool.UID)
	if len(owned) != 3+2 { // 3 children, the Service and one EndpointSlice
		t.Fatalf("objects owned by the pool: %v, want 3 children, a Service and an EndpointSlice", owned)
	}
	for _, obj := range owned {
		if err := e.C.Delete(e.Ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
			t.Fatalf("deleting %s as the garbage collector would: %v", obj.GetName(), err)
		}
	}
	waitFor(t, waitLong, "no child and no instance left", func() (bool, error) {
		kids, inst := len(e.Children("gone")), len(e.Fake.Instances())
		return kids == 0 && inst == 0, fmt.Errorf("%d children, %d instances", kids, inst)
	})
}

// A spread entry naming a zone the provider lacks is a condition naming the entry; the
// children go to the entries that work.
func testPoolPlacement(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.NewPool("place", 2)
	pool.Spec.Spread = []v1alpha1.PoolSpreadEntry{{Zone: "nuc"}, {Zone: "attic"}, {Provider: "nowhere"}}
	e.Create(pool)
	p := e.WaitSettled("place", 2)
	c := controllertest.PoolCondition(p, v1alpha1.PoolConditionPlacementValid)
	if c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.PoolReasonUnknownZone ||
		!strings.Contains(c.Message, `spec.spread[1] (provider fake-home, zone attic): zone "attic" is not one of provider fake-home's zones`) ||
		!strings.Contains(c.Message, `spec.spread[2] (provider nowhere, zone beelink): provider "nowhere" is not in the providers config`) {
		t.Errorf("PlacementValid %+v", c)
	}
	for _, px := range e.Children("place") {
		if px.Spec.Placement.Zone != "nuc" {
			t.Errorf("child %s in zone %q, want nuc (the only usable entry)", px.Name, px.Spec.Placement.Zone)
		}
	}
	e.Update("place", func(p *v1alpha1.ProxyPool) { p.Spec.Spread = p.Spec.Spread[:1] })
	e.WaitPool("place", "PlacementValid=True", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.PoolConditionPlacementValid)
	})
}
