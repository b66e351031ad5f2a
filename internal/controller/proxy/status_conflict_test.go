package proxy

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
)

// These tests run the reconciler, called directly, against the envtest API server, with
// the health engine's writes injected by an interceptor right before the reconciler's
// status applies: the server's own server-side apply keeps the writers' fields apart and
// enforces the version the reconciler's first write carries.

// otherWriter is a health engine write racing the reconciler's: it applies, under the
// proxy-health field manager, what change makes of the stored status's health part.
type otherWriter func(*v1alpha1.ProxyStatus)

// conflicting returns interceptor funcs under which the n-th status apply of the
// reconciler (counting from 1) is preceded by writers[n-1], when there is one. applies
// counts every status apply of the reconciler.
func conflicting(t *testing.T, real client.Client, applies *atomic.Int32, writers map[int]otherWriter) interceptor.Funcs {
	return interceptor.Funcs{
		SubResourceApply: func(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
			n := int(applies.Add(1))
			if w, ok := writers[n]; ok {
				u := obj.(interface {
					GetName() string
					GetNamespace() string
				})
				stored := &v1alpha1.Proxy{}
				key := client.ObjectKey{Namespace: u.GetNamespace(), Name: u.GetName()}
				if err := real.Get(ctx, key, stored); err != nil {
					t.Errorf("other writer: %v", err)
					return err
				}
				w(&stored.Status)
				if err := controllertest.ApplyHealthStatus(ctx, real, stored); err != nil {
					t.Errorf("other writer: %v", err)
					return err
				}
			}
			return c.SubResource(sub).Apply(ctx, obj, opts...)
		},
	}
}

// applyControllerStatus sets up the reconciler's part of px's status, as it applies it.
func applyControllerStatus(ctx context.Context, t *testing.T, c client.Client, px *v1alpha1.Proxy) {
	t.Helper()
	st := px.Status
	for i := range st.Conditions {
		if st.Conditions[i].LastTransitionTime.IsZero() {
			st.Conditions[i].LastTransitionTime = metav1.Now()
		}
	}
	if err := statusapply.Status(ctx, c, px, proxyStatusOf(&st), statusapply.ProxyController); err != nil {
		t.Fatal(err)
	}
}

// envReconciler creates px (with its finalizer) in a namespace of its own and returns a
// reconciler over the envtest API server whose client runs through funcs, with a fake
// provider named testProvider.
func envReconciler(t *testing.T, px *v1alpha1.Proxy, funcs interceptor.Funcs) (*ProxyReconciler, client.Client, *providertest.Fake) {
	t.Helper()
	ctx := testContext(t)
	env := shared.Env(t)
	px.Namespace = env.Namespace(t, ctx, "st")
	st := px.Status
	px.Status = v1alpha1.ProxyStatus{}
	if err := env.Client.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	if st.Phase != "" || st.Healthy {
		px.Status = st
		applyControllerStatus(ctx, t, env.Client, px)
		px.Status = st
		if err := controllertest.ApplyHealthStatus(ctx, env.Client, px); err != nil {
			t.Fatal(err)
		}
	}
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	c := interceptor.NewClient(wc, funcs)
	f := providertest.NewFake()
	return &ProxyReconciler{Client: c, APIReader: env.Client, Providers: map[string]provider.Provider{testProvider: f}}, env.Client, f
}

func managedProxy(name string) *v1alpha1.Proxy {
	px := testbuild.Proxy("default", name, testbuild.WithUID("uid-"+name), testbuild.WithFinalizers(Finalizer),
		testbuild.Managed(), testbuild.WithProvider(testProvider), testbuild.WithPort(3128),
		testbuild.WithPlacement(v1alpha1.ProxyPlacement{Region: "home", Zone: "beelink", MachineType: "small", Image: "debian-12"}))
	px.Generation = 1
	return px
}

// envProxy is managedProxy as the API server takes it: no UID, no generation.
func envProxy(name string) *v1alpha1.Proxy {
	px := managedProxy(name)
	px.UID, px.Generation = "", 0
	return px
}

// reconcileSettled reconciles px until a reconcile is not sent back for having read a
// stale copy (at most five times) and returns how many reconciles that took.
func reconcileSettled(t *testing.T, r *ProxyReconciler, px *v1alpha1.Proxy) int {
	t.Helper()
	for n := 1; n <= 5; n++ {
		res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(px)})
		if err != nil {
			t.Fatalf("reconcile: %v", err)
		}
		if res.RequeueAfter != staleRetry {
			return n
		}
	}
	t.Fatal("five reconciles in a row were sent back for a stale read")
	return 0
}

