package controller

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// These tests run the reconciler over controller-runtime's fake client, with status
// writes of another writer (the health engine) and the conflicts they cause injected by
// an interceptor: object reads and writes are all they need, no API server.

// otherWriter is a status write racing the reconciler's: change is applied to the
// stored Proxy, and the reconciler's patch then fails with a conflict.
type otherWriter func(*v1alpha1.ProxyStatus)

// conflicting returns interceptor funcs under which the n-th status patch of a Proxy
// (counting from 1) first lets writers[n-1] write, then fails with a conflict; patches
// past the writers go through. patches counts every status patch.
func conflicting(t *testing.T, patches *atomic.Int32, writers ...otherWriter) interceptor.Funcs {
	return interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			n := int(patches.Add(1))
			if n > len(writers) {
				return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			}
			stored := &v1alpha1.Proxy{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), stored); err != nil {
				t.Errorf("other writer: %v", err)
				return err
			}
			writers[n-1](&stored.Status)
			if err := c.Status().Update(ctx, stored); err != nil {
				t.Errorf("other writer: %v", err)
				return err
			}
			return apierrors.NewConflict(schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "proxies"},
				obj.GetName(), errConflictInjected)
		},
	}
}

var errConflictInjected = errors.New("the object has been modified; please apply your changes to the latest version and try again")

// fakeClusterReconciler is a reconciler over a fake client holding px, with a fake
// provider named testProvider.
func fakeClusterReconciler(t *testing.T, px *v1alpha1.Proxy, funcs interceptor.Funcs) (*ProxyReconciler, client.Client, *providertest.Fake) {
	t.Helper()
	c := testenv.FakeClient(t, funcs, px)
	f := providertest.NewFake()
	return &ProxyReconciler{Client: c, APIReader: c, Providers: map[string]provider.Provider{testProvider: f}}, c, f
}

func managedProxy(name string) *v1alpha1.Proxy {
	return &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Generation: 1,
			Finalizers: []string{Finalizer}},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeManaged, Provider: testProvider, Port: 3128,
			Placement: v1alpha1.ProxyPlacement{Region: "home", Zone: "beelink", MachineType: "small", Image: "debian-12"}},
	}
}

func reconcileOnce(t *testing.T, r *ProxyReconciler, px *v1alpha1.Proxy) ctrl.Result {
	t.Helper()
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(px)})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return res
}

