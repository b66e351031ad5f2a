package proxy

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

func TestDeletionRemovesInstanceBeforeFinalizer(t *testing.T) {
	t.Parallel()
	var deleteFails atomic.Bool
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, _ ctrl.Manager) {
		r.Providers[testProvider] = &failingDelete{Fake: r.Providers[testProvider].(*providertest.Fake), fail: &deleteFails}
	}))
	px := e.create(e.newProxy("bye"))
	got := e.waitPhase("bye", v1alpha1.PhaseRunning)
	id := got.Status.ProviderID
	if f := testenv.StatusManagers(got)["proxy-controller"]; !strings.Contains(f, `"f:providerID"`) || !strings.Contains(f, `"f:phase"`) {
		t.Errorf("status managers %v: the reconciler's fields are not the proxy-controller field manager's", testenv.StatusManagers(got))
	}

	// While Delete fails, the Proxy stays, Deleting, with its finalizer and its instance.
	deleteFails.Store(true)
	if err := e.c.Delete(e.ctx, px); err != nil {
		t.Fatal(err)
	}
	e.waitEvent("bye", v1alpha1.ReasonTransientError, "handshake failed")
	got = e.waitPhase("bye", v1alpha1.PhaseDeleting)
	if got.DeletionTimestamp.IsZero() || !slices.Contains(got.Finalizers, Finalizer) {
		t.Errorf("deletionTimestamp %v finalizers %v: want the Proxy held by its finalizer", got.DeletionTimestamp, got.Finalizers)
	}
	if _, ok := e.fake.Instance(id); !ok {
		t.Errorf("instance %s is gone although Delete failed", id)
	}
	if c := provisioned(got); c.Reason != v1alpha1.ReasonDeleting {
		t.Errorf("Provisioned = %+v, want reason Deleting", c)
	}
	e.waitEvent("bye", v1alpha1.ReasonDeleting, "deleting instance")

	deleteFails.Store(false)
	waitFor(t, waitLong, "proxy bye to be gone", func() (bool, error) {
		err := e.c.Get(e.ctx, client.ObjectKeyFromObject(px), &v1alpha1.Proxy{})
		return apierrors.IsNotFound(err), err
	})
	if _, ok := e.fake.Instance(id); ok {
		t.Errorf("instance %s still exists after its Proxy is gone", id)
	}
	e.waitEvent("bye", EventInstanceDeleted, id)
}

// failingDelete is the fake provider with a Delete that fails transiently while fail is set.
type failingDelete struct {
	*providertest.Fake
	fail *atomic.Bool
}

func (f *failingDelete) Delete(ctx context.Context, id string) error {
	if f.fail.Load() {
		return provider.Transient(errors.New("ssh: handshake failed: EOF"))
	}
	return f.Fake.Delete(ctx, id)
}

func TestDeletionFindsUnrecordedInstance(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	px := e.create(e.newProxy("lost"))
	got := e.waitPhase("lost", v1alpha1.PhaseRunning)
	// As if the status write after a Create had been lost.
	base := got.DeepCopy()
	got.Status.ProviderID, got.Status.IP = "", ""
	got.Status.Phase = v1alpha1.PhaseProvisioning
	if err := shared.Client(t).Status().Patch(e.ctx, got, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Delete(e.ctx, px); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "proxy lost to be gone", func() (bool, error) {
		err := e.c.Get(e.ctx, client.ObjectKeyFromObject(px), &v1alpha1.Proxy{})
		return apierrors.IsNotFound(err), err
	})
	if len(e.fake.Instances()) != 0 || e.fake.CountOf(providertest.OpList) == 0 {
		t.Errorf("instances left %v, calls %v; want the listed instance deleted", e.fake.Instances(), e.ops())
	}
}