func readProxy(t *testing.T, c client.Client, px *v1alpha1.Proxy) *v1alpha1.Proxy {
	t.Helper()
	got := &v1alpha1.Proxy{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(px), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// The health engine writes while Create's "Provisioning" status goes out (its first
// apply, which then finds the Proxy changed and reconciles again) or while the Create
// runs: neither may cost the spec hash recorded after the Create, or the next reconcile
// replaces the instance it has just built.
func TestCreateKeepsSpecHashAfterStatusConflict(t *testing.T) {
	t.Parallel()
	for _, at := range []int{1, 2} {
		t.Run(map[int]string{1: "on the Provisioning write", 2: "during the Create"}[at], func(t *testing.T) {
			var applies atomic.Int32
			px := envProxy("hash")
			r, c, f := envReconciler(t, px, interceptor.Funcs{})
			r.Client = interceptor.NewClient(r.Client.(client.WithWatch), conflicting(t, c, &applies, map[int]otherWriter{
				at: func(st *v1alpha1.ProxyStatus) { st.ConsecutiveProbeFailures = 1 }, // any write of the health engine's
			}))
			px = readProxy(t, c, px)
			reconcileSettled(t, r, px)
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

			reconcileSettled(t, r, px)
			if n, d := f.CountOf(providertest.OpCreate), f.CountOf(providertest.OpDelete); n != 1 || d != 0 {
				t.Errorf("after a second reconcile: %d creates, %d deletes; want 1 and 0 (no replacement): %v", n, d, f.Calls())
			}
			if applies.Load() < 2 {
				t.Errorf("%d status applies: the other writer was never met", applies.Load())
			}
		})
	}
}

// Two health writes in a row, each right before the reconciler's apply: each apply finds
// the Proxy changed and the Proxy is reconciled again, from the fresh copy, so a Ready
// the health engine's failed probes have taken back is not brought back over Running
// with healthy=false.
func TestSecondConflictKeepsOtherWritersPhase(t *testing.T) {
	t.Parallel()
	var applies atomic.Int32
	px := envProxy("twice")
	id := providertest.ProviderID(px.InstanceName())
	px.Status = v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, Healthy: true, ProviderID: id, IP: "10.0.0.9",
		SpecHash: RenderedHash(px, px.Spec.CloudInit), ObservedGeneration: 1, Message: "an older message",
		ProbeTarget: id + " 10.0.0.9:3128", Conditions: []metav1.Condition{{Type: v1alpha1.ConditionHealthy,
			Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded, Message: "probe ok"}}}
	r, c, f := envReconciler(t, px, interceptor.Funcs{})
	r.Client = interceptor.NewClient(r.Client.(client.WithWatch), conflicting(t, c, &applies, map[int]otherWriter{
		1: func(st *v1alpha1.ProxyStatus) { // three failed probes: out of rotation
			st.Healthy, st.ConsecutiveProbeFailures = false, 3
			st.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionFalse,
				Reason: v1alpha1.ReasonProbeFailed, Message: "probes failing"}}
		},
		2: func(st *v1alpha1.ProxyStatus) { st.ConsecutiveProbeFailures = 4 },
	}))
	px = readProxy(t, c, px)
	f.SetInstance(provider.Instance{ProviderID: id, Name: px.InstanceName(), UID: string(px.UID), State: provider.StateRunning, IP: "10.0.0.9"})
	if n := reconcileSettled(t, r, px); n != 3 {
		t.Errorf("%d reconciles, want 3 (two sent back, then the write)", n)
	}
	got := readProxy(t, c, px)
	if got.Status.Phase != v1alpha1.PhaseRunning || got.Status.Healthy || got.Status.ConsecutiveProbeFailures != 4 {
		t.Errorf("phase %s healthy %v failures %d; want Running, unhealthy, 4 as the health engine left them",
			got.Status.Phase, got.Status.Healthy, got.Status.ConsecutiveProbeFailures)
	}
	if want := "instance " + px.InstanceName() + " is running at 10.0.0.9"; got.Status.Message != want {
		t.Errorf("message %q, want the reconciler's %q", got.Status.Message, want)
	}
	if n := applies.Load(); n != 3 {
		t.Errorf("%d status applies, want 3 (two conflicts, then the write)", n)
	}
}

// A reconcile that reads a stale copy of the Proxy (the cache behind the reconciler's own
// last writes: the instance not recorded yet) while its basic-auth Secret is missing must
// not lay "Pending, no instance" over the Running Proxy the server holds. Its apply
// carries the version it read and meets a conflict, so it reconciles again instead, and
// that run, on a fresh copy, says the instance keeps its configuration.
func TestStaleReadIsReconciledAgain(t *testing.T) {
	t.Parallel()
	px := envProxy("stale")
	px.Spec.Proxy = &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"},
		BasicAuth: &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "gone"}}}
	px.Status = v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseProvisioning, ObservedGeneration: 1,
		Message: "creating instance " + px.InstanceName()}
	var staleCopy *v1alpha1.Proxy
	var reads atomic.Int32
	r, c, f := envReconciler(t, px, interceptor.Funcs{
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
	f.SetInstance(provider.Instance{ProviderID: id, Name: px.InstanceName(), UID: string(old.UID), State: provider.StateRunning, IP: "10.0.0.7"})
	live := readProxy(t, c, px)
	live.Status.Phase, live.Status.ProviderID, live.Status.IP, live.Status.SpecHash = v1alpha1.PhaseRunning, id, "10.0.0.7", "built-hash"
	applyControllerStatus(context.Background(), t, c, live)
	staleCopy = old

	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(px)})
	if err != nil || res.RequeueAfter <= 0 {
		t.Errorf("result %+v, %v after the stale read, want a requeue alone", res, err)
	}
	got := readProxy(t, c, px)
	if got.Status.Phase != v1alpha1.PhaseRunning || got.Status.ProviderID != id {
		t.Fatalf("after the stale reconcile: phase %s, providerID %q; want Running on %s as the server held it", got.Status.Phase, got.Status.ProviderID, id)
	}
	reconcileSettled(t, r, px)
	got = readProxy(t, c, px)
	if got.Status.Phase != v1alpha1.PhaseRunning || !strings.Contains(got.Status.Message, "keeps the configuration it was built with") {
		t.Errorf("after a fresh reconcile: phase %s, message %q; want Running and the instance keeping its configuration", got.Status.Phase, got.Status.Message)
	}
	if n := f.CountOf(providertest.OpCreate) + f.CountOf(providertest.OpDelete); n != 0 {
		t.Errorf("provider calls %v: nothing may be created or deleted", f.Calls())
	}
}
