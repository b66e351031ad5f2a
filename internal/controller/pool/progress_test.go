package pool

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
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// testHoldFinalizer keeps a child's deletion from finishing, as a provider that cannot
// remove the instance would.
const testHoldFinalizer = "test.egress.hrajfrisbee.cz/hold"

func (e *poolEnv) setFinalizer(name string, on bool) {
	e.PatchChild(name, false, func(px *v1alpha1.Proxy) {
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
	pool := e.NewPool(name, 2)
	pool.Spec.ProgressDeadlineSeconds = ptr.To[int32](60)
	e.CreateSettled(pool)
	return e, controllertest.Names(e.Children(name))
}

// waitProgressing waits for the pool's Progressing condition to have status and reason.
func (e *poolEnv) waitProgressing(pool string, status metav1.ConditionStatus, reason string) metav1.Condition {
	e.T.Helper()
	p := e.WaitPool(pool, fmt.Sprintf("Progressing=%s %s", status, reason), func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		c := controllertest.PoolCondition(p, v1alpha1.PoolConditionProgressing)
		return c.Status == status && c.Reason == reason
	})
	return controllertest.PoolCondition(p, v1alpha1.PoolConditionProgressing)
}

// A rollout held by a child that cannot finish deleting reports
// ProgressDeadlineExceeded once the deadline passes without progress, naming the child
// and since when, with one Warning event; it clears and completes once the child goes.
func testPoolStuckDeleting(t *testing.T, env *testenv.Env) {
	e, old := newDeadlinePool(t, env, "held")
	for _, n := range old {
		e.setFinalizer(n, true)
	}
	e.Update("held", func(p *v1alpha1.ProxyPool) { p.Spec.Template.Spec.Placement.Image = "debian-13" })
	var stuck string
	e.WaitPool("held", "an old child deleting, held", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		for _, k := range kids {
			if !k.DeletionTimestamp.IsZero() {
				stuck = k.Name
			}
		}
		return stuck != "" && len(kids) == 3
	})
	e.Clock.Step(59 * time.Second)
	e.Poke("held")
	controllertest.Consistently(t, "no stall reported before the deadline", func() (bool, error) {
		c := controllertest.PoolCondition(e.GetPool("held"), v1alpha1.PoolConditionProgressing)
		return c.Reason != v1alpha1.PoolReasonProgressDeadlineExceeded, fmt.Errorf("Progressing %+v", c)
	})
	e.Clock.Step(2 * time.Second)
	e.Poke("held")
	c := e.waitProgressing("held", metav1.ConditionFalse, v1alpha1.PoolReasonProgressDeadlineExceeded)
	if !strings.Contains(c.Message, "stuck deleting: "+stuck+" since ") || !strings.Contains(c.Message, "60s (progressDeadlineSeconds)") {
		t.Errorf("Progressing message %q does not name %s stuck deleting and the deadline", c.Message, stuck)
	}
	e.Poke("held") // another pass: still one event
	e.WaitPool("held", "the poke seen", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return p.Status.ObservedGeneration == p.Generation
	})
	if evs := e.WaitPoolEvents("held", EventProgressDeadlineExceeded, "one", controllertest.AtLeast(1)); len(evs) != 1 || !strings.Contains(evs[0], stuck) {
		t.Errorf("ProgressDeadlineExceeded events %q, want one naming %s", evs, stuck)
	}
	for _, n := range old {
		e.setFinalizer(n, false)
	}
	e.waitProgressing("held", metav1.ConditionFalse, v1alpha1.PoolReasonComplete)
	e.WaitSettled("held", 2)
}

