package pool

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/providerhealth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
)

// Remediation through the Proxy and pool reconcilers on the package's API server, the
// fake provider and a fake clock: the tests move the clock past a timeout and wake the
// Proxy (proxy.ProxyReconciler.Wake), as its requeue would after the real wait, and wait for
// what the reconcile does. The health loop stands in for the health engine: it marks
// Running proxies healthy except those a test holds.

// fakeTarget is the health engine's word on the probe target.
type fakeTarget struct {
	mu            sync.Mutex
	down          bool
	since, upFrom time.Time
}

func (f *fakeTarget) ProbeTargetDown() (bool, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down, f.since
}

func (f *fakeTarget) ProbeTargetUpSince() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.upFrom
}

func (f *fakeTarget) set(down bool, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
	if down {
		f.since = at
	} else {
		f.upFrom = at
	}
}

type remEnv struct {
	*poolEnv
	pr     *proxy.ProxyReconciler
	target *fakeTarget
	// provider is a provider name of this test alone (the fake), so that its standalone
	// Proxies are a host group of their own on the shared API server; noReboot is the
	// same fake without its Rebooter.
	provider, noReboot string
}

var remProviders atomic.Int64

func newRemEnv(t *testing.T) *remEnv {
	t.Helper()
	e := &remEnv{target: &fakeTarget{}}
	n := remProviders.Add(1)
	e.provider, e.noReboot = fmt.Sprintf("rem-%d", n), fmt.Sprintf("rem-%d-noreboot", n)
	e.poolEnv = newPoolEnv(t, shared.Env(t), withProxyWorkers(4, 20*time.Millisecond), withProxySetup(func(r *proxy.ProxyReconciler, clk *clocktesting.FakeClock) {
		r.Clock, r.ProbeTarget = clk, e.target
		fake := r.Providers[testProvider]
		r.Providers[e.provider], r.Providers[e.noReboot] = fake, providertest.WithoutReboot(fake)
		e.pr = r
	}))
	return e
}

// holdAll keeps the health loop off every proxy but those named.
func (e *remEnv) holdAll(except ...string) {
	e.HoldWhere(func(px *v1alpha1.Proxy) bool {
		for _, n := range except {
			if px.Name == n {
				return false
			}
		}
		return true
	})
}

// stepAndWake moves the fake clock by d and has the named Proxies reconciled.
func (e *remEnv) stepAndWake(d time.Duration, names ...string) {
	e.Clock.Step(d)
	for _, n := range names {
		e.pr.Wake(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: n})
	}
}

func (e *remEnv) standalone(name, prov string, rem *v1alpha1.ProxyRemediation) {
	e.T.Helper()
	px := testbuild.Proxy(e.NS, name, testbuild.WithProvider(prov), testbuild.WithSpec(func(s *v1alpha1.ProxySpec) { s.Remediation = rem }))
	if err := e.C.Create(e.Ctx, px); err != nil {
		e.T.Fatalf("creating proxy %s: %v", name, err)
	}
}

// deletes counts the fake's Deletes of instance id.
func (e *remEnv) deletes(id string) int {
	n := 0
	for _, c := range e.Fake.CallsOf(providertest.OpDelete) {
		if c.Arg == id {
			n++
		}
	}
	return n
}

// waitEvent waits for an Event of reason on the Proxy name whose note holds text.
func (e *remEnv) waitEvent(name, reason, text string) {
	e.T.Helper()
	e.WaitProxyEvents(name, reason, fmt.Sprintf("one saying %q", text), controllertest.Containing(text))
}

func record(px *v1alpha1.Proxy) *remediation.Record {
	r, _ := remediation.ParseRecord(px.Annotations[remediation.RecordAnnotation])
	return r
}

func hasRecord(px *v1alpha1.Proxy, attempt int32, action remediation.Action) bool {
	r := record(px)
	return r != nil && r.Attempt == attempt && r.Action == action
}

func remediating(px *v1alpha1.Proxy, status metav1.ConditionStatus, reason string) bool {
	c := meta.FindStatusCondition(px.Status.Conditions, remediation.ConditionRemediating)
	return c != nil && c.Status == status && c.Reason == reason
}

func running(px *v1alpha1.Proxy) bool {
	return px.Status.Phase == v1alpha1.PhaseRunning && px.Status.ProviderID != ""
}

