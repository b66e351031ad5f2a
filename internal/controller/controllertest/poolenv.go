package controllertest

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// The pool tests (and the ban controller's, which run pools) work in one namespace with
// a manager of their own: the reconcilers the test's package sets up (NewPoolEnv's
// setup), and in place of the health engine a loop that marks every Running child Ready
// the way the engine does after a successful probe (phase Ready, healthy, Healthy=True
// with the fake clock's time as its transition), except the children a test holds back.

// PoolEnv is one test's namespace, fake provider, fake clock and running manager.
type PoolEnv struct {
	T   testing.TB
	Ctx context.Context
	Env *testenv.Env
	C   client.Client
	// Cache reads from the manager's cache of the namespace: what the health loop lists
	// children from, at no cost to the API server.
	Cache client.Reader
	NS    string
	Fake  *providertest.Fake
	Clock *clocktesting.FakeClock

	mu       sync.Mutex
	unhealth map[string]bool // children the health loop leaves alone
	holdIf   func(*v1alpha1.Proxy) bool
	pokes    int
}

// PoolZones is the providers config the pool reconciler sees in these tests.
var PoolZones = map[string][]string{TestProvider: {"beelink", "nuc", "tiny"}, "other-home": nil}

// NewPoolEnv makes a namespace and a manager on env (its options changed by mutate when
// not nil), calls setup with them to add the controllers, starts the manager and, when
// healthEvery > 0, the health loop every healthEvery, until the test ends.
func NewPoolEnv(t testing.TB, env *testenv.Env, healthEvery time.Duration, mutate func(*ctrl.Options), setup func(ctrl.Manager, *PoolEnv)) *PoolEnv {
	t.Helper()
	ctx := testenv.Context(t)
	ns := env.Namespace(t, ctx, "pool")
	mgr := env.NewManager(t, ns, mutate)
	e := &PoolEnv{T: t, Ctx: ctx, Env: env, C: env.Client, Cache: mgr.GetCache(), NS: ns, Fake: providertest.NewFake(),
		Clock: clocktesting.NewFakeClock(time.Now()), unhealth: map[string]bool{}}
	setup(mgr, e)
	testenv.StartManager(t, ctx, mgr)
	if healthEvery <= 0 {
		return e
	}
	hctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); e.healthLoop(hctx, healthEvery) }()
	t.Cleanup(func() { stop(); <-done })
	return e
}

// healthLoop marks Running children healthy, as the health engine does after a probe;
// the reconciler then shows them Ready. It lists them from the manager's cache, as the
// engine does from its own: a poll every few milliseconds for every test running at
// once would otherwise cost the API server more than the controllers under test.
func (e *PoolEnv) healthLoop(ctx context.Context, every time.Duration) {
	for ctx.Err() == nil {
		list := &v1alpha1.ProxyList{}
		if err := e.Cache.List(ctx, list, client.InNamespace(e.NS)); err == nil {
			for i := range list.Items {
				px := &list.Items[i]
				e.mu.Lock()
				held := e.unhealth[px.Name] || (e.holdIf != nil && e.holdIf(px))
				e.mu.Unlock()
				if px.Status.Phase != v1alpha1.PhaseRunning || held || !px.DeletionTimestamp.IsZero() || px.ProbedHealthy() {
					continue
				}
				px.Status.Healthy, px.Status.ProbeTarget = true, px.CurrentProbeTarget()
				px.Status.ProbeLatencyMilliseconds = 1
				meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{
					Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded,
					Message: "probe succeeded", LastTransitionTime: metav1.NewTime(e.Clock.Now()),
				})
				_ = ApplyHealthStatus(ctx, e.C, px)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(every):
		}
	}
}

// Hold keeps the health loop off the named children (they stay Running, not Ready).
func (e *PoolEnv) Hold(names ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, n := range names {
		e.unhealth[n] = true
	}
}

// Release lets the health loop mark the named children healthy again (undoes Hold).
func (e *PoolEnv) Release(names ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, n := range names {
		delete(e.unhealth, n)
	}
}

// NewPool returns a pool of replicas on the fake provider (not yet created).
func (e *PoolEnv) NewPool(name string, replicas int32) *v1alpha1.ProxyPool {
	return NewPool(e.NS, name, replicas)
}

// NewPool returns the pool ns/name of replicas on the fake provider, its children in
// zone beelink labelled team=news (not yet created).
func NewPool(ns, name string, replicas int32) *v1alpha1.ProxyPool {
	return testbuild.Pool(ns, name, replicas, testbuild.WithTemplateLabel("team", "news"), testbuild.WithProvider(TestProvider),
		testbuild.WithPlacement(v1alpha1.ProxyPlacement{Zone: "beelink", MachineType: "small", Image: "debian-12"}))
}

func (e *PoolEnv) Create(pool *v1alpha1.ProxyPool) *v1alpha1.ProxyPool {
	e.T.Helper()
	if err := e.C.Create(e.Ctx, pool); err != nil {
		e.T.Fatalf("creating pool %s: %v", pool.Name, err)
	}
	return pool
}

