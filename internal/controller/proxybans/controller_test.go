package proxybans

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/pool"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// poolEnv is controllertest.PoolEnv with the ban tests' own helpers.
type poolEnv struct{ *controllertest.PoolEnv }

// newPoolEnvBans is a pool env whose manager runs, as the pool tests' does, the Proxy
// reconciler (10 workers) on the fake provider and the pool reconciler on the fake clock,
// and also the ban controller on the fake clock, with the default policy (standalone
// Proxies and pools without spec.bans).
func newPoolEnvBans(t *testing.T, env *testenv.Env) (*poolEnv, *BansReconciler) {
	br := &BansReconciler{Policy: bans.DefaultPolicy}
	e := controllertest.NewPoolEnv(t, env, 20*time.Millisecond, nil, func(mgr ctrl.Manager, e *controllertest.PoolEnv) {
		pr := &proxy.ProxyReconciler{
			Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorder("proxy-controller"),
			Providers: map[string]provider.Provider{controllertest.TestProvider: e.Fake, "other-home": e.Fake}, QuotaRetry: time.Hour,
		}
		if err := pr.SetupWithManager(mgr, 10); err != nil {
			t.Fatalf("setting up the proxy reconciler: %v", err)
		}
		r := &pool.ProxyPoolReconciler{
			Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorder("proxypool-controller"),
			Zones: controllertest.PoolZones, Clock: e.Clock,
		}
		if err := r.SetupWithManager(mgr); err != nil {
			t.Fatalf("setting up the pool reconciler: %v", err)
		}
		br.Client, br.Recorder, br.Clock = mgr.GetClient(), mgr.GetEventRecorder("proxy-bans"), e.Clock
		if err := br.SetupWithManager(mgr); err != nil {
			t.Fatalf("setting up the ban controller: %v", err)
		}
	})
	return &poolEnv{e}, br
}

// TestPoolBans runs the ban controller's tests on pools, each in a namespace of its own
// on the package's API server, in parallel: retirement of a child banned on many sites,
// and the pool's saturated sites.
func TestPoolBans(t *testing.T) {
	t.Parallel()
	env := shared.Env(t)
	t.Run("Retire", func(t *testing.T) {
		t.Parallel()
		testPoolRetire(t, env)
	})
	t.Run("Saturated", func(t *testing.T) {
		t.Parallel()
		testPoolSaturated(t, env)
	})
}

// report writes reports about the Proxy name as a replica's feedback recorder does, at
// the env's fake clock.
func (e *poolEnv) report(name string, reps ...bans.Report) {
	e.T.Helper()
	rec := &bans.Recorder{Client: e.C, Reader: e.C, APIReader: e.C, Clock: e.Clock, Policy: bans.DefaultPolicy}
	for _, r := range reps {
		rec.Add(types.NamespacedName{Namespace: e.NS, Name: name}, r)
	}
	rec.Flush(e.Ctx)
	if rec.Writes() != 1 {
		e.T.Fatalf("the recorder wrote proxy %s %d times, want once", name, rec.Writes())
	}
}

func banned(sites ...string) []bans.Report {
	out := make([]bans.Report, len(sites))
	for i, s := range sites {
		out[i] = bans.Report{Site: s, Outcome: bans.Banned}
	}
	return out
}

func retiredAs(px *v1alpha1.Proxy) bool {
	c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionRetired)
	return px.Annotations[v1alpha1.CordonAnnotation] == "true" && px.Annotations[v1alpha1.RetiredAnnotation] != "" &&
		c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonBannedOnManySites &&
		c.Message == px.Annotations[v1alpha1.RetiredAnnotation]
}