// A pool child that never answers is rebooted after its boot timeout, then replaced
// surge-first: its successor comes up (inheriting the record, attempt 2) before it is
// retired, and the pool never has fewer children than its replicas. The successor's
// record is dropped once it has served for the reset time.
func TestRemediationPoolChildRebootThenReplace(t *testing.T) {
	t.Parallel()
	e := newRemEnv(t)
	pool := e.NewPool("rem", 1)
	pool.Spec.ProgressDeadlineSeconds = ptr.To[int32](86400) // the pool's own stuck rule stays out of it
	e.CreateSettled(pool)
	good := controllertest.Names(e.Children("rem"))[0]
	e.holdAll(good)
	e.Update("rem", func(p *v1alpha1.ProxyPool) { p.Spec.Replicas = ptr.To[int32](2) })
	var bad *v1alpha1.Proxy
	e.WaitPool("rem", "a second child Running", func(_ *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		for i := range kids {
			if kids[i].Name != good && running(&kids[i]) {
				bad = &kids[i]
			}
		}
		return len(kids) == 2 && bad != nil
	})
	id := bad.Status.ProviderID
	b := e.watchBounds("rem", 0) // from here on the pool has its 2 children

	e.stepAndWake(remediation.DefaultBootTimeout+time.Minute, bad.Name)
	px := e.WaitProxy(bad.Name, "rebooted after its boot timeout (attempt 1)", func(px *v1alpha1.Proxy) bool {
		return hasRecord(px, 1, remediation.ActionReboot) && remediating(px, metav1.ConditionTrue, remediation.ReasonBootTimeout) &&
			meta.IsStatusConditionTrue(px.Status.Conditions, v1alpha1.ConditionReconciling)
	})
	if n := e.Fake.Reboots(id); n != 1 {
		t.Fatalf("instance %s rebooted %d times, want 1", id, n)
	}
	if px.Annotations[common.RemediationReplaceAnnotation] != "" {
		t.Fatalf("handed to the pool after a reboot: %v", px.Annotations)
	}

	e.stepAndWake(remediation.DefaultFirstWait+time.Second, bad.Name)
	e.WaitProxy(bad.Name, "handed to its pool for a replacement (attempt 2)", func(px *v1alpha1.Proxy) bool {
		return hasRecord(px, 2, remediation.ActionReplace) && px.Annotations[common.RemediationReplaceAnnotation] != ""
	})
	var successor string
	e.WaitPool("rem", "a successor with the record of attempt 2 beside the faulty child", func(_ *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		for i := range kids {
			if kids[i].Name != good && kids[i].Name != bad.Name && hasRecord(&kids[i], 2, remediation.ActionReplace) {
				successor = kids[i].Name
			}
		}
		return successor != "" && len(kids) == 3
	})
	if n := e.Fake.Reboots(id); n != 1 {
		t.Fatalf("instance %s rebooted %d times, want 1 (the second attempt replaces)", id, n)
	}
	e.holdAll(good, successor) // the successor answers
	e.WaitPool("rem", "the faulty child retired once its successor is available", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return len(kids) == 2 && p.Status.AvailableReplicas == 2 && kids[0].Name != bad.Name && kids[1].Name != bad.Name
	})
	b.check(t, 3, 1)
	if b.minTotal < 2 {
		t.Errorf("the pool had %d children at one point, fewer than its 2 replicas", b.minTotal)
	}

	e.stepAndWake(remediation.DefaultResetAfter+time.Second, successor)
	e.WaitProxy(successor, "its record dropped after serving for the reset time", func(px *v1alpha1.Proxy) bool {
		return px.Annotations[remediation.RecordAnnotation] == "" &&
			meta.FindStatusCondition(px.Status.Conditions, remediation.ConditionRemediating) == nil && px.Status.Phase == v1alpha1.PhaseReady
	})
}