// CreateSettled creates the pool, waits for its children to be Ready, moves the clock by
// minReadySeconds and waits until they all count as available.
func (e *PoolEnv) CreateSettled(pool *v1alpha1.ProxyPool) {
	e.T.Helper()
	e.Create(pool)
	r := *pool.Spec.Replicas
	e.WaitPool(pool.Name, fmt.Sprintf("%d children Ready", r), func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return p.Status.ReadyReplicas == r
	})
	e.Clock.Step(time.Duration(pool.Spec.MinReadySeconds) * time.Second)
	e.Poke(pool.Name)
	e.WaitSettled(pool.Name, r)
}

func (e *PoolEnv) GetPool(name string) *v1alpha1.ProxyPool {
	e.T.Helper()
	pool := &v1alpha1.ProxyPool{}
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: name}, pool); err != nil {
		e.T.Fatalf("getting pool %s: %v", name, err)
	}
	return pool
}

// Update changes the pool with mutate, retrying on conflicts.
func (e *PoolEnv) Update(name string, mutate func(*v1alpha1.ProxyPool)) {
	e.T.Helper()
	testutil.WaitFor(e.T, testutil.WaitLong, "updating pool "+name, func() (bool, error) {
		pool := e.GetPool(name)
		mutate(pool)
		err := e.C.Update(e.Ctx, pool)
		return err == nil, err
	})
}

// Poke makes the pool reconcile now (after the fake clock moved), through an annotation.
func (e *PoolEnv) Poke(name string) {
	e.T.Helper()
	e.mu.Lock()
	e.pokes++
	n := e.pokes
	e.mu.Unlock()
	e.Update(name, func(p *v1alpha1.ProxyPool) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations["test.egress.hrajfrisbee.cz/poke"] = fmt.Sprint(n)
	})
}

// Children lists the pool's children, by name.
func (e *PoolEnv) Children(pool string) []v1alpha1.Proxy {
	e.T.Helper()
	return ListChildren(e.T, e.Ctx, e.C, e.NS, pool)
}

// ListChildren lists the children of the pool ns/pool through c, by name.
func ListChildren(t testing.TB, ctx context.Context, c client.Client, ns, pool string) []v1alpha1.Proxy {
	t.Helper()
	list := &v1alpha1.ProxyList{}
	if err := c.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.PoolLabel: pool}); err != nil {
		t.Fatalf("listing children of %s: %v", pool, err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items
}

func Names(pxs []v1alpha1.Proxy) []string {
	out := make([]string, len(pxs))
	for i := range pxs {
		out[i] = pxs[i].Name
	}
	return out
}

// WaitPool waits until cond holds for the pool (and its children) and returns the pool.
func (e *PoolEnv) WaitPool(name, what string, cond func(*v1alpha1.ProxyPool, []v1alpha1.Proxy) bool) *v1alpha1.ProxyPool {
	e.T.Helper()
	var pool *v1alpha1.ProxyPool
	testutil.WaitFor(e.T, testutil.WaitLong, fmt.Sprintf("pool %s: %s", name, what), func() (bool, error) {
		pool = e.GetPool(name)
		kids := e.Children(name)
		if cond(pool, kids) {
			return true, nil
		}
		return false, fmt.Errorf("status %+v, children %s", pool.Status, Describe(kids))
	})
	return pool
}

// WaitSettled waits for replicas children, all up to date and available, and no others.
func (e *PoolEnv) WaitSettled(name string, replicas int32) *v1alpha1.ProxyPool {
	e.T.Helper()
	pool := e.WaitPool(name, fmt.Sprintf("%d children up to date and available", replicas), func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		st := p.Status
		return st.ObservedGeneration == p.Generation && st.Replicas == replicas && st.AvailableReplicas == replicas &&
			st.UpToDateReplicas == replicas && len(kids) == int(replicas)
	})
	// The ban controller (where a test runs it) owns saturatedSites and Saturated alone.
	owners := testenv.StatusManagers(pool)
	bansOwn, pc := owners[statusapply.ProxyBans], owners[statusapply.ProxyPoolController]
	delete(owners, statusapply.ProxyBans)
	if len(owners) != 1 || pc == "" || strings.Contains(pc, "Saturated") || strings.Contains(pc, "saturatedSites") ||
		strings.Contains(strings.NewReplacer(`"k:{\"type\":\"Saturated\"}"`, "", `"f:saturatedSites"`, "").Replace(bansOwn), `"k:{`) {
		e.T.Errorf("pool %s: status written by %v and proxy-bans %s, want the proxypool-controller field manager alone but for saturatedSites and Saturated", name, owners, bansOwn)
	}
	return pool
}