// A new-template child that never becomes Ready (its probe refused) holds a rollout
// without maxAge: the pool reports ProgressDeadlineExceeded naming it and its last probe
// error, keeps the old children, and goes on once the child becomes Ready.
func testPoolNeverReady(t *testing.T, env *testenv.Env) {
	e, old := newDeadlinePool(t, env, "mute")
	e.HoldWhere(func(px *v1alpha1.Proxy) bool { return px.Spec.Placement.Image == "debian-13" })
	e.Update("mute", func(p *v1alpha1.ProxyPool) { p.Spec.Template.Spec.Placement.Image = "debian-13" })
	mute := e.waitNewChild("mute", old, v1alpha1.PhaseRunning)
	const probeErr = "probes failing; last: proxy answered 403 Forbidden (the probe's source is not in allowedSourceRanges)"
	e.PatchChild(mute, true, func(px *v1alpha1.Proxy) {
		meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{
			Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonProbeFailed, Message: probeErr,
		})
	})
	e.Clock.Step(61 * time.Second)
	e.Poke("mute")
	c := e.waitProgressing("mute", metav1.ConditionFalse, v1alpha1.PoolReasonProgressDeadlineExceeded)
	e.waitGauges("mute", "stalled past the deadline", gauges(2, 3, 2, 2, 1, 2, 1))
	if !strings.Contains(c.Message, "never Ready: "+mute+" ("+probeErr+")") {
		t.Errorf("Progressing message %q does not name %s and its probe error", c.Message, mute)
	}
	controllertest.Consistently(t, "both old children kept", func() (bool, error) {
		kids := e.Children("mute")
		live := 0
		for _, k := range kids {
			if slices.Contains(old, k.Name) && k.DeletionTimestamp.IsZero() {
				live++
			}
		}
		return live == 2 && len(kids) == 3, fmt.Errorf("children %s", controllertest.Describe(kids))
	})
	if evs := e.WaitPoolEvents("mute", EventProgressDeadlineExceeded, "one", controllertest.AtLeast(1)); len(evs) != 1 {
		t.Errorf("ProgressDeadlineExceeded events %q, want one", evs)
	}
	e.HoldWhere(nil)
	e.WaitSettled("mute", 2)
	if c := controllertest.PoolCondition(e.GetPool("mute"), v1alpha1.PoolConditionProgressing); c.Reason != v1alpha1.PoolReasonComplete {
		t.Errorf("Progressing %+v after the rollout, want Complete", c)
	}
	e.waitGauges("mute", "no longer stalled", gauges(2, 2, 2, 2, 2, 2, 0))
}