// A standalone Proxy that no attempt mends: reboot, replacement, then Stalled once
// spec.remediation.maxAttempts is spent, with nothing more done. On a provider that
// cannot reboot the first attempt replaces.
func TestRemediationStandaloneStallsAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	e := newRemEnv(t)
	e.holdAll()
	e.standalone("stuck", e.provider, &v1alpha1.ProxyRemediation{MaxAttempts: ptr.To[int32](2)})
	e.standalone("noreboot", e.noReboot, nil)
	// An instance's providerID is its name's on the fake, the same after a replacement:
	// a replacement shows as a Delete of it.
	id := e.WaitProxy("stuck", "Running", running).Status.ProviderID
	idNR := e.WaitProxy("noreboot", "Running", running).Status.ProviderID

	e.stepAndWake(remediation.DefaultBootTimeout+time.Minute, "stuck", "noreboot")
	e.WaitProxy("stuck", "rebooted (attempt 1)", func(px *v1alpha1.Proxy) bool { return hasRecord(px, 1, remediation.ActionReboot) })
	e.WaitProxy("noreboot", "replaced at once (attempt 1), its provider cannot reboot", func(px *v1alpha1.Proxy) bool {
		return hasRecord(px, 1, remediation.ActionReplace) && running(px) && e.deletes(idNR) == 1
	})
	if n := e.Fake.Reboots(idNR); n != 0 {
		t.Errorf("the provider without reboot was asked to reboot %d times", n)
	}

	e.stepAndWake(remediation.DefaultFirstWait+time.Second, "stuck")
	e.WaitProxy("stuck", "replaced (attempt 2)", func(px *v1alpha1.Proxy) bool {
		return hasRecord(px, 2, remediation.ActionReplace) && running(px) && e.deletes(id) == 1
	})

	e.stepAndWake(2*remediation.DefaultFirstWait+time.Second, "stuck")
	px := e.WaitProxy("stuck", "Stalled: maxAttempts spent", func(px *v1alpha1.Proxy) bool {
		return remediating(px, metav1.ConditionFalse, common.ReasonAttemptsExhausted) && meta.IsStatusConditionTrue(px.Status.Conditions, v1alpha1.ConditionStalled)
	})
	if msg := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionStalled).Message; !strings.Contains(msg, "gave up after 2 attempts") {
		t.Errorf("Stalled says %q, want it to say remediation gave up after 2 attempts", msg)
	}
	e.stepAndWake(time.Hour, "stuck")
	controllertest.Consistently(t, "left alone once stalled", func() (bool, error) {
		px := e.GetProxy("stuck")
		return e.deletes(id) == 1 && e.Fake.Reboots(id) == 1 && hasRecord(px, 2, remediation.ActionReplace),
			fmt.Errorf("%d deletes, %d reboots, annotations %v", e.deletes(id), e.Fake.Reboots(id), px.Annotations)
	})
}

// The brake: with maxUnhealthy 1, two of three children past their unhealthy timeout
// hold remediation (Remediating=False, TooManyUnhealthy, with the counts); once one is
// healthy again the other is rebooted.
func TestRemediationBrakeHoldsTwoOfThree(t *testing.T) {
	t.Parallel()
	e := newRemEnv(t)
	pool := e.NewPool("brake", 3)
	pool.Spec.ProgressDeadlineSeconds = ptr.To[int32](86400)
	pool.Spec.Remediation = &v1alpha1.PoolRemediation{MaxUnhealthy: ptr.To(intstr.FromInt32(1))}
	e.CreateSettled(pool)
	kids := controllertest.Names(e.Children("brake"))
	e.Clock.Step(time.Minute) // the failures begin after the instances started
	e.setUnhealthy(kids[0])
	e.setUnhealthy(kids[1])
	for _, k := range kids[:2] {
		// The reconciler's own write proves its cache holds the failure: a reconcile of
		// one child then counts both.
		e.WaitProxy(k, "seen unhealthy by the reconciler (Ready False)", func(px *v1alpha1.Proxy) bool {
			return meta.IsStatusConditionTrue(px.Status.Conditions, v1alpha1.ConditionReconciling)
		})
	}

	e.stepAndWake(remediation.DefaultUnhealthyTimeout+time.Second, kids[0], kids[1])
	for _, k := range kids[:2] {
		px := e.WaitProxy(k, "held by the brake", func(px *v1alpha1.Proxy) bool {
			return remediating(px, metav1.ConditionFalse, remediation.ReasonTooManyUnhealthy)
		})
		if msg := meta.FindStatusCondition(px.Status.Conditions, remediation.ConditionRemediating).Message; !strings.Contains(msg, "2 of 3 unhealthy") {
			t.Errorf("%s: Remediating says %q, want the counts 2 of 3", k, msg)
		}
		if n := e.Fake.Reboots(px.Status.ProviderID); n != 0 || record(px) != nil {
			t.Errorf("%s: rebooted %d times under the brake, record %v", k, n, record(px))
		}
	}

	e.Poke("brake")
	e.WaitPool("brake", "RemediationAllowed False, naming the counts", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		c := meta.FindStatusCondition(p.Status.Conditions, common.PoolConditionRemediationAllowed)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == remediation.ReasonTooManyUnhealthy && strings.Contains(c.Message, "2 of 3 unhealthy")
	})

	e.Release(kids[1])
	// Ready is the reconciler's write: its cache holds the recovery.
	e.WaitProxy(kids[1], "healthy again, seen by the reconciler (Ready)", func(px *v1alpha1.Proxy) bool {
		return meta.IsStatusConditionTrue(px.Status.Conditions, v1alpha1.ConditionReady)
	})
	e.stepAndWake(remediation.HeldRecheck, kids[0])
	px := e.WaitProxy(kids[0], "rebooted once the brake released (1 of 3 unhealthy)", func(px *v1alpha1.Proxy) bool {
		return hasRecord(px, 1, remediation.ActionReboot) && remediating(px, metav1.ConditionTrue, remediation.ReasonUnhealthy)
	})
	if n := e.Fake.Reboots(px.Status.ProviderID); n != 1 {
		t.Errorf("rebooted %d times, want 1", n)
	}
	e.Poke("brake")
	e.WaitPool("brake", "RemediationAllowed True again", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return meta.IsStatusConditionTrue(p.Status.Conditions, common.PoolConditionRemediationAllowed)
	})
}

