package proxy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/orphangc"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// oldInstance puts in place the instance a deleted Proxy of the same name left behind:
// same instance name, another owner UID, old enough for orphan GC.
func (e *proxyEnv) oldInstance(px *v1alpha1.Proxy) string {
	return e.fake.SetInstance(provider.Instance{Name: px.InstanceName(), UID: "uid-of-the-proxy-before-the-restore",
		State: provider.StateRunning, IP: "10.9.9.9", CreatedAt: time.Now().Add(-time.Hour)})
}

// phasesAtCreate records, for each Create, the Proxy's phase as the API server had it
// while the Create ran.
func (e *proxyEnv) phasesAtCreate(name string) func() []v1alpha1.ProxyPhase {
	var mu sync.Mutex
	var phases []v1alpha1.ProxyPhase
	e.fake.SetCreateHook(func(ctx context.Context, _ provider.CreateRequest) error {
		px := &v1alpha1.Proxy{}
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: e.ns, Name: name}, px); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		phases = append(phases, px.Status.Phase)
		return nil
	})
	return func() []v1alpha1.ProxyPhase {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(phases)
	}
}

func (e *proxyEnv) waitOwnedByOther(name string) *v1alpha1.Proxy {
	e.t.Helper()
	got := e.waitProxy(name, "Failed with OwnedByOther", func(px *v1alpha1.Proxy) bool {
		return px.Status.Phase == v1alpha1.PhaseFailed && provisioned(px).Reason == v1alpha1.ReasonOwnedByOther
	})
	if !strings.Contains(got.Status.Message, "uid-of-the-proxy-before-the-restore") {
		e.t.Errorf("message %q does not carry the provider's error", got.Status.Message)
	}
	ev := e.waitEvent(name, v1alpha1.ReasonOwnedByOther, "as soon as orphan GC deletes that instance")
	if ev.Type != corev1.EventTypeWarning {
		e.t.Errorf("event type %s, want Warning", ev.Type)
	}
	return got
}

// The whole story of a Proxy applied again (a restore from backup) while its old
// instance stands: Create fails on the old instance's UID, the Proxy is Failed; orphan GC
// deletes the old instance, whose Proxy is gone, and wakes the Proxy, which becomes
// Running without anyone editing it.
func TestOwnedByOtherRunsOnceGCRemovesTheOldInstance(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, _ ctrl.Manager) { r.FailedRecheckInterval = time.Hour }))
	px := e.newProxy("restored")
	oldID := e.oldInstance(px)
	e.create(px)
	e.waitOwnedByOther("restored")

	gc := &orphangc.OrphanGC{Client: e.c, Providers: map[string]provider.Provider{testProvider: e.fake},
		Grace: 10 * time.Minute, Log: logr.Discard(), Wake: e.r.Wake}
	res, err := gc.Sweep(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(res.Deleted[testProvider], oldID) {
		t.Fatalf("GC deleted %v, want the old instance %s", res.Deleted, oldID)
	}
	got := e.waitPhase("restored", v1alpha1.PhaseRunning)
	if got.Generation != 1 {
		t.Errorf("generation %d: the Proxy was edited", got.Generation)
	}
	inst, ok := e.fake.Instance(got.Status.ProviderID)
	if !ok || inst.UID != string(got.UID) {
		t.Errorf("instance %+v (found %v), want one owned by the Proxy's uid %s", inst, ok, got.UID)
	}
	if c := provisioned(got); c.Reason != v1alpha1.ReasonInstanceRunning {
		t.Errorf("Provisioned = %+v, want InstanceRunning", c)
	}
}

// Without GC's help (the other owner removed its instance itself), the slow timer
// retries; between retries the Proxy stays Failed rather than flapping through
// Provisioning on every check.
func TestOwnedByOtherRecheckedOnTheTimer(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, _ ctrl.Manager) { r.FailedRecheckInterval = 200 * time.Millisecond }))
	px := e.newProxy("recheck")
	phases := e.phasesAtCreate("recheck")
	oldID := e.oldInstance(px)
	e.create(px)
	e.waitOwnedByOther("recheck")
	waitFor(t, waitLong, "three re-checks", func() (bool, error) { return len(phases()) >= 4, nil })
	if !e.fake.RemoveInstance(oldID) {
		t.Fatal("the old instance was deleted by the reconciler")
	}
	e.waitPhase("recheck", v1alpha1.PhaseRunning)
	seen := phases()
	if seen[0] != v1alpha1.PhaseProvisioning {
		t.Errorf("phase %s during the first Create, want Provisioning", seen[0])
	}
	for i, ph := range seen[1 : len(seen)-1] {
		if ph != v1alpha1.PhaseFailed {
			t.Errorf("phase %s during re-check %d, want Failed: %v", ph, i+1, seen)
		}
	}
}