func TestExternalProxyCreatesNothing(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	px := testbuild.Proxy(e.ns, "ext", testbuild.External("proxy.example.net"), testbuild.WithPort(8080))
	e.create(px)
	got := e.waitPhase("ext", v1alpha1.PhaseRunning)
	if got.Status.IP != "proxy.example.net" || got.Status.ProviderID != "" {
		t.Errorf("status ip %q providerID %q, want the address and no instance", got.Status.IP, got.Status.ProviderID)
	}
	if c := provisioned(got); c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonExternal {
		t.Errorf("Provisioned = %+v, want True/External", c)
	}
	e.waitEvent("ext", v1alpha1.ReasonExternal, "proxy.example.net:8080")
	if err := e.c.Delete(e.ctx, got); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "proxy ext to be gone", func() (bool, error) {
		err := e.c.Get(e.ctx, client.ObjectKeyFromObject(px), &v1alpha1.Proxy{})
		return apierrors.IsNotFound(err), err
	})
	if calls := e.fake.Calls(); len(calls) != 0 {
		t.Errorf("an External proxy called the provider: %v", e.ops())
	}
}

func TestUnconfiguredProviderFails(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	got := e.newProxy("nowhere")
	got.Spec.Provider = "kvm2-away"
	e.create(got)
	if got.Status.Phase != v1alpha1.PhaseFailed {
		t.Fatalf("phase %s, want Failed", got.Status.Phase)
	}
	if !strings.Contains(got.Status.Message, `provider "kvm2-away" is not configured`) || !strings.Contains(got.Status.Message, testProvider) {
		t.Errorf("message %q, want it to name the missing and the configured providers", got.Status.Message)
	}
	if c := provisioned(got); c.Reason != v1alpha1.ReasonProviderNotConfigured {
		t.Errorf("Provisioned = %+v, want reason ProviderNotConfigured", c)
	}
	e.expectEvent(corev1.EventTypeWarning, v1alpha1.ReasonProviderNotConfigured, "kvm2-away")
	if len(e.fake.Calls()) != 0 {
		t.Errorf("provider called: %v", e.ops())
	}
	// Its deletion is not blocked by the missing provider.
	if err := e.c.Delete(e.ctx, got); err != nil {
		t.Fatal(err)
	}
	e.reconcile(got)
	if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(got), &v1alpha1.Proxy{}); !apierrors.IsNotFound(err) {
		t.Errorf("proxy nowhere after the reconcile of its deletion: %v, want it gone", err)
	}
}

func TestCreateProgressShownAndRateLimited(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var reported atomic.Int32
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, _ ctrl.Manager) { r.ProgressInterval = 1 << 62 }))
	e.fake.SetCreateHook(func(ctx context.Context, _ provider.CreateRequest) error {
		provider.ReportProgress(ctx, provider.Progress{Reason: provider.ReasonImageDownloading, Message: "downloading debian-12 into pool default on beelink", Done: 1, Total: 10})
		provider.ReportProgress(ctx, provider.Progress{Reason: provider.ReasonImageDownloading, Message: "downloading debian-12 into pool default on beelink", Done: 5, Total: 10})
		reported.Store(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return provider.Transient(ctx.Err())
		}
	})
	e.create(e.newProxy("slow"))
	e.waitProxy("slow", "Provisioned reason ImageDownloading", func(px *v1alpha1.Proxy) bool {
		return provisioned(px).Reason == v1alpha1.ReasonImageDownloading
	})
	waitFor(t, waitLong, "both progress reports", func() (bool, error) { return reported.Load() == 1, nil })
	got := e.get("slow")
	if c := provisioned(got); !strings.HasSuffix(c.Message, "(10%)") || got.Status.Phase != v1alpha1.PhaseProvisioning {
		t.Errorf("Provisioned %+v phase %s; want the first report (10%%) only, the second rate-limited, while Provisioning", c, got.Status.Phase)
	}
	e.waitEvent("slow", v1alpha1.ReasonImageDownloading, "downloading debian-12")
	close(release)
	got = e.waitPhase("slow", v1alpha1.PhaseRunning)
	if c := provisioned(got); c.Reason != v1alpha1.ReasonInstanceRunning {
		t.Errorf("Provisioned = %+v after the create finished", c)
	}
}