// While the probe target itself is down nothing is remediated, however long; when it is
// back, the unhealthy timeout counts from its return.
func TestRemediationProbeTargetDownHolds(t *testing.T) {
	t.Parallel()
	e := newRemEnv(t)
	e.standalone("p", e.provider, nil)
	id := e.WaitProxy("p", "Ready", func(px *v1alpha1.Proxy) bool { return px.Status.Phase == v1alpha1.PhaseReady }).Status.ProviderID
	e.Clock.Step(time.Minute)
	e.target.set(true, e.Clock.Now())
	e.setUnhealthy("p")

	e.stepAndWake(10*time.Minute, "p")
	e.WaitProxy("p", "held: the probe target is down", func(px *v1alpha1.Proxy) bool {
		return remediating(px, metav1.ConditionFalse, remediation.ReasonProbeTargetDown) && record(px) == nil
	})
	e.target.set(false, e.Clock.Now())
	e.stepAndWake(time.Minute, "p")
	e.WaitProxy("p", "no longer held, not yet due: the timeout counts from the target's return", func(px *v1alpha1.Proxy) bool {
		return meta.FindStatusCondition(px.Status.Conditions, remediation.ConditionRemediating) == nil
	})
	if n := e.Fake.Reboots(id); n != 0 {
		t.Fatalf("rebooted %d times during or just after the probe-target outage", n)
	}
	e.stepAndWake(remediation.DefaultUnhealthyTimeout, "p")
	e.WaitProxy("p", "rebooted once its unhealthy timeout passed after the target's return", func(px *v1alpha1.Proxy) bool {
		return hasRecord(px, 1, remediation.ActionReboot)
	})
}

// A reboot the provider refuses counts as the attempt, with a Warning Event, and is not
// repeated: the next attempt, after its wait, replaces.
func TestRemediationRebootRefusedThenReplaces(t *testing.T) {
	t.Parallel()
	e := newRemEnv(t)
	e.holdAll()
	e.Fake.FailReboots(provider.Errorf(provider.ErrTransient, "fake: the hypervisor refuses the reset"))
	e.standalone("p", e.provider, nil)
	id := e.WaitProxy("p", "Running", running).Status.ProviderID

	e.stepAndWake(remediation.DefaultBootTimeout+time.Minute, "p")
	e.WaitProxy("p", "attempt 1 recorded although the reboot failed", func(px *v1alpha1.Proxy) bool {
		return hasRecord(px, 1, remediation.ActionReboot)
	})
	e.waitEvent("p", remediation.ReasonBootTimeout, "rebooting instance "+id+" failed")
	if n := e.Fake.Reboots(id); n != 0 {
		t.Fatalf("%d reboots went through, want the refused one only", n)
	}
	refused := e.Fake.CountOf(providertest.OpReboot)
	e.stepAndWake(remediation.DefaultFirstWait+time.Second, "p")
	e.WaitProxy("p", "replaced (attempt 2)", func(px *v1alpha1.Proxy) bool {
		return hasRecord(px, 2, remediation.ActionReplace) && running(px) && e.deletes(id) == 1
	})
	if n := e.Fake.CountOf(providertest.OpReboot); n != refused {
		t.Errorf("reboot asked %d times after the refusal, want none", n-refused)
	}
}