// leftBehindErr is what kvm2's Delete returns for a providerID whose host left the
// providers config.
func leftBehindErr(id string) error {
	return provider.Permanent(fmt.Errorf("instance %s is on host hv-old, which is no longer in the providers config: "+
		"remove it there by hand with virsh destroy proxy-x; virsh undefine --nvram --remove-all-storage proxy-x: %w",
		id, provider.ErrLeftBehind))
}

// A Delete that leaves the instance behind lets the Proxy go, and says so with a Warning
// carrying the provider's message instead of a Normal "deleted instance".
func TestDeleteLeftBehindWarnsAndFinishes(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	px := e.create(e.newProxy("moved"))
	id := e.waitPhase("moved", v1alpha1.PhaseRunning).Status.ProviderID
	e.fake.NextDeleteErr(leftBehindErr(id))
	if err := e.c.Delete(e.ctx, px); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "proxy moved to be gone", func() (bool, error) {
		err := e.c.Get(e.ctx, client.ObjectKeyFromObject(px), &v1alpha1.Proxy{})
		return apierrors.IsNotFound(err), err
	})
	ev := e.waitEvent("moved", v1alpha1.ReasonInstanceLeftBehind, "virsh undefine")
	if ev.Type != corev1.EventTypeWarning || ev.Note != leftBehindErr(id).Error() {
		t.Errorf("event %s %q, want a Warning with the provider's message %q", ev.Type, ev.Note, leftBehindErr(id))
	}
	evs, err := e.events("moved")
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Reason == EventInstanceDeleted {
			t.Errorf("a %s event %q for an instance left behind", ev.Reason, ev.Note)
		}
	}
}

// A replacement whose old instance is left behind goes on and builds the new one.
func TestReplaceLeftBehindBuildsTheNewInstance(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	e.create(e.newProxy("rezone"))
	id := e.waitPhase("rezone", v1alpha1.PhaseRunning).Status.ProviderID
	e.fake.NextDeleteErr(leftBehindErr(id))
	e.edit("rezone", "spec.placement.zone", func(px *v1alpha1.Proxy) { px.Spec.Placement.Zone = "nuc" })
	e.waitEvent("rezone", v1alpha1.ReasonInstanceLeftBehind, "hv-old")
	got := e.waitProxy("rezone", "Running with the new spec", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseRunning && p.Status.SpecHash == RenderedHash(p, p.Spec.CloudInit)
	})
	if n := e.fake.CountOf(providertest.OpCreate); n != 2 {
		t.Errorf("%d creates, want 2: %v (phase %s)", n, e.ops(), got.Status.Phase)
	}
}

// A Managed Proxy whose Create defined an instance but failed before its providerID was
// recorded, then switched to External: the instance is found by the Proxy's UID and
// deleted before the Proxy is published as External.
func TestManagedToExternalBeforeProviderIDDeletesInstance(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	var failing atomic.Bool
	failing.Store(true)
	e.fake.SetCreateHook(func(_ context.Context, req provider.CreateRequest) error {
		if !failing.Load() {
			return nil
		}
		e.fake.SetInstance(provider.Instance{Name: req.Name, UID: req.UID, State: provider.StateStopped, CreatedAt: time.Now()})
		return provider.Transient(errors.New("domain defined but not started: bridge br9 not found on host hv1"))
	})
	e.create(e.newProxy("switch"))
	e.waitProxy("switch", "a failed Create with no providerID", func(p *v1alpha1.Proxy) bool {
		return provisioned(p).Reason == v1alpha1.ReasonTransientError && p.Status.ProviderID == ""
	})
	failing.Store(false)
	e.fake.SetCreateHook(func(context.Context, provider.CreateRequest) error {
		return errors.New("Create called for an External proxy")
	})
	// The reconciler is still retrying the Create and writing status meanwhile.
	e.edit("switch", "spec.mode", func(px *v1alpha1.Proxy) {
		px.Spec.Mode, px.Spec.Address = v1alpha1.ProxyModeExternal, "squid.example.net"
	})
	e.waitProxy("switch", "Running as External", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseRunning && provisioned(p).Reason == v1alpha1.ReasonExternal
	})
	if insts := e.fake.Instances(); len(insts) != 0 {
		t.Errorf("instances %+v left after the switch to External", insts)
	}
	e.waitEvent("switch", EventInstanceDeleted, "the proxy is External now")
}
