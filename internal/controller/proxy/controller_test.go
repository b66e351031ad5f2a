package proxy

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

func TestProxyCreatedAndRunning(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	px := e.create(e.newProxy("web"))
	got := e.waitPhase("web", v1alpha1.PhaseRunning)

	if !slices.Contains(got.Finalizers, Finalizer) {
		t.Errorf("finalizers = %v, want %s", got.Finalizers, Finalizer)
	}
	creates := e.fake.CallsOf(providertest.OpCreate)
	if len(creates) != 1 {
		t.Fatalf("provider calls %v, want exactly one create", e.ops())
	}
	req := creates[0].Arg.(provider.CreateRequest)
	if req.Name != px.InstanceName() || !strings.HasPrefix(req.Name, "proxy-") || len(req.Name) != len("proxy-")+16 {
		t.Errorf("create name %q, want the deterministic %q", req.Name, px.InstanceName())
	}
	if req.UID != string(got.UID) || req.UID == "" {
		t.Errorf("create uid %q, want metadata.uid %q", req.UID, got.UID)
	}
	wantPl := provider.Placement{Region: "home", Zone: "beelink", MachineType: "small", Image: "debian-12"}
	if req.Placement != wantPl || string(req.CloudInit) != px.Spec.CloudInit || req.Port != 3128 {
		t.Errorf("create request %+v, want placement %+v, the cloudInit byte for byte and the default port 3128", req, wantPl)
	}
	inst, _ := e.fake.Instance(providertest.ProviderID(req.Name))
	if got.Status.ProviderID != inst.ProviderID || got.Status.IP != inst.IP || got.Status.IP == "" {
		t.Errorf("status providerID %q ip %q, want %q %q", got.Status.ProviderID, got.Status.IP, inst.ProviderID, inst.IP)
	}
	if got.Status.SpecHash != RenderedHash(got, got.Spec.CloudInit) || got.Status.ObservedGeneration != got.Generation {
		t.Errorf("specHash %q observedGeneration %d, want %q %d", got.Status.SpecHash, got.Status.ObservedGeneration, RenderedHash(got, got.Spec.CloudInit), got.Generation)
	}
	if c := provisioned(got); c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonInstanceRunning {
		t.Errorf("Provisioned = %+v, want True/InstanceRunning", c)
	}
	if got.Status.Healthy {
		t.Error("the reconciler set healthy; only the health engine may")
	}
	e.waitEvent("web", EventPending, req.Name)
	e.waitEvent("web", v1alpha1.ReasonProvisioning, "creating instance "+req.Name)
	e.waitEvent("web", v1alpha1.ReasonInstanceRunning, inst.IP)
}

func TestInstanceNameStableAcrossRecreation(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	first := e.create(e.newProxy("again"))
	e.waitPhase("again", v1alpha1.PhaseRunning)
	if err := e.c.Delete(e.ctx, first); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "proxy again to be gone", func() (bool, error) {
		err := e.c.Get(e.ctx, client.ObjectKeyFromObject(first), &v1alpha1.Proxy{})
		return apierrors.IsNotFound(err), err
	})
	second := e.create(e.newProxy("again"))
	e.waitPhase("again", v1alpha1.PhaseRunning)
	creates := e.fake.CallsOf(providertest.OpCreate)
	if len(creates) != 2 {
		t.Fatalf("calls %v, want two creates", e.ops())
	}
	a, b := creates[0].Arg.(provider.CreateRequest), creates[1].Arg.(provider.CreateRequest)
	if a.Name != b.Name {
		t.Errorf("instance names %q then %q, want the same for the same namespace/name", a.Name, b.Name)
	}
	if a.UID == b.UID || b.UID != string(second.UID) {
		t.Errorf("owner UIDs %q then %q, want the new Proxy's uid %q", a.UID, b.UID, second.UID)
	}
}