// The brake of a provider's standalone Proxies: both of two past their unhealthy timeout
// (more than 40% of 2, rounded up: 1) hold each other, and the provider's ProviderHealth
// says so with an Event naming the counts; once one is healthy again the other is
// rebooted and the ProviderHealth says remediation resumed.
func TestRemediationHostBrakeOnProviderHealth(t *testing.T) {
	t.Parallel()
	e := newRemEnv(t)
	ph := &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: e.provider}}
	if err := e.C.Create(e.Ctx, ph); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.C.Delete(context.Background(), ph) })
	e.standalone("a", e.provider, nil)
	e.standalone("b", e.provider, nil)
	for _, n := range []string{"a", "b"} {
		e.WaitProxy(n, "Ready", func(px *v1alpha1.Proxy) bool { return px.Status.Phase == v1alpha1.PhaseReady })
	}
	e.Clock.Step(time.Minute)
	for _, n := range []string{"a", "b"} {
		e.setUnhealthy(n)
		e.WaitProxy(n, "seen unhealthy by the reconciler", func(px *v1alpha1.Proxy) bool {
			return meta.IsStatusConditionTrue(px.Status.Conditions, v1alpha1.ConditionReconciling)
		})
	}
	e.stepAndWake(remediation.DefaultUnhealthyTimeout+time.Second, "a", "b")
	for _, n := range []string{"a", "b"} {
		e.WaitProxy(n, "held by its provider's brake", func(px *v1alpha1.Proxy) bool {
			return remediating(px, metav1.ConditionFalse, remediation.ReasonTooManyUnhealthy) && record(px) == nil
		})
	}
	e.waitProviderEvent(remediation.ReasonTooManyUnhealthy, "2 of 2 unhealthy")
	// The monitor's round publishes the brake as the ProviderHealth's condition.
	e.waitProviderCondition(metav1.ConditionFalse, remediation.ReasonTooManyUnhealthy, "2 of 2 unhealthy")

	e.Release("b")
	// b's own reconcile, as it turns healthy, releases the brake: no wait for a's recheck.
	e.waitProviderEvent(common.EventRemediationResumed, "1 of 2 unhealthy")
	e.waitProviderCondition(metav1.ConditionTrue, common.PoolReasonWithinMaxUnhealthy, "1 of 2 unhealthy")
	e.stepAndWake(remediation.HeldRecheck, "a")
	e.WaitProxy("a", "rebooted once the brake released", func(px *v1alpha1.Proxy) bool { return hasRecord(px, 1, remediation.ActionReboot) })
}

// waitProviderCondition runs rounds of a provider health monitor over the test's
// provider (with the reconciler's ProviderRemediation, as the manager wires it) until
// its ProviderHealth's RemediationAllowed condition has status and reason and a message
// holding text.
func (e *remEnv) waitProviderCondition(status metav1.ConditionStatus, reason, text string) {
	e.T.Helper()
	m := &providerhealth.ProviderHealthMonitor{Client: e.C, Providers: map[string]provider.Provider{e.provider: e.pr.Providers[e.provider]},
		Log: logr.Discard(), Remediation: e.pr.ProviderRemediation, Clock: e.Clock}
	waitFor(e.T, waitLong, fmt.Sprintf("ProviderHealth %s RemediationAllowed=%s %s saying %q", e.provider, status, reason, text), func() (bool, error) {
		m.CheckAll(e.Ctx)
		ph := &v1alpha1.ProviderHealth{}
		if err := e.C.Get(e.Ctx, client.ObjectKey{Name: e.provider}, ph); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(ph.Status.Conditions, common.ConditionRemediationAllowed)
		return c != nil && c.Status == status && c.Reason == reason && strings.Contains(c.Message, text), fmt.Errorf("condition %+v", c)
	})
}

