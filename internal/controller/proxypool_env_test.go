package controller

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// The ProxyPool tests start an API server of their own through testenv (one for all of
// them, in TestProxyPool) rather than sharing the package's, and run, in one manager per
// test: the Proxy reconciler on the fake provider, the pool reconciler on a fake clock,
// and in place of the health engine a loop that marks every Running child Ready the way
// the engine does after a successful probe (phase Ready, healthy, Healthy=True with the
// fake clock's time as its transition), except the children a test holds back.

// poolEnv is one test's namespace, fake provider, fake clock and running manager.
type poolEnv struct {
	t     testing.TB
	ctx   context.Context
	env   *testenv.Env
	c     client.Client
	ns    string
	fake  *providertest.Fake
	clock *clocktesting.FakeClock

	mu       sync.Mutex
	unhealth map[string]bool // children the health loop leaves alone
	holdIf   func(*v1alpha1.Proxy) bool
	pokes    int
}

// poolZones is the providers config the pool reconciler sees in these tests.
var poolZones = map[string][]string{testProvider: {"beelink", "nuc", "tiny"}, "other-home": nil}

func newPoolEnv(t testing.TB, env *testenv.Env) *poolEnv {
	t.Helper()
	return newPoolEnvWith(t, env, 10, 20*time.Millisecond)
}

// newPoolEnvWith runs proxyWorkers Proxy reconciles at once and the health loop every
// healthEvery; with proxyWorkers 0, neither (the pool reconciler alone).
func newPoolEnvWith(t testing.TB, env *testenv.Env, proxyWorkers int, healthEvery time.Duration) *poolEnv {
	t.Helper()
	return newPoolEnvCounting(t, env, proxyWorkers, healthEvery, nil)
}

// newPoolEnvCounting is newPoolEnvWith whose manager's client and the pool's live reader
// count, in requests (when not nil), every request they send to the API server.
func newPoolEnvCounting(t testing.TB, env *testenv.Env, proxyWorkers int, healthEvery time.Duration, requests *atomic.Int64) *poolEnv {
	t.Helper()
	return newPoolEnvSetup(t, env, proxyWorkers, healthEvery, requests, nil)
}

// newPoolEnvSetup is newPoolEnvCounting that calls setup, when not nil, with the
// manager and the fake clock before the manager starts (to add more controllers).
func newPoolEnvSetup(t testing.TB, env *testenv.Env, proxyWorkers int, healthEvery time.Duration, requests *atomic.Int64,
	setup func(ctrl.Manager, *clocktesting.FakeClock)) *poolEnv {
	t.Helper()
	return newPoolEnvProxy(t, env, proxyWorkers, healthEvery, requests, setup, nil)
}

// newPoolEnvProxy is newPoolEnvSetup that calls setupProxy, when not nil, with the
// Proxy reconciler and the fake clock before the reconciler is set up.
func newPoolEnvProxy(t testing.TB, env *testenv.Env, proxyWorkers int, healthEvery time.Duration, requests *atomic.Int64,
	setup func(ctrl.Manager, *clocktesting.FakeClock), setupProxy func(*ProxyReconciler, *clocktesting.FakeClock)) *poolEnv {
	t.Helper()
	ctx := testenv.Context(t)
	ns := env.Namespace(t, ctx, "pool")
	var mutate func(*ctrl.Options)
	if requests != nil {
		mutate = func(o *ctrl.Options) { o.NewClient = countingNewClient(requests) }
	}
	mgr := env.NewManager(t, ns, mutate)
	e := &poolEnv{t: t, ctx: ctx, env: env, c: env.Client, ns: ns, fake: providertest.NewFake(),
		clock: clocktesting.NewFakeClock(time.Now()), unhealth: map[string]bool{}}
	pr := &ProxyReconciler{
		Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorder("proxy-controller"),
		Providers: map[string]provider.Provider{testProvider: e.fake, "other-home": e.fake}, QuotaRetry: time.Hour,
	}
	if setupProxy != nil {
		setupProxy(pr, e.clock)
	}
	if proxyWorkers > 0 {
		if err := pr.SetupWithManager(mgr, proxyWorkers); err != nil {
			t.Fatalf("setting up the proxy reconciler: %v", err)
		}
	}
	r := &ProxyPoolReconciler{
		Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorder("proxypool-controller"),
		Zones: poolZones, Clock: e.clock,
	}
	if requests != nil {
		reader, err := client.New(countingConfig(mgr.GetConfig(), requests), client.Options{Scheme: mgr.GetScheme()})
		if err != nil {
			t.Fatalf("creating the counting live reader: %v", err)
		}
		r.APIReader = reader
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatalf("setting up the pool reconciler: %v", err)
	}
	if setup != nil {
		setup(mgr, e.clock)
	}
	testenv.StartManager(t, ctx, mgr)
	if proxyWorkers <= 0 {
		return e
	}
	hctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); e.healthLoop(hctx, healthEvery) }()
	t.Cleanup(func() { stop(); <-done })
	return e
}

