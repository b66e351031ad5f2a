package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// newPoolEnvBans is a pool env whose manager also runs the ban controller on the fake
// clock, with the default policy (standalone Proxies and pools without spec.bans).
func newPoolEnvBans(t *testing.T, env *testenv.Env) (*poolEnv, *BansReconciler) {
	br := &BansReconciler{Policy: bans.DefaultPolicy}
	e := newPoolEnvSetup(t, env, 10, 20*time.Millisecond, nil, func(mgr ctrl.Manager, clk *clocktesting.FakeClock) {
		br.Client, br.Recorder, br.Clock = mgr.GetClient(), mgr.GetEventRecorder("proxy-bans"), clk
		if err := br.SetupWithManager(mgr); err != nil {
			t.Fatalf("setting up the ban controller: %v", err)
		}
	})
	return e, br
}

// report writes reports about the Proxy name as a replica's feedback recorder does, at
// the env's fake clock.
func (e *poolEnv) report(name string, reps ...bans.Report) {
	e.t.Helper()
	rec := &bans.Recorder{Client: e.c, Reader: e.c, APIReader: e.c, Clock: e.clock, Policy: bans.DefaultPolicy}
	for _, r := range reps {
		rec.Add(types.NamespacedName{Namespace: e.ns, Name: name}, r)
	}
	rec.Flush(e.ctx)
	if rec.Writes() != 1 {
		e.t.Fatalf("the recorder wrote proxy %s %d times, want once", name, rec.Writes())
	}
}

func banned(sites ...string) []bans.Report {
	out := make([]bans.Report, len(sites))
	for i, s := range sites {
		out[i] = bans.Report{Site: s, Outcome: bans.Banned}
	}
	return out
}

// proxyEvents are the type and note of the Events about Proxy name with reason.
func (e *poolEnv) proxyEvents(name, reason string) []string {
	e.t.Helper()
	var out []string
	for _, ev := range e.events("Proxy", name, reason) {
		out = append(out, ev.Type+": "+ev.Note)
	}
	return out
}

func (e *poolEnv) getProxy(name string) *v1alpha1.Proxy {
	e.t.Helper()
	px := &v1alpha1.Proxy{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, px); err != nil {
		e.t.Fatalf("getting proxy %s: %v", name, err)
	}
	return px
}

// waitProxy waits until the Proxy name satisfies cond.
func (e *poolEnv) waitProxy(name, what string, cond func(*v1alpha1.Proxy) bool) *v1alpha1.Proxy {
	e.t.Helper()
	var px *v1alpha1.Proxy
	waitFor(e.t, waitLong, "proxy "+name+": "+what, func() (bool, error) {
		px = &v1alpha1.Proxy{}
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: name}, px); err != nil {
			return false, err
		}
		return cond(px), fmt.Errorf("annotations %v, coolingSites %d, conditions %+v", px.Annotations, px.Status.CoolingSites, px.Status.Conditions)
	})
	return px
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
	pool := e.newPool("burnt", 2)
	pool.Spec.MinReadySeconds = 5
	pool.Spec.Bans = &v1alpha1.PoolBans{RetireAfterSites: ptr.To[int32](3), RetireWindowSeconds: ptr.To[int32](600)}
	e.createSettled(pool)
	old := names(e.children("burnt"))
	victim, other := old[0], old[1]

	e.report(victim, append(banned("a.com", "b.com"), bans.Report{Site: "c.com", Outcome: bans.Throttled})...)
	e.report(other, banned("a.com")...)
	e.waitProxy(victim, "cooling for 3 sites", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 3 })
	e.waitProxy(other, "cooling for 1 site", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 1 })
	if px := e.getProxy(victim); px.Annotations[v1alpha1.CordonAnnotation] != "" || meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionRetired) != nil {
		t.Fatalf("two bans and a throttle retired %s: %v %+v", victim, px.Annotations, px.Status.Conditions)
	}

	// Past the window, the first two bans no longer count with a third.
	e.clock.Step(601 * time.Second)
	e.report(victim, banned("d.com")...)
	e.waitProxy(victim, "cooling for d.com alone", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 1 })
	if px := e.getProxy(victim); px.Annotations[v1alpha1.RetiredAnnotation] != "" {
		t.Fatalf("bans outside the window retired %s: %v", victim, px.Annotations)
	}

	e.report(victim, banned("e.com", "f.example.co.uk")...)
	px := e.waitProxy(victim, "retired", retiredAs)
	if why := px.Annotations[v1alpha1.RetiredAnnotation]; !strings.Contains(why, "banned on 3 sites within 10m0s") || !strings.Contains(why, "d.com, e.com, f.example.co.uk") {
		t.Errorf("retired annotation %q: want the count, the window and the sites", why)
	}
	if evs := e.proxyEvents(victim, v1alpha1.ConditionRetired); len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning: Cordoned: banned on 3 sites") {
		t.Errorf("events of %s: %q, want one Warning Retired", victim, evs)
	}

	// Surge-first: a successor is made while the retired child is kept until the
	// successor is available.
	e.waitPool("burnt", "a successor Ready", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return len(kids) == 3 && p.Status.ReadyReplicas == 3
	})
	consistently(t, "the retired child kept until its successor is available", func() (bool, error) {
		return slices.Contains(names(e.children("burnt")), victim), nil
	})
	e.clock.Step(5 * time.Second)
	e.poke("burnt")
	e.waitSettled("burnt", 2)
	left := names(e.children("burnt"))
	if slices.Contains(left, victim) || !slices.Contains(left, other) {
		t.Fatalf("children %v: want %s replaced and %s kept", left, victim, other)
	}
	if px := e.getProxy(other); px.Annotations[v1alpha1.CordonAnnotation] != "" {
		t.Errorf("%s, banned on one site, was cordoned: %v", other, px.Annotations)
	}
}