func Describe(kids []v1alpha1.Proxy) string {
	var parts []string
	for _, k := range kids {
		d := ""
		if !k.DeletionTimestamp.IsZero() {
			d = ",deleting"
		}
		parts = append(parts, fmt.Sprintf("%s(%s,%s,%s%s)", k.Name, k.Status.Phase, k.Spec.Placement.Zone, k.Labels[v1alpha1.TemplateHashLabel], d))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func PoolCondition(p *v1alpha1.ProxyPool, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(p.Status.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// Consistently fails the test if cond stops holding within the next second.
func Consistently(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	for i := 0; i < 20; i++ {
		if ok, err := cond(); !ok {
			t.Fatalf("no longer %s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond) // the span over which nothing may change
	}
}

// PatchChild changes a child's metadata (status false) or status (true) with mutate.
func (e *PoolEnv) PatchChild(name string, status bool, mutate func(*v1alpha1.Proxy)) {
	e.T.Helper()
	testutil.WaitFor(e.T, testutil.WaitLong, "patching child "+name, func() (bool, error) {
		px := &v1alpha1.Proxy{}
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: name}, px); err != nil {
			return false, err
		}
		base := px.DeepCopy()
		mutate(px)
		patch := client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})
		var err error
		if status {
			err = e.C.Status().Patch(e.Ctx, px, patch)
		} else {
			err = e.C.Patch(e.Ctx, px, patch)
		}
		return err == nil, err
	})
}

// PoolEvents are the notes of the pool's Events with reason.
func (e *PoolEnv) PoolEvents(pool, reason string) []string {
	e.T.Helper()
	var out []string
	for _, ev := range e.Events("ProxyPool", pool, reason) {
		out = append(out, ev.Note)
	}
	return out
}

// WaitPoolEvents waits until the notes of the pool's Events with reason satisfy ok
// and returns them. Events are written by the recorder's own goroutine, after the
// change that caused them is visible: a test reads them only through a wait.
func (e *PoolEnv) WaitPoolEvents(pool, reason, what string, ok func([]string) bool) []string {
	e.T.Helper()
	return e.waitEvents(fmt.Sprintf("pool %s: %s Events: %s", pool, reason, what), func() []string { return e.PoolEvents(pool, reason) }, ok)
}

// WaitProxyEvents is WaitPoolEvents for the Events about the Proxy name, as ProxyEvents
// gives them.
func (e *PoolEnv) WaitProxyEvents(name, reason, what string, ok func([]string) bool) []string {
	e.T.Helper()
	return e.waitEvents(fmt.Sprintf("proxy %s: %s Events: %s", name, reason, what), func() []string { return e.ProxyEvents(name, reason) }, ok)
}

func (e *PoolEnv) waitEvents(what string, list func() []string, ok func([]string) bool) []string {
	e.T.Helper()
	var evs []string
	testutil.WaitFor(e.T, testutil.WaitLong, what, func() (bool, error) {
		evs = list()
		return ok(evs), fmt.Errorf("events %q", evs)
	})
	return evs
}

// AtLeast is an Events condition: n or more of them.
func AtLeast(n int) func([]string) bool { return func(evs []string) bool { return len(evs) >= n } }

// Containing is an Events condition: one of them holds text.
func Containing(text string) func([]string) bool {
	return func(evs []string) bool {
		for _, ev := range evs {
			if strings.Contains(ev, text) {
				return true
			}
		}
		return false
	}
}

// Events are the Events about the object of kind and name with reason.
func (e *PoolEnv) Events(kind, name, reason string) []eventsv1.Event {
	e.T.Helper()
	list := &eventsv1.EventList{}
	if err := e.C.List(e.Ctx, list, client.InNamespace(e.NS)); err != nil {
		e.T.Fatal(err)
	}
	var out []eventsv1.Event
	for _, ev := range list.Items {
		if ev.Regarding.Kind == kind && ev.Regarding.Name == name && ev.Reason == reason {
			out = append(out, ev)
		}
	}
	return out
}

// HoldWhere keeps the health loop off the children cond picks (they stay Running).
func (e *PoolEnv) HoldWhere(cond func(*v1alpha1.Proxy) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.holdIf = cond
}

// ProxyEvents are the type and note of the Events about Proxy name with reason.
func (e *PoolEnv) ProxyEvents(name, reason string) []string {
	e.T.Helper()
	var out []string
	for _, ev := range e.Events("Proxy", name, reason) {
		out = append(out, ev.Type+": "+ev.Note)
	}
	return out
}

func (e *PoolEnv) GetProxy(name string) *v1alpha1.Proxy {
	e.T.Helper()
	px := &v1alpha1.Proxy{}
	if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: name}, px); err != nil {
		e.T.Fatalf("getting proxy %s: %v", name, err)
	}
	return px
}

// WaitProxy waits until the Proxy name satisfies cond.
func (e *PoolEnv) WaitProxy(name, what string, cond func(*v1alpha1.Proxy) bool) *v1alpha1.Proxy {
	e.T.Helper()
	var px *v1alpha1.Proxy
	testutil.WaitFor(e.T, testutil.WaitLong, "proxy "+name+": "+what, func() (bool, error) {
		px = &v1alpha1.Proxy{}
		if err := e.C.Get(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: name}, px); err != nil {
			return false, err
		}
		return cond(px), fmt.Errorf("annotations %v, coolingSites %d, conditions %+v", px.Annotations, px.Status.CoolingSites, px.Status.Conditions)
	})
	return px
}