// kvm2 states the percentage in its own message; the status must not repeat it.
func TestCreateProgressPercentNotRepeated(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	e := newProxyEnv(t)
	e.fake.SetCreateHook(func(ctx context.Context, _ provider.CreateRequest) error {
		provider.ReportProgress(ctx, provider.Progress{Reason: provider.ReasonImageDownloading,
			Message: "downloading base image debian-12 to host h1: 4.0 MiB of 10.0 MiB (40%)", Done: 4 << 20, Total: 10 << 20})
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return provider.Transient(ctx.Err())
		}
	})
	e.create(e.newProxy("pct"))
	got := e.waitProxy("pct", "Provisioned reason ImageDownloading", func(px *v1alpha1.Proxy) bool {
		return provisioned(px).Reason == v1alpha1.ReasonImageDownloading
	})
	if want := "downloading base image debian-12 to host h1: 4.0 MiB of 10.0 MiB (40%)"; provisioned(got).Message != want {
		t.Errorf("Provisioned message %q, want %q", provisioned(got).Message, want)
	}
	close(release)
	e.waitPhase("pct", v1alpha1.PhaseRunning)
}

func TestInstanceWithoutAddressStaysProvisioning(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	e.fake.SetIPFunc(func(provider.CreateRequest) string { return "" })
	px := e.newProxy("noip")
	res := e.create(px)
	want := "instance " + px.InstanceName() + " is running; waiting for it to report an address"
	if px.Status.Phase != v1alpha1.PhaseProvisioning || px.Status.Message != want || res.RequeueAfter != DefaultPollInterval {
		t.Fatalf("phase %s, message %q, requeue %s; want Provisioning, %q, polled every %s", px.Status.Phase, px.Status.Message, res.RequeueAfter, want, DefaultPollInterval)
	}
	id := providertest.ProviderID(px.InstanceName())
	inst, _ := e.fake.Instance(id)
	inst.IP = "192.168.122.50"
	e.fake.SetInstance(inst)
	if e.reconcile(px); px.Status.Phase != v1alpha1.PhaseRunning || px.Status.IP != "192.168.122.50" {
		t.Errorf("phase %s, ip %q; want Running at the address the provider learnt later", px.Status.Phase, px.Status.IP)
	}
}

// An instance's external IPv6 (gce with stackType IPV4_IPV6) lands in status.ipv6 beside
// status.ip, written by the reconciler with the rest of its fields.
func TestInstanceIPv6InStatus(t *testing.T) {
	t.Parallel()
	e := newSyncEnv(t)
	e.fake.SetIPFunc(func(provider.CreateRequest) string { return "" })
	px := e.newProxy("dual")
	if e.create(px); px.Status.Phase != v1alpha1.PhaseProvisioning || px.Status.ProviderID == "" {
		t.Fatalf("phase %s, providerID %q; want Provisioning waiting for an address", px.Status.Phase, px.Status.ProviderID)
	}
	inst, _ := e.fake.Instance(providertest.ProviderID(px.InstanceName()))
	inst.IP, inst.IPv6 = "203.0.113.9", "2001:db8:9::"
	e.fake.SetInstance(inst)
	if e.reconcile(px); px.Status.Phase != v1alpha1.PhaseRunning {
		t.Fatalf("phase %s, want Running", px.Status.Phase)
	}
	if px.Status.IP != "203.0.113.9" || px.Status.IPv6 != "2001:db8:9::" {
		t.Errorf("status ip %q, ipv6 %q; want the instance's 203.0.113.9 and 2001:db8:9::", px.Status.IP, px.Status.IPv6)
	}
}