// healthLoop marks Running children healthy, as the health engine does after a probe;
// the reconciler then shows them Ready.
func (e *poolEnv) healthLoop(ctx context.Context, every time.Duration) {
	for ctx.Err() == nil {
		list := &v1alpha1.ProxyList{}
		if err := e.c.List(ctx, list, client.InNamespace(e.ns)); err == nil {
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
					Message: "probe succeeded", LastTransitionTime: metav1.NewTime(e.clock.Now()),
				})
				_ = applyHealthStatus(ctx, e.c, px)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(every):
		}
	}
}

// hold keeps the health loop off the named children (they stay Running, not Ready).
func (e *poolEnv) hold(names ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, n := range names {
		e.unhealth[n] = true
	}
}

// newPool returns a pool of replicas on the fake provider (not yet created).
func (e *poolEnv) newPool(name string, replicas int32) *v1alpha1.ProxyPool {
	return &v1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: v1alpha1.ProxyPoolSpec{
			Replicas: ptr.To(replicas),
			Template: v1alpha1.ProxyTemplate{
				Metadata: v1alpha1.ProxyTemplateMetadata{Labels: map[string]string{"team": "news"}},
				Spec: v1alpha1.ProxySpec{
					Provider:  testProvider,
					Placement: v1alpha1.ProxyPlacement{Zone: "beelink", MachineType: "small", Image: "debian-12"},
				},
			},
		},
	}
}

func (e *poolEnv) create(pool *v1alpha1.ProxyPool) *v1alpha1.ProxyPool {
	e.t.Helper()
	if err := e.c.Create(e.ctx, pool); err != nil {
		e.t.Fatalf("creating pool %s: %v", pool.Name, err)
	}
	return pool
}

// createSettled creates the pool, waits for its children to be Ready, moves the clock by
// minReadySeconds and waits until they all count as available.
func (e *poolEnv) createSettled(pool *v1alpha1.ProxyPool) {
	e.t.Helper()
	e.create(pool)
	r := *pool.Spec.Replicas
	e.waitPool(pool.Name, fmt.Sprintf("%d children Ready", r), func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return p.Status.ReadyReplicas == r
	})
	e.clock.Step(time.Duration(pool.Spec.MinReadySeconds) * time.Second)
	e.poke(pool.Name)
	e.waitSettled(pool.Name, r)
}

func (e *poolEnv) getPool(name string) *v1alpha1.ProxyPool {
	e.t.Helper()
	pool := &v1alpha1.ProxyPool{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, pool); err != nil {
		e.t.Fatalf("getting pool %s: %v", name, err)
	}
	return pool
}

// update changes the pool with mutate, retrying on conflicts.
func (e *poolEnv) update(name string, mutate func(*v1alpha1.ProxyPool)) {
	e.t.Helper()
	waitFor(e.t, waitLong, "updating pool "+name, func() (bool, error) {
		pool := e.getPool(name)
		mutate(pool)
		err := e.c.Update(e.ctx, pool)
		return err == nil, err
	})
}