func TestPermanentErrorLatchedUntilSpecChanges(t *testing.T) {
	t.Parallel()
	// However short the re-check timer, it does not apply to a cause that cannot clear.
	e := newSyncEnv(t, func(r *ProxyReconciler) { r.FailedRecheckInterval = time.Millisecond })
	e.fake.NextCreateErr(provider.Permanent(errors.New(`placement.machineType "huge" is not in kvm2.machineTypes`)))
	got := e.newProxy("perm")
	e.create(got)
	if got.Status.Phase != v1alpha1.PhaseFailed {
		t.Fatalf("phase %s, want Failed", got.Status.Phase)
	}
	if c := provisioned(got); c.Reason != v1alpha1.ReasonPermanentError || !strings.Contains(c.Message, `"huge"`) {
		t.Errorf("Provisioned = %+v, want reason PermanentError with the provider's message", c)
	}
	if !strings.Contains(got.Status.Message, `placement.machineType "huge"`) {
		t.Errorf("message %q does not carry the provider's error", got.Status.Message)
	}
	e.expectEvent(corev1.EventTypeWarning, v1alpha1.ReasonPermanentError, "stays Failed until its spec changes")

	// Another reconcile at the same generation asks the provider nothing.
	before := len(e.fake.Calls())
	if res := e.reconcile(got); res != (ctrl.Result{}) {
		t.Errorf("latched reconcile = %+v; want no requeue and no error", res)
	}
	if n := len(e.fake.Calls()); n != before {
		t.Errorf("latched reconcile called the provider: %v", e.ops()[before:])
	}
	if got.Status.Phase != v1alpha1.PhaseFailed {
		t.Errorf("phase %s after a latched reconcile, want Failed", got.Status.Phase)
	}

	// A spec change (new generation) lifts the latch.
	got.Spec.Placement.MachineType = "medium"
	if err := e.c.Update(e.ctx, got); err != nil {
		t.Fatal(err)
	}
	if e.reconcile(got); got.Status.Phase != v1alpha1.PhaseRunning {
		t.Errorf("phase %s after the spec change, want Running", got.Status.Phase)
	}
	if got.Status.ObservedGeneration != got.Generation || got.Generation < 2 {
		t.Errorf("observedGeneration %d, generation %d", got.Status.ObservedGeneration, got.Generation)
	}
}

func TestQuotaExceededWaitsOffTheBackoffCurve(t *testing.T) {
	t.Parallel()
	var blocked atomic.Bool
	blocked.Store(true)
	const retry = 2 * time.Second
	e := newSyncEnv(t, func(r *ProxyReconciler) { r.QuotaRetry = retry })
	e.fake.SetCreateHook(quotaUntil(&blocked))
	got := e.newProxy("quota")
	res := e.create(got)
	if provisioned(got).Reason != v1alpha1.ReasonQuotaExceeded {
		t.Fatalf("Provisioned = %+v, want reason QuotaExceeded", provisioned(got))
	}
	if got.Status.Phase != v1alpha1.PhaseProvisioning {
		t.Errorf("phase %s, want Provisioning (quota is never Failed)", got.Status.Phase)
	}
	if c := provisioned(got); c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "11 GiB needed") || !strings.Contains(c.Message, "retrying in 2s") {
		t.Errorf("Provisioned = %+v, want False with the provider's message and the retry delay", c)
	}
	e.expectEvent(corev1.EventTypeWarning, v1alpha1.ReasonQuotaExceeded, "11 GiB needed")
	if res.RequeueAfter != retry {
		t.Errorf("reconcile on quota = %+v; want RequeueAfter %s and no error", res, retry)
	}

	if res := e.reconcile(got); res.RequeueAfter != retry {
		t.Errorf("reconcile on quota = %+v; want RequeueAfter %s and no error", res, retry)
	}
	if got.Status.Phase == v1alpha1.PhaseFailed {
		t.Error("quota made the Proxy Failed")
	}
	blocked.Store(false)
	if e.reconcile(got); got.Status.Phase != v1alpha1.PhaseRunning {
		t.Errorf("phase %s once the quota allows, want Running", got.Status.Phase)
	}
}

func TestTransientErrorRetriedWithBackoff(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	var fails atomic.Int32
	fails.Store(2)
	e.fake.SetCreateHook(func(_ context.Context, _ provider.CreateRequest) error {
		if fails.Add(-1) >= 0 {
			return provider.Transient(errors.New("dial tcp 192.0.2.1:22: connection refused"))
		}
		return nil
	})
	e.create(e.newProxy("flaky"))
	e.waitEvent("flaky", v1alpha1.ReasonTransientError, "connection refused")
	got := e.waitPhase("flaky", v1alpha1.PhaseRunning)
	if n := e.fake.CountOf(providertest.OpCreate); n < 3 {
		t.Errorf("%d creates, want the two failures retried", n)
	}
	if c := provisioned(got); c.Reason != v1alpha1.ReasonInstanceRunning {
		t.Errorf("Provisioned = %+v after recovery", c)
	}

	// A direct reconcile hitting a transient error returns the error and an empty result.
	e.fake.NextGetErr(provider.Transient(errors.New("libvirt connection lost")))
	res, err := e.reconcileNow("flaky")
	if err == nil || !strings.Contains(err.Error(), "libvirt connection lost") || res != (ctrl.Result{}) {
		t.Errorf("reconcile = %+v, %v; want the error alone", res, err)
	}
}