func readProxy(t *testing.T, c client.Client, px *v1alpha1.Proxy) *v1alpha1.Proxy {
	t.Helper()
	got := &v1alpha1.Proxy{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(px), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// The health engine writes while Create's "Provisioning" status goes out: the conflict
// must not cost the spec hash recorded after the Create, or the next reconcile replaces
// the instance it has just built.
func TestCreateKeepsSpecHashAfterStatusConflict(t *testing.T) {
	var patches atomic.Int32
	px := managedProxy("hash")
	r, c, f := fakeClusterReconciler(t, px, conflicting(t, &patches, func(st *v1alpha1.ProxyStatus) {
		st.ConsecutiveProbeFailures = 1 // any write of the health engine's
	}))
	reconcileOnce(t, r, px)
	got := readProxy(t, c, px)
	if got.Status.SpecHash != RenderedHash(px, px.Spec.CloudInit) || got.Status.ProviderID == "" {
		t.Fatalf("after the first reconcile: specHash %q (want %q), providerID %q", got.Status.SpecHash, RenderedHash(px, px.Spec.CloudInit), got.Status.ProviderID)
	}
	if got.Status.ConsecutiveProbeFailures != 1 {
		t.Errorf("the other writer's field was lost: %+v", got.Status)
	}
	if creates := f.CallsOf(providertest.OpCreate); len(creates) != 1 || creates[0].Arg.(provider.CreateRequest).SpecHash != RenderedHash(px, px.Spec.CloudInit) {
		t.Errorf("creates %+v, want one carrying the spec hash %s", creates, RenderedHash(px, px.Spec.CloudInit))
	}

	reconcileOnce(t, r, px)
	if n, d := f.CountOf(providertest.OpCreate), f.CountOf(providertest.OpDelete); n != 1 || d != 0 {
		t.Errorf("after a second reconcile: %d creates, %d deletes; want 1 and 0 (no replacement): %v", n, d, f.Calls())
	}
	if patches.Load() < 2 {
		t.Errorf("%d status patches: the conflict was never met", patches.Load())
	}
}

// Two conflicts in a row: the reconciler's changes are laid onto the second fresh copy
// relative to the status it started from, so a phase it never changed (Ready) is not
// brought back over the health engine's Running with healthy=false.
func TestSecondConflictKeepsOtherWritersPhase(t *testing.T) {
	var patches atomic.Int32
	px := managedProxy("twice")
	id := providertest.ProviderID(px.InstanceName())
	px.Status = v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, Healthy: true, ProviderID: id, IP: "10.0.0.9",
		SpecHash: RenderedHash(px, px.Spec.CloudInit), ObservedGeneration: 1, Message: "an older message"}
	r, c, f := fakeClusterReconciler(t, px, conflicting(t, &patches,
		func(st *v1alpha1.ProxyStatus) { // three failed probes: out of rotation
			st.Phase, st.Healthy, st.ConsecutiveProbeFailures = v1alpha1.PhaseRunning, false, 3
		},
		func(st *v1alpha1.ProxyStatus) { st.ConsecutiveProbeFailures = 4 },
	))
	f.SetInstance(provider.Instance{ProviderID: id, Name: px.InstanceName(), UID: string(px.UID), State: provider.StateRunning, IP: "10.0.0.9"})
	reconcileOnce(t, r, px)
	got := readProxy(t, c, px)
	if got.Status.Phase != v1alpha1.PhaseRunning || got.Status.Healthy || got.Status.ConsecutiveProbeFailures != 4 {
		t.Errorf("phase %s healthy %v failures %d; want Running, unhealthy, 4 as the health engine left them",
			got.Status.Phase, got.Status.Healthy, got.Status.ConsecutiveProbeFailures)
	}
	if want := "instance " + px.InstanceName() + " is running at 10.0.0.9"; got.Status.Message != want {
		t.Errorf("message %q, want the reconciler's %q", got.Status.Message, want)
	}
	if n := patches.Load(); n != 3 {
		t.Errorf("%d status patches, want 3 (two conflicts, then the write)", n)
	}
}

// A reconcile that reads a stale copy of the Proxy (the cache behind the reconciler's own
// last writes: the instance not recorded yet) while its basic-auth Secret is missing must
// not lay "Pending, no instance" over the Running Proxy the server holds. Its patch meets
// a conflict; the fresh copy shows another instance than the one it decided from, so it
// reconciles again instead, and that run, on the fresh copy, says the instance keeps its
// configuration.
func TestStaleReadIsReconciledAgain(t *testing.T) {
	px := managedProxy("stale")
	px.Spec.Proxy = &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"},
		BasicAuth: &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "gone"}}}
	px.Status = v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseProvisioning, ObservedGeneration: 1,
		Message: "creating instance " + px.InstanceName()}
	var staleCopy *v1alpha1.Proxy
	var reads atomic.Int32
	r, c, f := fakeClusterReconciler(t, px, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if p, ok := obj.(*v1alpha1.Proxy); ok && staleCopy != nil && reads.Add(1) == 1 {
				staleCopy.DeepCopyInto(p)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	old := readProxy(t, c, px)
	// The earlier reconcile's last write: the instance runs.
	id := providertest.ProviderID(px.InstanceName())
	f.SetInstance(provider.Instance{ProviderID: id, Name: px.InstanceName(), UID: string(px.UID), State: provider.StateRunning, IP: "10.0.0.7"})
	live := readProxy(t, c, px)
	live.Status.Phase, live.Status.ProviderID, live.Status.IP, live.Status.SpecHash = v1alpha1.PhaseRunning, id, "10.0.0.7", "built-hash"
	if err := c.Status().Update(context.Background(), live); err != nil {
		t.Fatal(err)
	}
	staleCopy = old

	res := reconcileOnce(t, r, px)
	if res.RequeueAfter <= 0 {
		t.Errorf("result %+v after the stale read, want a requeue", res)
	}
	got := readProxy(t, c, px)
	if got.Status.Phase != v1alpha1.PhaseRunning || got.Status.ProviderID != id {
		t.Fatalf("after the stale reconcile: phase %s, providerID %q; want Running on %s as the server held it", got.Status.Phase, got.Status.ProviderID, id)
	}
	reconcileOnce(t, r, px)
	got = readProxy(t, c, px)
	if got.Status.Phase != v1alpha1.PhaseRunning || !strings.Contains(got.Status.Message, "keeps the configuration it was built with") {
		t.Errorf("after a fresh reconcile: phase %s, message %q; want Running and the instance keeping its configuration", got.Status.Phase, got.Status.Message)
	}
	if n := f.CountOf(providertest.OpCreate) + f.CountOf(providertest.OpDelete); n != 0 {
		t.Errorf("provider calls %v: nothing may be created or deleted", f.Calls())
	}
}