// A child banned on retireAfterSites sites within the window is retired: cordoned with
// the retired annotation, a Warning event and the Retired condition; the pool replaces
// it surge-first (the old child stays until its successor is available). Bans on fewer
// sites, or a throttle, retire nothing; each site's cooldown shows in coolingSites.
func testPoolRetire(t *testing.T, env *testenv.Env) {
	e, _ := newPoolEnvBans(t, env)
	pool := e.NewPool("burnt", 2)
	pool.Spec.MinReadySeconds = 5
	pool.Spec.Bans = &v1alpha1.PoolBans{RetireAfterSites: ptr.To[int32](3), RetireWindowSeconds: ptr.To[int32](600)}
	e.CreateSettled(pool)
	old := controllertest.Names(e.Children("burnt"))
	victim, other := old[0], old[1]

	e.report(victim, append(banned("a.com", "b.com"), bans.Report{Site: "c.com", Outcome: bans.Throttled})...)
	e.report(other, banned("a.com")...)
	e.WaitProxy(victim, "cooling for 3 sites", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 3 })
	e.WaitProxy(other, "cooling for 1 site", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 1 })
	if px := e.GetProxy(victim); px.Annotations[v1alpha1.CordonAnnotation] != "" || meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionRetired) != nil {
		t.Fatalf("two bans and a throttle retired %s: %v %+v", victim, px.Annotations, px.Status.Conditions)
	}

	// Past the window, the first two bans no longer count with a third.
	e.Clock.Step(601 * time.Second)
	e.report(victim, banned("d.com")...)
	e.WaitProxy(victim, "cooling for d.com alone", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 1 })
	if px := e.GetProxy(victim); px.Annotations[v1alpha1.RetiredAnnotation] != "" {
		t.Fatalf("bans outside the window retired %s: %v", victim, px.Annotations)
	}

	e.report(victim, banned("e.com", "f.example.co.uk")...)
	px := e.WaitProxy(victim, "retired", retiredAs)
	if why := px.Annotations[v1alpha1.RetiredAnnotation]; !strings.Contains(why, "banned on 3 sites within 10m0s") || !strings.Contains(why, "d.com, e.com, f.example.co.uk") {
		t.Errorf("retired annotation %q: want the count, the window and the sites", why)
	}
	if evs := e.WaitProxyEvents(victim, v1alpha1.ConditionRetired, "one", controllertest.AtLeast(1)); len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning: Cordoned: banned on 3 sites") {
		t.Errorf("events of %s: %q, want one Warning Retired", victim, evs)
	}

	// Surge-first: a successor is made while the retired child is kept until the
	// successor is available.
	e.WaitPool("burnt", "a successor Ready", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return len(kids) == 3 && p.Status.ReadyReplicas == 3
	})
	controllertest.Consistently(t, "the retired child kept until its successor is available", func() (bool, error) {
		return slices.Contains(controllertest.Names(e.Children("burnt")), victim), nil
	})
	e.Clock.Step(5 * time.Second)
	e.Poke("burnt")
	e.WaitSettled("burnt", 2)
	left := controllertest.Names(e.Children("burnt"))
	if slices.Contains(left, victim) || !slices.Contains(left, other) {
		t.Fatalf("children %v: want %s replaced and %s kept", left, victim, other)
	}
	if px := e.GetProxy(other); px.Annotations[v1alpha1.CordonAnnotation] != "" {
		t.Errorf("%s, banned on one site, was cordoned: %v", other, px.Annotations)
	}
}

// A pool's saturatedSites and Saturated condition follow its serving children's
// cooldowns: a site for which more than maxCoolingPercent of them cool is saturated
// until a cooldown ends. The pool reconciler's own status writes leave them alone.
func testPoolSaturated(t *testing.T, env *testenv.Env) {
	e, _ := newPoolEnvBans(t, env)
	pool := e.NewPool("sat", 3)
	pool.Spec.Bans = &v1alpha1.PoolBans{MaxCoolingPercent: ptr.To[int32](50), RetireAfterSites: ptr.To[int32](0)}
	e.CreateSettled(pool)
	kids := controllertest.Names(e.Children("sat"))
	e.WaitPool("sat", "Saturated=False", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		c := controllertest.PoolCondition(p, v1alpha1.PoolConditionSaturated)
		return c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.PoolReasonNoSiteSaturated && p.Status.SaturatedSites == 0
	})

	// a.com: 2 of 3 cool (67% > 50%): saturated; b.com: 1 of 3: not; c.com: 3 of 3.
	e.report(kids[0], banned("a.com", "b.com", "c.com")...)
	e.report(kids[1], append(banned("a.com"), bans.Report{Site: "c.com", Outcome: bans.Throttled, RetryAfter: 30 * time.Second})...)
	e.report(kids[2], banned("c.com")...)
	p := e.WaitPool("sat", "2 saturated sites, c.com with 3 children cooling", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return p.Status.SaturatedSites == 2 && strings.HasSuffix(controllertest.PoolCondition(p, v1alpha1.PoolConditionSaturated).Message, "(3), a.com (2)")
	})
	c := controllertest.PoolCondition(p, v1alpha1.PoolConditionSaturated)
	if c.Reason != v1alpha1.PoolReasonSitesSaturated || !strings.Contains(c.Message, "2 sites have more than 50% of the 3 serving children cooling") ||
		!strings.HasSuffix(c.Message, ": c.com (3), a.com (2)") {
		t.Errorf("Saturated condition %+v: want the count, the threshold and c.com before a.com", c)
	}
	// The pool reconciler writes its status (a scale up) without taking the field over.
	e.Update("sat", func(p *v1alpha1.ProxyPool) { p.Spec.Replicas = ptr.To[int32](4) })
	e.WaitPool("sat", "4 children Ready", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool { return p.Status.ReadyReplicas == 4 })
	if pc := testenv.StatusManagers(e.GetPool("sat"))[statusapply.ProxyPoolController]; pc == "" || strings.Contains(pc, "saturatedSites") || strings.Contains(pc, "Saturated") {
		t.Errorf("the pool reconciler's status fields %s: want them without saturatedSites and Saturated", pc)
	}
	// With 4 serving children, a.com's 2 are 50%: no longer saturated; c.com's 3 are.
	e.WaitPool("sat", "c.com alone saturated", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return p.Status.SaturatedSites == 1 && strings.HasSuffix(controllertest.PoolCondition(p, v1alpha1.PoolConditionSaturated).Message, ": c.com (3)")
	})
	// The throttle ends after 30s: c.com 2 of 4, nothing saturated once the controller
	// counts again at that end.
	e.Clock.Step(31 * time.Second)
	e.report(kids[0], bans.Report{Site: "z.com", Outcome: bans.Throttled}) // a change, so that the fake clock's time is read
	e.WaitPool("sat", "nothing saturated after the throttle", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return p.Status.SaturatedSites == 0 && controllertest.PoolCondition(p, v1alpha1.PoolConditionSaturated).Status == metav1.ConditionFalse
	})
}

