package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// testHoldFinalizer keeps a child's deletion from finishing, as a provider that cannot
// remove the instance would.
const testHoldFinalizer = "test.egress.hrajfrisbee.cz/hold"

// holdWhere keeps the health loop off the children cond picks (they stay Running).
func (e *poolEnv) holdWhere(cond func(*v1alpha1.Proxy) bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.holdIf = cond
}

func (e *poolEnv) setFinalizer(name string, on bool) {
	e.patchChild(name, false, func(px *v1alpha1.Proxy) {
		if on {
			px.Finalizers = append(px.Finalizers, testHoldFinalizer)
		} else {
			px.Finalizers = slices.DeleteFunc(px.Finalizers, func(f string) bool { return f == testHoldFinalizer })
		}
	})
}

// newDeadlinePool makes a settled pool of 2 with progressDeadlineSeconds 60 and returns
// its children's names.
func newDeadlinePool(t *testing.T, env *testenv.Env, name string) (*poolEnv, []string) {
	e := newPoolEnv(t, env)
	pool := e.newPool(name, 2)
	pool.Spec.ProgressDeadlineSeconds = ptr.To[int32](60)
	e.createSettled(pool)
	return e, names(e.children(name))
}

// waitProgressing waits for the pool's Progressing condition to have status and reason.
func (e *poolEnv) waitProgressing(pool string, status metav1.ConditionStatus, reason string) metav1.Condition {
	e.t.Helper()
	p := e.waitPool(pool, fmt.Sprintf("Progressing=%s %s", status, reason), func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		c := poolCondition(p, v1alpha1.PoolConditionProgressing)
		return c.Status == status && c.Reason == reason
	})
	return poolCondition(p, v1alpha1.PoolConditionProgressing)
}

// A rollout held by a child that cannot finish deleting reports
// ProgressDeadlineExceeded once the deadline passes without progress, naming the child
// and since when, with one Warning event; it clears and completes once the child goes.
func testPoolStuckDeleting(t *testing.T, env *testenv.Env) {
	e, old := newDeadlinePool(t, env, "held")
	for _, n := range old {
		e.setFinalizer(n, true)
	}
	e.update("held", func(p *v1alpha1.ProxyPool) { p.Spec.Template.Spec.Placement.Image = "debian-13" })
	var stuck string
	e.waitPool("held", "an old child deleting, held", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		for _, k := range kids {
			if !k.DeletionTimestamp.IsZero() {
				stuck = k.Name
			}
		}
		return stuck != "" && len(kids) == 3
	})
	e.clock.Step(59 * time.Second)
	e.poke("held")
	consistently(t, "no stall reported before the deadline", func() (bool, error) {
		c := poolCondition(e.getPool("held"), v1alpha1.PoolConditionProgressing)
		return c.Reason != v1alpha1.PoolReasonProgressDeadlineExceeded, fmt.Errorf("Progressing %+v", c)
	})
	e.clock.Step(2 * time.Second)
	e.poke("held")
	c := e.waitProgressing("held", metav1.ConditionFalse, v1alpha1.PoolReasonProgressDeadlineExceeded)
	if !strings.Contains(c.Message, "stuck deleting: "+stuck+" since ") || !strings.Contains(c.Message, "60s (progressDeadlineSeconds)") {
		t.Errorf("Progressing message %q does not name %s stuck deleting and the deadline", c.Message, stuck)
	}
	e.poke("held") // another pass: still one event
	e.waitPool("held", "the poke seen", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return p.Status.ObservedGeneration == p.Generation
	})
	if evs := e.poolEvents("held", EventProgressDeadlineExceeded); len(evs) != 1 || !strings.Contains(evs[0], stuck) {
		t.Errorf("ProgressDeadlineExceeded events %q, want one naming %s", evs, stuck)
	}
	for _, n := range old {
		e.setFinalizer(n, false)
	}
	e.waitProgressing("held", metav1.ConditionFalse, v1alpha1.PoolReasonComplete)
	e.waitSettled("held", 2)
}