// A pool's saturatedSites and Saturated condition follow its serving children's
// cooldowns: a site for which more than maxCoolingPercent of them cool is saturated
// until a cooldown ends. The pool reconciler's own status writes leave them alone.
func testPoolSaturated(t *testing.T, env *testenv.Env) {
	e, _ := newPoolEnvBans(t, env)
	pool := e.newPool("sat", 3)
	pool.Spec.Bans = &v1alpha1.PoolBans{MaxCoolingPercent: ptr.To[int32](50), RetireAfterSites: ptr.To[int32](0)}
	e.createSettled(pool)
	kids := names(e.children("sat"))
	e.waitPool("sat", "Saturated=False", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		c := poolCondition(p, v1alpha1.PoolConditionSaturated)
		return c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.PoolReasonNoSiteSaturated && p.Status.SaturatedSites == 0
	})

	// a.com: 2 of 3 cool (67% > 50%): saturated; b.com: 1 of 3: not; c.com: 3 of 3.
	e.report(kids[0], banned("a.com", "b.com", "c.com")...)
	e.report(kids[1], append(banned("a.com"), bans.Report{Site: "c.com", Outcome: bans.Throttled, RetryAfter: 30 * time.Second})...)
	e.report(kids[2], banned("c.com")...)
	p := e.waitPool("sat", "2 saturated sites, c.com with 3 children cooling", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return p.Status.SaturatedSites == 2 && strings.HasSuffix(poolCondition(p, v1alpha1.PoolConditionSaturated).Message, "(3), a.com (2)")
	})
	c := poolCondition(p, v1alpha1.PoolConditionSaturated)
	if c.Reason != v1alpha1.PoolReasonSitesSaturated || !strings.Contains(c.Message, "2 sites have more than 50% of the 3 serving children cooling") ||
		!strings.HasSuffix(c.Message, ": c.com (3), a.com (2)") {
		t.Errorf("Saturated condition %+v: want the count, the threshold and c.com before a.com", c)
	}
	// The pool reconciler writes its status (a scale up) without taking the field over.
	e.update("sat", func(p *v1alpha1.ProxyPool) { p.Spec.Replicas = ptr.To[int32](4) })
	e.waitPool("sat", "4 children Ready", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool { return p.Status.ReadyReplicas == 4 })
	if pc := testenv.StatusManagers(e.getPool("sat"))[statusapply.ProxyPoolController]; pc == "" || strings.Contains(pc, "saturatedSites") || strings.Contains(pc, "Saturated") {
		t.Errorf("the pool reconciler's status fields %s: want them without saturatedSites and Saturated", pc)
	}
	// With 4 serving children, a.com's 2 are 50%: no longer saturated; c.com's 3 are.
	e.waitPool("sat", "c.com alone saturated", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return p.Status.SaturatedSites == 1 && strings.HasSuffix(poolCondition(p, v1alpha1.PoolConditionSaturated).Message, ": c.com (3)")
	})
	// The throttle ends after 30s: c.com 2 of 4, nothing saturated once the controller
	// counts again at that end.
	e.clock.Step(31 * time.Second)
	e.report(kids[0], bans.Report{Site: "z.com", Outcome: bans.Throttled}) // a change, so that the fake clock's time is read
	e.waitPool("sat", "nothing saturated after the throttle", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return p.Status.SaturatedSites == 0 && poolCondition(p, v1alpha1.PoolConditionSaturated).Status == metav1.ConditionFalse
	})
}