// A standalone Proxy banned on --ban-retire-after-sites sites is cordoned, with the
// retired annotation, the Retired condition and a Warning event; it is not retired
// again once a user uncordons it while the annotation stays.
func TestStandaloneProxyRetired(t *testing.T) {
	t.Parallel()
	env := shared.Env(t)
	e, br := newPoolEnvBans(t, env)
	px := testbuild.Proxy(e.NS, "solo", testbuild.External("192.0.2.7"))
	if err := e.C.Create(e.Ctx, px); err != nil {
		t.Fatal(err)
	}
	e.report("solo", banned("a.com", "b.com", "c.com", "d.com")...)
	e.WaitProxy("solo", "cooling for 4 sites", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 4 })
	if px := e.GetProxy("solo"); px.Annotations[v1alpha1.CordonAnnotation] != "" {
		t.Fatalf("4 sites retired it (default 5): %v", px.Annotations)
	}
	e.report("solo", banned("e.com")...)
	e.WaitProxy("solo", "retired", retiredAs)
	if evs := e.WaitProxyEvents("solo", v1alpha1.ConditionRetired, "one", controllertest.AtLeast(1)); len(evs) != 1 {
		t.Errorf("events %q, want one", evs)
	}
	// Uncordoned by hand: the condition goes, the proxy is not cordoned again.
	e.PatchChild("solo", false, func(px *v1alpha1.Proxy) { delete(px.Annotations, v1alpha1.CordonAnnotation) })
	e.WaitProxy("solo", "no Retired condition", func(px *v1alpha1.Proxy) bool {
		return meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionRetired) == nil
	})
	e.report("solo", banned("f.com")...)
	e.WaitProxy("solo", "cooling for 6 sites", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 6 })
	controllertest.Consistently(t, "not cordoned again", func() (bool, error) {
		px := e.GetProxy("solo")
		return px.Annotations[v1alpha1.CordonAnnotation] == "", fmt.Errorf("annotations %v", px.Annotations)
	})
	// The controller counts again when the next cooldown ends, without any report: it
	// asks to be run then (the fake clock does not move the workqueue's real timer, so
	// the test makes that run itself).
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: e.NS, Name: "solo"}}
	first := e.GetProxy("solo").Status.Cooldowns[0].Until.Time // a.com, the earliest
	res, err := br.reconcileProxy(e.Ctx, req)
	if want := first.Sub(e.Clock.Now()); err != nil || res.RequeueAfter != want {
		t.Fatalf("reconcile = %+v, %v; want a requeue after %v, when a.com's cooldown ends", res, err, want)
	}
	e.Clock.Step(bans.DefaultCooldown + time.Second)
	if res, err := br.reconcileProxy(e.Ctx, req); err != nil || res.RequeueAfter != 0 {
		t.Fatalf("reconcile after the cooldowns = %+v, %v; want no requeue", res, err)
	}
	e.WaitProxy("solo", "cooling for no site once the cooldowns end", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 0 })
}