// waitProviderEvent waits for an Event of reason on the test's ProviderHealth (in the
// default namespace, as for every cluster-scoped object) whose note holds text.
func (e *remEnv) waitProviderEvent(reason, text string) {
	e.T.Helper()
	waitFor(e.T, waitLong, fmt.Sprintf("a %s Event on ProviderHealth %s saying %q", reason, e.provider, text), func() (bool, error) {
		list := &eventsv1.EventList{}
		if err := e.C.List(e.Ctx, list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return false, err
		}
		var seen []string
		for _, ev := range list.Items {
			if ev.Regarding.Kind == "ProviderHealth" && ev.Regarding.Name == e.provider && ev.Reason == reason {
				if strings.Contains(ev.Note, text) {
					return true, nil
				}
				seen = append(seen, ev.Note)
			}
		}
		return false, fmt.Errorf("%s Events: %q", reason, seen)
	})
}

// A Ready standalone Proxy whose running instance stops reporting its address (a guest
// whose network failed) is not taken for a booting one: once the address hold is over
// it shows Provisioned=True AddressLost, out of rotation, and after the unhealthy timeout
// (not the boot timeout) it is rebooted; when the address comes back it is Running on
// the same instance, its start kept.
func TestRemediationAddressLostIsUnhealthy(t *testing.T) {
	t.Parallel()
	e := newRemEnv(t)
	// The conditions the reconciler sets take the real time, the health loop's the fake
	// clock's: ahead by a minute, the health loop's come after the instance's start.
	e.Clock.Step(time.Minute)
	e.standalone("lost", e.provider, nil)
	px := e.WaitProxy("lost", "Ready", func(px *v1alpha1.Proxy) bool { return px.Status.Phase == v1alpha1.PhaseReady })
	id, ip := px.Status.ProviderID, px.Status.IP
	started := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned).LastTransitionTime
	e.Hold("lost") // the health engine would probe nothing: the Proxy has no address to probe

	e.Clock.Step(time.Minute)
	inst, ok := e.Fake.Instance(id)
	if !ok {
		t.Fatalf("instance %s missing from the fake (it has %+v)", id, e.Fake.Instances())
	}
	inst.IP = ""
	e.Fake.SetInstance(inst)
	// The hold starts at the reconcile that first sees the address missing, which a wake
	// only asks for: each look that still finds the Proxy Ready moves the clock past a
	// whole hold and wakes it again.
	px = e.WaitProxy("lost", "Provisioned=True AddressLost, phase Provisioning", func(px *v1alpha1.Proxy) bool {
		c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned)
		if px.Status.Phase == v1alpha1.PhaseReady {
			e.stepAndWake(proxy.DefaultAddressHold+time.Second, "lost")
		}
		return px.Status.Phase == v1alpha1.PhaseProvisioning && c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonAddressLost
	})
	c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned)
	if !strings.Contains(c.Message, "no longer reports its address (it was "+ip+")") || !c.LastTransitionTime.Equal(&started) {
		t.Errorf("Provisioned %+v: want the lost address %s named and the instance's start %v kept", c, ip, started)
	}
	if px.Status.IP != "" || px.Status.ProviderID != id {
		t.Errorf("status ip %q providerID %q: want no address on the same instance %s", px.Status.IP, px.Status.ProviderID, id)
	}

	// Past the unhealthy timeout, well short of the boot timeout counted from the start.
	e.stepAndWake(remediation.DefaultUnhealthyTimeout+time.Second, "lost")
	// The record is written before the reboot is asked for: wait for both.
	px = e.WaitProxy("lost", "rebooted (attempt 1) for the unhealthy timeout", func(px *v1alpha1.Proxy) bool {
		return hasRecord(px, 1, remediation.ActionReboot) && e.Fake.Reboots(id) >= 1
	})
	if r := record(px); r.Reason != remediation.ReasonUnhealthy {
		t.Errorf("remediation record %+v: want reason %s, not a boot timeout", r, remediation.ReasonUnhealthy)
	}
	if n := e.Fake.Reboots(id); n != 1 {
		t.Errorf("%d reboots of %s, want 1", n, id)
	}

	inst.IP = ip
	e.Fake.SetInstance(inst)
	e.Release("lost")
	e.pr.Wake(e.Ctx, client.ObjectKey{Namespace: e.NS, Name: "lost"})
	px = e.WaitProxy("lost", "Ready again at its address", func(px *v1alpha1.Proxy) bool {
		return px.Status.Phase == v1alpha1.PhaseReady && px.Status.IP == ip
	})
	if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned); c.Reason != v1alpha1.ReasonInstanceRunning || !c.LastTransitionTime.Equal(&started) {
		t.Errorf("Provisioned %+v once the address is back: want InstanceRunning since %v", c, started)
	}
}