func TestVanishedInstanceCreatedAgain(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, _ ctrl.Manager) { r.ResyncInterval = 300 * time.Millisecond }))
	px := e.create(e.newProxy("gone"))
	first := e.waitPhase("gone", v1alpha1.PhaseRunning)
	if !e.fake.RemoveInstance(first.Status.ProviderID) {
		t.Fatalf("no instance %s in the fake", first.Status.ProviderID)
	}
	e.waitEvent("gone", EventInstanceGone, first.Status.ProviderID)
	waitFor(t, waitLong, "a second create", func() (bool, error) { return e.fake.CountOf(providertest.OpCreate) == 2, nil })
	got := e.waitPhase("gone", v1alpha1.PhaseRunning)
	inst, ok := e.fake.Instance(providertest.ProviderID(px.InstanceName()))
	if !ok || got.Status.IP != inst.IP {
		t.Errorf("status ip %q, instance %+v (exists %v)", got.Status.IP, inst, ok)
	}
}

func TestSpecChangeReplacesInstance(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	e.create(e.newProxy("repl"))
	first := e.waitPhase("repl", v1alpha1.PhaseRunning)
	// region is in the hash even where a provider ignores it
	e.edit("repl", "spec.placement.region", func(px *v1alpha1.Proxy) { px.Spec.Placement.Region = "elsewhere" })
	got := e.waitProxy("repl", "a new spec hash, Running", func(p *v1alpha1.Proxy) bool {
		return p.Status.SpecHash != first.Status.SpecHash && p.Status.Phase == v1alpha1.PhaseRunning
	})
	ops := e.ops()
	id := first.Status.ProviderID
	del := slices.Index(ops, "delete "+id)
	lastCreate := lastIndex(ops, "create "+got.InstanceName())
	if del < 0 || lastCreate < del {
		t.Errorf("provider calls %v, want delete %s before the new create", ops, id)
	}
	if got.Status.SpecHash != RenderedHash(got, got.Spec.CloudInit) {
		t.Errorf("specHash %q, want %q", got.Status.SpecHash, RenderedHash(got, got.Spec.CloudInit))
	}
	if c := e.fake.CallsOf(providertest.OpCreate); c[len(c)-1].Arg.(provider.CreateRequest).Placement.Region != "elsewhere" {
		t.Errorf("last create %+v, want region elsewhere", c[len(c)-1].Arg)
	}
	e.waitEvent("repl", EventReplacing, id)

	// A change outside the hash (the port) replaces nothing.
	creates := e.fake.CountOf(providertest.OpCreate)
	e.edit("repl", "spec.port", func(px *v1alpha1.Proxy) { px.Spec.Port = 8888 })
	e.waitProxy("repl", "observedGeneration caught up", func(p *v1alpha1.Proxy) bool { return p.Status.ObservedGeneration == p.Generation })
	if n := e.fake.CountOf(providertest.OpCreate); n != creates || e.fake.CountOf(providertest.OpDelete) != 1 {
		t.Errorf("a port change recreated the instance: %v", e.ops())
	}
}

func lastIndex(ss []string, s string) int {
	for i := len(ss) - 1; i >= 0; i-- {
		if ss[i] == s {
			return i
		}
	}
	return -1
}

// TestPreemptedInstanceReported: an instance its cloud reclaimed (Get wrapping
// provider.ErrPreempted) is built again like a vanished one, but says so: a Warning
// Preempted Event with the provider's message, the preemptions counter of its zone, and
// the Preempted condition, still there while the successor is only Running (the health
// engine removes it at Ready).
func TestPreemptedInstanceReported(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, _ ctrl.Manager) { r.ResyncInterval = 300 * time.Millisecond }))
	e.create(e.newProxy("spot"))
	first := e.waitPhase("spot", v1alpha1.PhaseRunning)
	before := testutil.ToFloat64(preemptionsTotal.WithLabelValues(testProvider, "beelink"))
	e.fake.RemoveInstance(first.Status.ProviderID)
	e.fake.NextGetErr(provider.Preempted(errors.New("spot VM proxy-x in zone beelink was preempted at 2026-01-01T00:00:00Z")))
	e.waitEvent("spot", v1alpha1.ReasonPreempted, "was preempted at 2026-01-01T00:00:00Z; building its successor")
	waitFor(t, waitLong, "a second create", func() (bool, error) { return e.fake.CountOf(providertest.OpCreate) == 2, nil })
	got := e.waitPhase("spot", v1alpha1.PhaseRunning)
	c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionPreempted)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonPreempted || !strings.Contains(c.Message, "was preempted") {
		t.Errorf("Preempted condition %+v, want True with the provider's message", c)
	}
	if d := testutil.ToFloat64(preemptionsTotal.WithLabelValues(testProvider, "beelink")) - before; d != 1 {
		t.Errorf("preemptions counter rose by %v, want 1", d)
	}
	if evs, _ := e.events("spot"); slices.ContainsFunc(evs, func(ev eventsv1.Event) bool { return ev.Reason == EventInstanceGone }) {
		t.Error("an InstanceGone event too; a preemption is reported once, as Preempted")
	}
}