// The health engine writes between the reconciler's read and its write: the reconciler's
// write conflicts, the Proxy is reconciled again from a fresh copy, and both writers'
// fields survive.
func TestStatusWriteKeepsHealthEngineFields(t *testing.T) {
	t.Parallel()
	var raced atomic.Bool
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, mgr ctrl.Manager) {
		r.Client = interceptor.NewClient(controllertest.NoWatch{Client: mgr.GetClient()}, interceptor.Funcs{
			SubResourceApply: func(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
				// The health engine's write lands while the reconciler's write of Running is
				// on its way: it probed the instance and address that write announces.
				u, ok := obj.(interface {
					GetName() string
					GetNamespace() string
					UnstructuredContent() map[string]any
				})
				if ok && !raced.Load() {
					phase, _, _ := unstructured.NestedString(u.UnstructuredContent(), "status", "phase")
					ip, _, _ := unstructured.NestedString(u.UnstructuredContent(), "status", "ip")
					id, _, _ := unstructured.NestedString(u.UnstructuredContent(), "status", "providerID")
					px := &v1alpha1.Proxy{}
					if err := shared.Client(t).Get(ctx, client.ObjectKey{Namespace: u.GetNamespace(), Name: u.GetName()}, px); err == nil &&
						phase == string(v1alpha1.PhaseRunning) && ip != "" && raced.CompareAndSwap(false, true) {
						px.Status.IP, px.Status.ProviderID = ip, id
						healthEngineMarksReady(ctx, t, px)
					}
				}
				return c.SubResource(sub).Apply(ctx, obj, opts...)
			},
		})
	}))
	e.create(e.newProxy("race"))
	got := e.waitProxy("race", "Ready from the health engine, Provisioned from the reconciler", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseReady && provisioned(p).Reason == v1alpha1.ReasonInstanceRunning
	})
	if !raced.Load() {
		t.Fatal("the racing health write never ran")
	}
	if !got.Status.Healthy || meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionHealthy) == nil || got.Status.IP == "" {
		t.Errorf("status %+v: the health engine's fields or the reconciler's were lost", got.Status)
	}

	// A Ready Proxy stays Ready when the reconciler finds its instance running.
	if _, err := e.reconcileNow("race"); err != nil {
		t.Fatal(err)
	}
	if p := e.get("race"); p.Status.Phase != v1alpha1.PhaseReady || !p.Status.Healthy {
		t.Errorf("phase %s healthy %v after a reconcile, want Ready and healthy", p.Status.Phase, p.Status.Healthy)
	}
}

// healthEngineMarksReady writes what the health engine writes after a good probe of px's
// instance, with the uncached client, so the reconciler's pending write carries a stale
// version.
func healthEngineMarksReady(ctx context.Context, t *testing.T, px *v1alpha1.Proxy) {
	px.Status.Healthy = true
	px.Status.ProbeTarget = px.CurrentProbeTarget()
	meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded, Message: "probe ok"})
	if err := controllertest.ApplyHealthStatus(ctx, shared.Client(t), px); err != nil {
		t.Errorf("health write: %v", err)
	}
}

// An API error on the status write comes back from Reconcile as an error, alone.
func TestStatusWriteErrorReturned(t *testing.T) {
	t.Parallel()
	px := envProxy("apierr")
	px.Status = v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseRunning, ProviderID: providertest.ProviderID(px.InstanceName()),
		IP: "10.0.0.5", SpecHash: RenderedHash(px, px.Spec.CloudInit), ObservedGeneration: 1}
	r, _, _ := envReconciler(t, px, interceptor.Funcs{
		SubResourceApply: func(context.Context, client.Client, string, runtime.ApplyConfiguration, ...client.SubResourceApplyOption) error {
			return apierrors.NewServiceUnavailable("etcd leader changed")
		},
	})
	// The instance is gone from the provider: the reconcile has status to write.
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(px)})
	if !apierrors.IsServiceUnavailable(err) || res != (ctrl.Result{}) {
		t.Errorf("reconcile = %+v, %v; want the API error alone", res, err)
	}
}