// A standalone Proxy banned on --ban-retire-after-sites sites is cordoned, with the
// retired annotation, the Retired condition and a Warning event; it is not retired
// again once a user uncordons it while the annotation stays.
func TestStandaloneProxyRetired(t *testing.T) {
	env := shared.Env(t)
	e, br := newPoolEnvBans(t, env)
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "solo"},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "192.0.2.7"}}
	if err := e.c.Create(e.ctx, px); err != nil {
		t.Fatal(err)
	}
	e.report("solo", banned("a.com", "b.com", "c.com", "d.com")...)
	e.waitProxy("solo", "cooling for 4 sites", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 4 })
	if px := e.getProxy("solo"); px.Annotations[v1alpha1.CordonAnnotation] != "" {
		t.Fatalf("4 sites retired it (default 5): %v", px.Annotations)
	}
	e.report("solo", banned("e.com")...)
	e.waitProxy("solo", "retired", retiredAs)
	if evs := e.proxyEvents("solo", v1alpha1.ConditionRetired); len(evs) != 1 {
		t.Errorf("events %q, want one", evs)
	}
	// Uncordoned by hand: the condition goes, the proxy is not cordoned again.
	e.patchChild("solo", false, func(px *v1alpha1.Proxy) { delete(px.Annotations, v1alpha1.CordonAnnotation) })
	e.waitProxy("solo", "no Retired condition", func(px *v1alpha1.Proxy) bool {
		return meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionRetired) == nil
	})
	e.report("solo", banned("f.com")...)
	e.waitProxy("solo", "cooling for 6 sites", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 6 })
	consistently(t, "not cordoned again", func() (bool, error) {
		px := e.getProxy("solo")
		return px.Annotations[v1alpha1.CordonAnnotation] == "", fmt.Errorf("annotations %v", px.Annotations)
	})
	// The controller counts again when the next cooldown ends, without any report: it
	// asks to be run then (the fake clock does not move the workqueue's real timer, so
	// the test makes that run itself).
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: e.ns, Name: "solo"}}
	first := e.getProxy("solo").Status.Cooldowns[0].Until.Time // a.com, the earliest
	res, err := br.reconcileProxy(e.ctx, req)
	if want := first.Sub(e.clock.Now()); err != nil || res.RequeueAfter != want {
		t.Fatalf("reconcile = %+v, %v; want a requeue after %v, when a.com's cooldown ends", res, err, want)
	}
	e.clock.Step(bans.DefaultCooldown + time.Second)
	if res, err := br.reconcileProxy(e.ctx, req); err != nil || res.RequeueAfter != 0 {
		t.Fatalf("reconcile after the cooldowns = %+v, %v; want no requeue", res, err)
	}
	e.waitProxy("solo", "cooling for no site once the cooldowns end", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 0 })
}