// Rotation leaves a booting child alone even past maxAge, while it is within
// progressDeadlineSeconds of its birth; past that, never Ready, it is replaced as stuck.
func testPoolRotationStuck(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.NewPool("boot", 1)
	pool.Spec.Rotation = v1alpha1.PoolRotation{MaxAge: &metav1.Duration{Duration: 2 * time.Minute}}
	two := intstr.FromInt32(2)
	pool.Spec.Strategy.RollingUpdate.MaxSurge = &two
	e.CreateSettled(pool)
	first := e.Children("boot")[0].Name
	e.HoldWhere(func(px *v1alpha1.Proxy) bool { return px.Name != first })
	e.Clock.Step(2 * time.Minute) // the first child is past maxAge
	e.Poke("boot")
	booting := e.waitNewChild("boot", []string{first}, v1alpha1.PhaseRunning)
	e.Clock.Step(5 * time.Minute) // the successor is past maxAge too, but within 600 s of its birth
	e.Poke("boot")
	controllertest.Consistently(t, "the booting successor and the first child kept", func() (bool, error) {
		kids := e.Children("boot")
		return len(kids) == 2 && kids[0].DeletionTimestamp.IsZero() && kids[1].DeletionTimestamp.IsZero(), fmt.Errorf("children %s", controllertest.Describe(kids))
	})
	// Past its progress deadline it is stuck: replaced by a child that becomes Ready.
	e.HoldWhere(func(px *v1alpha1.Proxy) bool { return px.Name == booting })
	e.Clock.Step(5 * time.Minute)
	e.Poke("boot")
	e.WaitPool("boot", "one new child, the stuck one and the first gone", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return len(kids) == 1 && kids[0].Name != first && kids[0].Name != booting && kids[0].Status.Phase == v1alpha1.PhaseReady
	})
	var stuckEv string
	for _, ev := range e.WaitPoolEvents("boot", EventChildDeleted, "one naming "+booting, controllertest.Containing(booting)) {
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
	pool := e.NewPool("upg", 2)
	pool.Spec.MinReadySeconds = 10
	e.CreateSettled(pool)
	old := controllertest.Names(e.Children("upg"))
	b := e.watchBounds("upg", 10*time.Second)
	for _, n := range old {
		e.PatchChild(n, true, func(px *v1alpha1.Proxy) {
			meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{
				Type: v1alpha1.ConditionConfigOutdated, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonRenderingChanged,
				Message: "this operator version renders another configuration",
			})
		})
	}
	for i := 0; i < 8; i++ {
		e.WaitPool("upg", "the step's new children Ready", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
			for _, k := range kids {
				if !slices.Contains(old, k.Name) && k.Status.Phase != v1alpha1.PhaseReady {
					return false
				}
			}
			return len(kids) > 0
		})
		kids := e.Children("upg")
		if len(kids) == 2 && !slices.Contains(old, kids[0].Name) && !slices.Contains(old, kids[1].Name) {
			break
		}
		e.Clock.Step(10 * time.Second)
		e.Poke("upg")
	}
	e.WaitSettled("upg", 2)
	b.check(t, 3, 2)
	for _, px := range e.Children("upg") {
		if slices.Contains(old, px.Name) {
			t.Errorf("outdated child %s still there", px.Name)
		}
	}
	for _, ev := range e.WaitPoolEvents("upg", EventChildDeleted, "one per replaced child", controllertest.AtLeast(len(old))) {
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
		ObjectMeta: metav1.ObjectMeta{Name: "pool-auth", Namespace: e.NS, Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}},
		Data:       map[string][]byte{"username": []byte("crawler"), "password": []byte("Old-pass.1")},
	}
	if err := e.C.Create(e.Ctx, sec); err != nil {
		t.Fatal(err)
	}
	pool := e.NewPool("auth", 2)
	pool.Spec.Template.Spec.Proxy = &v1alpha1.ProxyConfig{
		AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"},
		BasicAuth:           &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "pool-auth"}},
	}
	e.CreateSettled(pool)
	old := e.Children("auth")
	oldHash := old[0].Labels[v1alpha1.TemplateHashLabel]
	if oldHash == TemplateHash(&e.GetPool("auth").Spec.Template) {
		t.Errorf("template hash %s does not cover the credentials", oldHash)
	}

	sec.Data["password"] = []byte("New-pass.2")
	if err := e.C.Update(e.Ctx, sec); err != nil {
		t.Fatal(err)
	}
	e.WaitPool("auth", "2 new children from the new credentials", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
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
	if err := e.C.Delete(e.Ctx, sec); err != nil {
		t.Fatal(err)
	}
	c := e.waitProgressing("auth", metav1.ConditionFalse, v1alpha1.PoolReasonCredentialsUnavailable)
	if !strings.Contains(c.Message, "secret "+e.NS+"/pool-auth (spec.proxy.basicAuth.secretRef) does not exist") {
		t.Errorf("Progressing message %q does not name the Secret", c.Message)
	}
	now := controllertest.Names(e.Children("auth"))
	e.scale("auth", 3)
	controllertest.Consistently(t, "no child created or deleted without the Secret", func() (bool, error) {
		got := controllertest.Names(e.Children("auth"))
		return slices.Equal(got, now), fmt.Errorf("children %v, were %v", got, now)
	})
	sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pool-auth", Namespace: e.NS, Labels: sec.Labels},
		Data: map[string][]byte{"username": []byte("crawler"), "password": []byte("New-pass.2")}}
	if err := e.C.Create(e.Ctx, sec); err != nil {
		t.Fatal(err)
	}
	e.WaitPool("auth", "3 children, the 2 kept", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		got := controllertest.Names(kids)
		return len(got) == 3 && slices.Contains(got, now[0]) && slices.Contains(got, now[1]) && p.Status.AvailableReplicas == 3
	})
}