// A new-template child that never becomes Ready (its probe refused) holds a rollout
// without maxAge: the pool reports ProgressDeadlineExceeded naming it and its last probe
// error, keeps the old children, and goes on once the child becomes Ready.
func testPoolNeverReady(t *testing.T, env *testenv.Env) {
	e, old := newDeadlinePool(t, env, "mute")
	e.holdWhere(func(px *v1alpha1.Proxy) bool { return px.Spec.Placement.Image == "debian-13" })
	e.update("mute", func(p *v1alpha1.ProxyPool) { p.Spec.Template.Spec.Placement.Image = "debian-13" })
	mute := e.waitNewChild("mute", old, v1alpha1.PhaseRunning)
	const probeErr = "probes failing; last: proxy answered 403 Forbidden (the probe's source is not in allowedSourceRanges)"
	e.patchChild(mute, true, func(px *v1alpha1.Proxy) {
		meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonProbeFailed, Message: probeErr,
		})
	})
	e.clock.Step(61 * time.Second)
	e.poke("mute")
	c := e.waitProgressing("mute", metav1.ConditionFalse, v1alpha1.PoolReasonProgressDeadlineExceeded)
	e.waitGauges("mute", "stalled past the deadline", gauges(2, 3, 2, 2, 1, 2, 1))
	if !strings.Contains(c.Message, "never Ready: "+mute+" ("+probeErr+")") {
		t.Errorf("Progressing message %q does not name %s and its probe error", c.Message, mute)
	}
	consistently(t, "both old children kept", func() (bool, error) {
		kids := e.children("mute")
		live := 0
		for _, k := range kids {
			if slices.Contains(old, k.Name) && k.DeletionTimestamp.IsZero() {
				live++
			}
		}
		return live == 2 && len(kids) == 3, fmt.Errorf("children %s", describe(kids))
	})
	if evs := e.poolEvents("mute", EventProgressDeadlineExceeded); len(evs) != 1 {
		t.Errorf("ProgressDeadlineExceeded events %q, want one", evs)
	}
	e.holdWhere(nil)
	e.waitSettled("mute", 2)
	if c := poolCondition(e.getPool("mute"), v1alpha1.PoolConditionProgressing); c.Reason != v1alpha1.PoolReasonComplete {
		t.Errorf("Progressing %+v after the rollout, want Complete", c)
	}
	e.waitGauges("mute", "no longer stalled", gauges(2, 2, 2, 2, 2, 2, 0))
}

// Rotation leaves a booting child alone even past maxAge, while it is within
// progressDeadlineSeconds of its birth; past that, never Ready, it is replaced as stuck.
func testPoolRotationStuck(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.newPool("boot", 1)
	pool.Spec.Rotation = v1alpha1.PoolRotation{MaxAge: &metav1.Duration{Duration: 2 * time.Minute}}
	two := intstr.FromInt32(2)
	pool.Spec.Strategy.RollingUpdate.MaxSurge = &two
	e.createSettled(pool)
	first := e.children("boot")[0].Name
	e.holdWhere(func(px *v1alpha1.Proxy) bool { return px.Name != first })
	e.clock.Step(2 * time.Minute) // the first child is past maxAge
	e.poke("boot")
	booting := e.waitNewChild("boot", []string{first}, v1alpha1.PhaseRunning)
	e.clock.Step(5 * time.Minute) // the successor is past maxAge too, but within 600 s of its birth
	e.poke("boot")
	consistently(t, "the booting successor and the first child kept", func() (bool, error) {
		kids := e.children("boot")
		return len(kids) == 2 && kids[0].DeletionTimestamp.IsZero() && kids[1].DeletionTimestamp.IsZero(), fmt.Errorf("children %s", describe(kids))
	})
	// Past its progress deadline it is stuck: replaced by a child that becomes Ready.
	e.holdWhere(func(px *v1alpha1.Proxy) bool { return px.Name == booting })
	e.clock.Step(5 * time.Minute)
	e.poke("boot")
	e.waitPool("boot", "one new child, the stuck one and the first gone", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return len(kids) == 1 && kids[0].Name != first && kids[0].Name != booting && kids[0].Status.Phase == v1alpha1.PhaseReady
	})
	var stuckEv string
	for _, ev := range e.poolEvents("boot", EventChildDeleted) {
		if strings.Contains(ev, booting) {
			stuckEv = ev
		}
	}
	if !strings.Contains(stuckEv, "stuck: not Ready within progressDeadlineSeconds (600) of its birth") {
		t.Errorf("deletion event of %s: %q, want it replaced as stuck", booting, stuckEv)
	}
}