// A pool retires at most its budget of children per hour (10% of 3 replicas: 1),
// however many are banned on enough sites; the others keep serving and cool for each
// site. The count is in the pool's status, so it outlives the retired child and a
// restarted manager; an hour later the budget frees and the most burnt child goes next.
func TestPoolRetirementBudget(t *testing.T) {
	e, _ := newPoolEnvBans(t, shared.Env(t))
	pool := e.newPool("budget", 3)
	pool.Spec.Bans = &v1alpha1.PoolBans{RetireAfterSites: ptr.To[int32](3), RetireWindowSeconds: ptr.To[int32](7200)}
	e.createSettled(pool)
	e.waitPool("budget", "a budget of 1 shown, nothing retired", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		r := p.Status.Retirements
		return r != nil && r.PerHour == 1 && len(r.Recent) == 0 && r.HeldBack == 0 && r.NextFreeAt == nil
	})
	kids := names(e.children("budget"))
	for _, k := range kids {
		e.report(k, banned("a.com", "b.com", "c.com", "d.com", "e.com")...)
	}
	p := e.waitPool("budget", "one retired, two held back", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		r := p.Status.Retirements
		return r != nil && len(r.Recent) == 1 && r.HeldBack == 2 && r.NextFreeAt != nil
	})
	r := p.Status.Retirements
	first := r.Recent[0].Proxy
	if first != kids[0] || !r.NextFreeAt.Time.Equal(r.Recent[0].At.Add(time.Hour)) {
		t.Errorf("status.retirements %+v: want %s (first by name among equals) retired, the budget freeing an hour after", r, kids[0])
	}
	e.waitProxy(first, "retired", retiredAs)
	held := slices.DeleteFunc(slices.Clone(kids), func(n string) bool { return n == first })
	servingAndCooling := func(sites int32) func() (bool, error) {
		return func() (bool, error) {
			for _, name := range held {
				px := e.getProxy(name)
				if px.Annotations[v1alpha1.CordonAnnotation] != "" || px.Annotations[v1alpha1.RetiredAnnotation] != "" || !serving(px) || px.Status.CoolingSites < sites {
					return false, fmt.Errorf("held-back child %s: annotations %v, serving %v, coolingSites %d", name, px.Annotations, serving(px), px.Status.CoolingSites)
				}
			}
			return true, nil
		}
	}
	waitFor(t, waitLong, "the held-back children cooling for 5 sites", servingAndCooling(5))
	consistently(t, "the held-back children serving, not retired", servingAndCooling(5))
	// Each report that adds a held-back child says so (the reports came one child at a
	// time): the last names both.
	evs := e.poolEvents("budget", ReasonRetirementHeldBack)
	want := fmt.Sprintf("retirement held back for %s by the budget (spec.bans.maxRetirementsPerHour: 1 per hour, 10%% of 3 replicas); "+
		"retired within the last hour: %s; the budget frees at %s; they keep serving, cooling for each site they were banned on",
		strings.Join(held, ", "), first, r.NextFreeAt.UTC().Format(time.RFC3339))
	if !slices.Contains(evs, want) || len(evs) > 2 {
		t.Errorf("%s events of the pool: %q, want at most two, one of them %q", ReasonRetirementHeldBack, evs, want)
	}

	// A further ban still cools the held-back child for that site.
	e.report(held[1], banned("f.com")...)
	e.waitProxy(held[1], "cooling for f.com too", func(px *v1alpha1.Proxy) bool { return px.Status.CoolingSites == 6 })

	// The retired child is replaced and gone; its retirement still counts.
	e.waitSettled("budget", 3)
	if now := names(e.children("budget")); slices.Contains(now, first) {
		t.Fatalf("children %v: want %s replaced", now, first)
	}
	// A restarted manager keeps nothing in memory: a new reconciler counts from the
	// pool's status and retires no one.
	fresh := &BansReconciler{Client: e.c, Policy: bans.DefaultPolicy, Clock: e.clock}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: e.ns, Name: "budget"}}
	if _, err := fresh.reconcilePool(e.ctx, req); err != nil {
		t.Fatalf("reconcile by a new reconciler: %v", err)
	}
	consistently(t, "still one retirement after the restart", servingAndCooling(0))
	if r := e.getPool("budget").Status.Retirements; len(r.Recent) != 1 || r.Recent[0].Proxy != first || r.HeldBack != 2 {
		t.Fatalf("status.retirements after the restart %+v: want %s's retirement and 2 held back", r, first)
	}

	// An hour later the budget frees: the child banned on the most sites goes next.
	e.clock.Step(time.Hour + time.Second)
	if _, err := fresh.reconcilePool(e.ctx, req); err != nil {
		t.Fatalf("reconcile an hour later: %v", err)
	}
	e.waitProxy(held[1], "retired once the budget freed", retiredAs)
	e.waitPool("budget", "the second retirement recorded, one held back", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		r := p.Status.Retirements
		return r != nil && len(r.Recent) == 1 && r.Recent[0].Proxy == held[1] && r.HeldBack == 1
	})
	if px := e.getProxy(held[0]); px.Annotations[v1alpha1.CordonAnnotation] != "" {
		t.Errorf("%s retired with the second retirement: %v", held[0], px.Annotations)
	}
}