// poke makes the pool reconcile now (after the fake clock moved), through an annotation.
func (e *poolEnv) poke(name string) {
	e.t.Helper()
	e.mu.Lock()
	e.pokes++
	n := e.pokes
	e.mu.Unlock()
	e.update(name, func(p *v1alpha1.ProxyPool) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations["test.egress.hrajfrisbee.cz/poke"] = fmt.Sprint(n)
	})
}

// children lists the pool's children, by name.
func (e *poolEnv) children(pool string) []v1alpha1.Proxy {
	e.t.Helper()
	list := &v1alpha1.ProxyList{}
	if err := e.c.List(e.ctx, list, client.InNamespace(e.ns), client.MatchingLabels{v1alpha1.PoolLabel: pool}); err != nil {
		e.t.Fatalf("listing children of %s: %v", pool, err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items
}

func names(pxs []v1alpha1.Proxy) []string {
	out := make([]string, len(pxs))
	for i := range pxs {
		out[i] = pxs[i].Name
	}
	return out
}

// waitPool waits until cond holds for the pool (and its children) and returns the pool.
func (e *poolEnv) waitPool(name, what string, cond func(*v1alpha1.ProxyPool, []v1alpha1.Proxy) bool) *v1alpha1.ProxyPool {
	e.t.Helper()
	var pool *v1alpha1.ProxyPool
	waitFor(e.t, waitLong, fmt.Sprintf("pool %s: %s", name, what), func() (bool, error) {
		pool = e.getPool(name)
		kids := e.children(name)
		if cond(pool, kids) {
			return true, nil
		}
		return false, fmt.Errorf("status %+v, children %s", pool.Status, describe(kids))
	})
	return pool
}

// waitSettled waits for replicas children, all up to date and available, and no others.
func (e *poolEnv) waitSettled(name string, replicas int32) *v1alpha1.ProxyPool {
	e.t.Helper()
	pool := e.waitPool(name, fmt.Sprintf("%d children up to date and available", replicas), func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
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
		e.t.Errorf("pool %s: status written by %v and proxy-bans %s, want the proxypool-controller field manager alone but for saturatedSites and Saturated", name, owners, bansOwn)
	}
	return pool
}

func describe(kids []v1alpha1.Proxy) string {
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

func poolCondition(p *v1alpha1.ProxyPool, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(p.Status.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// TestProxyPool runs the pool's API-server tests against one API server of their own.
func TestProxyPool(t *testing.T) {
	env := testenv.StartT(t)
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *testenv.Env)
	}{
		{"Validation", testPoolValidation},
		{"Defaults", testPoolDefaults},
		{"Sample", testPoolSample},
		{"Children", testPoolChildren},
		{"Scale", testPoolScale},
		{"Rollout", testPoolRollout},
		{"Rotation", testPoolRotation},
		{"Failed", testPoolFailed},
		{"Cordon", testPoolCordon},
		{"Retire", testPoolRetire},
		{"Saturated", testPoolSaturated},
		{"Deletion", testPoolDeletion},
		{"Placement", testPoolPlacement},
		{"NameLength", testPoolNameLength},
		{"StuckDeleting", testPoolStuckDeleting},
		{"NeverReady", testPoolNeverReady},
		{"RotationStuck", testPoolRotationStuck},
		{"ConfigOutdated", testPoolConfigOutdated},
		{"Credentials", testPoolCredentials},
		{"PasswordRotation", testPoolPasswordRotation},
		{"UpgradeRolls", testPoolUpgradeRolls},
		{"EndpointSlice", testPoolEndpointSlice},
		{"EndpointSliceShards", testPoolSliceShards},
		{"Metrics", testPoolMetrics},
		{"EgressIdentities", testPoolEgressIdentities},
		{"WireGuardAssignment", testPoolWireGuardAssignment},
		{"WireGuardNoMatch", testPoolWireGuardNoMatch},
		{"WireGuardDeleteFirst", testPoolWireGuardDeleteFirst},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, env) })
	}
}