// A child whose configuration is outdated (ConfigOutdated=True, as the Proxy reconciler
// sets it after an upgrade changed the rendering) is replaced surge-first.
func testPoolConfigOutdated(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.newPool("upg", 2)
	pool.Spec.MinReadySeconds = 10
	e.createSettled(pool)
	old := names(e.children("upg"))
	b := e.watchBounds("upg", 10*time.Second)
	for _, n := range old {
		e.patchChild(n, true, func(px *v1alpha1.Proxy) {
			meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{
				Type: v1alpha1.ConditionConfigOutdated, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonRenderingChanged,
				Message: "this operator version renders another configuration",
			})
		})
	}
	for i := 0; i < 8; i++ {
		e.waitPool("upg", "the step's new children Ready", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
			for _, k := range kids {
				if !slices.Contains(old, k.Name) && k.Status.Phase != v1alpha1.PhaseReady {
					return false
				}
			}
			return len(kids) > 0
		})
		kids := e.children("upg")
		if len(kids) == 2 && !slices.Contains(old, kids[0].Name) && !slices.Contains(old, kids[1].Name) {
			break
		}
		e.clock.Step(10 * time.Second)
		e.poke("upg")
	}
	e.waitSettled("upg", 2)
	b.check(t, 3, 2)
	for _, px := range e.children("upg") {
		if slices.Contains(old, px.Name) {
			t.Errorf("outdated child %s still there", px.Name)
		}
	}
	for _, ev := range e.poolEvents("upg", EventChildDeleted) {
		if !strings.Contains(ev, "ConfigOutdated") {
			t.Errorf("deletion event %q does not say the configuration was outdated", ev)
		}
	}
}

// The template hash covers the credentials of the template's Secret: a new password
// rolls the pool; a Secret that cannot be had stops creates and deletes with
// Progressing=False CredentialsUnavailable, and the pool resumes when it is back.
func testPoolCredentials(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "pool-auth", Namespace: e.ns, Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}},
		Data:       map[string][]byte{"username": []byte("crawler"), "password": []byte("Old-pass.1")},
	}
	if err := e.c.Create(e.ctx, sec); err != nil {
		t.Fatal(err)
	}
	pool := e.newPool("auth", 2)
	pool.Spec.Template.Spec.Proxy = &v1alpha1.ProxyConfig{
		AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"},
		BasicAuth:           &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "pool-auth"}},
	}
	e.createSettled(pool)
	old := e.children("auth")
	oldHash := old[0].Labels[v1alpha1.TemplateHashLabel]
	if oldHash == TemplateHash(&e.getPool("auth").Spec.Template) {
		t.Errorf("template hash %s does not cover the credentials", oldHash)
	}

	sec.Data["password"] = []byte("New-pass.2")
	if err := e.c.Update(e.ctx, sec); err != nil {
		t.Fatal(err)
	}
	e.waitPool("auth", "2 new children from the new credentials", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		if len(kids) != 2 || p.Status.AvailableReplicas != 2 {
			return false
		}
		for _, k := range kids {
			if k.Name == old[0].Name || k.Name == old[1].Name || k.Labels[v1alpha1.TemplateHashLabel] == oldHash {
				return false
			}
		}
		return true
	})

	// The Secret goes: nothing is created or deleted, and the pool says why.
	if err := e.c.Delete(e.ctx, sec); err != nil {
		t.Fatal(err)
	}
	c := e.waitProgressing("auth", metav1.ConditionFalse, v1alpha1.PoolReasonCredentialsUnavailable)
	if !strings.Contains(c.Message, "secret "+e.ns+"/pool-auth (spec.proxy.basicAuth.secretRef) does not exist") {
		t.Errorf("Progressing message %q does not name the Secret", c.Message)
	}
	now := names(e.children("auth"))
	e.scale("auth", 3)
	consistently(t, "no child created or deleted without the Secret", func() (bool, error) {
		got := names(e.children("auth"))
		return slices.Equal(got, now), fmt.Errorf("children %v, were %v", got, now)
	})
	sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pool-auth", Namespace: e.ns, Labels: sec.Labels},
		Data: map[string][]byte{"username": []byte("crawler"), "password": []byte("New-pass.2")}}
	if err := e.c.Create(e.ctx, sec); err != nil {
		t.Fatal(err)
	}
	e.waitPool("auth", "3 children, the 2 kept", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		got := names(kids)
		return len(got) == 3 && slices.Contains(got, now[0]) && slices.Contains(got, now[1]) && p.Status.AvailableReplicas == 3
	})
}