// A pool retires at most its budget of children per hour (10% of 3 replicas: 1),
// however many are banned on enough sites; the others keep serving and cool for each
// site. The count is in the pool's status, so it outlives the retired child and a
// restarted manager; an hour later the budget frees and the most burnt child goes next.
func TestPoolRetirementBudget(t *testing.T) {
	t.Parallel()
	e, _ := newPoolEnvBans(t, shared.Env(t))
	pool := e.NewPool("budget", 3)
	pool.Spec.Bans = &v1alpha1.PoolBans{RetireAfterSites: ptr.To[int32](3), RetireWindowSeconds: ptr.To[int32](7200)}
	e.CreateSettled(pool)
	e.WaitPool("budget", "a budget of 1 shown, nothing retired", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		r := p.Status.Retirements
		return r != nil && r.PerHour == 1 && len(r.Recent) == 0 && r.HeldBack == 0 && r.NextFreeAt == nil
	})
	kids := controllertest.Names(e.Children("budget"))
	for _, k := range kids {
		e.report(k, banned("a.com", "b.com", "c.com", "d.com", "e.com")...)
	}
	p := e.WaitPool("budget", "one retired, two held back", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		r := p.Status.Retirements
		return r != nil && len(r.Recent) == 1 && r.HeldBack == 2 && r.NextFreeAt != nil
	})
	r := p.Status.Retirements
	first := r.Recent[0].Proxy
	if first != kids[0] || !r.NextFreeAt.Time.Equal(r.Recent[0].At.Add(time.Hour)) {
		t.Errorf("status.retirements %+v: want %s (first by name among equals) retired, the budget freeing an hour after", r, kids[0])
	}
	e.WaitProxy(first, "retired", retiredAs)
	held := slices.DeleteFunc(slices.Clone(kids), func(n string) bool { return n == first })
	servingAndCooling := func(sites int32) func() (bool, error) {
		return func() (bool, error) {
			for _, name := range held {
				px := e.GetProxy(name)
				if px.Annotations[v1alpha1.CordonAnnotation] != "" || px.Annotations[v1alpha1.RetiredAnnotation] != "" || !serving(px) || px.Status.CoolingSites < sites {
					return false, fmt.Errorf("held-back child %s: annotations %v, serving %v, coolingSites %d", name, px.Annotations, serving(px), px.Status.CoolingSites)
				}
			}
			return true, nil
		}
	}
	testutil.WaitFor(t, testutil.WaitLong, "the held-back children cooling for 5 sites", servingAndCooling(5))
	controllertest.Consistently(t, "the held-back children serving, not retired", servingAndCooling(5))
	// Each report that adds a held-back child says so (the reports came one child at a
	// time): the last names both.
	want := fmt.Sprintf("retirement held back for %s by the budget (spec.bans.maxRetirementsPerHour: 1 per hour, 10%% of 3 replicas); "+
		"retired within the last hour: %s; the budget frees at %s; they keep serving, cooling for each site they were banned on",
		strings.Join(held, ", "), first, r.NextFreeAt.UTC().Format(time.RFC3339))
	evs := e.WaitPoolEvents("budget", ReasonRetirementHeldBack, "one naming both held-back children", func(evs []string) bool { return slices.Contains(evs, want) })
	if len(evs) > 2 {
		t.Errorf("%s events of the pool: %q, want at most two, one of them %q", ReasonRetirementHeldBack, evs, want)
	}

	// A further ban still cools the held-back child for that site.
	e.report(held[1], banned("f.com")...)
	e.WaitProxy(held[1], "cooling for f.com too", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 6 })

	// The retired child is replaced and gone; its retirement still counts.
	e.WaitSettled("budget", 3)
	if now := controllertest.Names(e.Children("budget")); slices.Contains(now, first) {
		t.Fatalf("children %v: want %s replaced", now, first)
	}
	// A restarted manager keeps nothing in memory: a new reconciler counts from the
	// pool's status and retires no one.
	fresh := &BansReconciler{Client: e.C, Policy: bans.DefaultPolicy, Clock: e.Clock}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: e.NS, Name: "budget"}}
	if _, err := fresh.reconcilePool(e.Ctx, req); err != nil {
		t.Fatalf("reconcile by a new reconciler: %v", err)
	}
	controllertest.Consistently(t, "still one retirement after the restart", servingAndCooling(0))
	if r := e.GetPool("budget").Status.Retirements; len(r.Recent) != 1 || r.Recent[0].Proxy != first || r.HeldBack != 2 {
		t.Fatalf("status.retirements after the restart %+v: want %s's retirement and 2 held back", r, first)
	}

	// An hour later the budget frees: the child banned on the most sites goes next.
	e.Clock.Step(time.Hour + time.Second)
	if _, err := fresh.reconcilePool(e.Ctx, req); err != nil {
		t.Fatalf("reconcile an hour later: %v", err)
	}
	e.WaitProxy(held[1], "retired once the budget freed", retiredAs)
	e.WaitPool("budget", "the second retirement recorded, one held back", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		r := p.Status.Retirements
		return r != nil && len(r.Recent) == 1 && r.Recent[0].Proxy == held[1] && r.HeldBack == 1
	})
	if px := e.GetProxy(held[0]); px.Annotations[v1alpha1.CordonAnnotation] != "" {
		t.Errorf("%s retired with the second retirement: %v", held[0], px.Annotations)
	}
}
