package proxy

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// timedGets is the fake provider with the time of every Get recorded.
type timedGets struct {
	*providertest.Fake
	mu sync.Mutex
	at []time.Time
}

func (p *timedGets) Get(ctx context.Context, id string) (provider.Instance, error) {
	p.mu.Lock()
	p.at = append(p.at, time.Now())
	p.mu.Unlock()
	return p.Fake.Get(ctx, id)
}

func (p *timedGets) times() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.at...)
}

func TestBootPollIntervalDefault(t *testing.T) {
	if DefaultPollInterval != time.Second {
		t.Fatalf("DefaultPollInterval = %s, want 1s", DefaultPollInterval)
	}
}

// TestBootingInstancePolledAtFixedShortInterval: an instance that runs without an
// address yet (a booting guest) is looked at every DefaultPollInterval, a fixed second
// apart and with no error (so not on the backoff curve, whose first retries come
// milliseconds apart and later ones minutes apart), and the Proxy turns Running within
// about a second of the address appearing.
func TestBootingInstancePolledAtFixedShortInterval(t *testing.T) {
	var gets *timedGets
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, _ ctrl.Manager) {
		gets = &timedGets{Fake: r.Providers[testProvider].(*providertest.Fake)}
		r.Providers = map[string]provider.Provider{testProvider: gets}
	}))
	e.fake.SetIPFunc(func(provider.CreateRequest) string { return "" })
	px := e.create(e.newProxy("booting"))
	e.waitProxy("booting", "Provisioning, waiting for an address", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseProvisioning && p.Status.ProviderID != ""
	})

	const polls = 4
	waitFor(t, waitLong, "4 Gets of the booting instance", func() (bool, error) {
		return len(gets.times()) >= polls, nil
	})
	at := gets.times()
	for i := 1; i < len(at); i++ {
		// RequeueAfter never fires early; the upper bound leaves room for a loaded machine.
		if gap := at[i].Sub(at[i-1]); gap < DefaultPollInterval*9/10 || gap > DefaultPollInterval+3*time.Second {
			t.Errorf("Get %d came %s after the one before; want about %s (the fixed boot poll)", i+1, gap, DefaultPollInterval)
		}
	}
	res, err := e.reconcileNow("booting")
	if err != nil || res.RequeueAfter != DefaultPollInterval {
		t.Fatalf("reconcile of a booting instance = %+v, %v; want RequeueAfter %s and no error", res, err, DefaultPollInterval)
	}

	// The guest reports its address just after a poll: the next poll, a second later,
	// publishes it (the former 10 s poll took up to 10 s).
	n := len(gets.times())
	waitFor(t, waitLong, "one more Get", func() (bool, error) { return len(gets.times()) > n, nil })
	inst, _ := e.fake.Instance(providertest.ProviderID(px.InstanceName()))
	inst.IP = "192.168.122.51"
	e.fake.SetInstance(inst)
	learnt := time.Now()
	e.waitPhase("booting", v1alpha1.PhaseRunning)
	if took := time.Since(learnt); took > DefaultPollInterval+3*time.Second {
		t.Errorf("Running %s after the instance reported its address; want within about %s", took, DefaultPollInterval)
	}
}

// TestPendingRetryWritesStatusOnce: each repeat of a pending Create writes the Proxy's
// status once, with the new progress, rather than first "creating instance" and then
// the progress again (two writes per retry, the message and reason flipping).
func TestPendingRetryWritesStatusOnce(t *testing.T) {
	t.Parallel()
	const pends = 6
	var writes atomic.Int32
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, mgr ctrl.Manager) {
		r.PendingRetry = 100 * time.Millisecond
		r.Client = interceptor.NewClient(controllertest.NoWatch{Client: mgr.GetClient()}, interceptor.Funcs{
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
				writes.Add(1)
				return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			},
			// The reconciler writes its status by server-side apply.
			SubResourceApply: func(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
				writes.Add(1)
				return c.SubResource(sub).Apply(ctx, obj, opts...)
			},
		})
	}))
	e.fake.PendCreates(pends)
	e.create(e.newProxy("pendwrites"))
	e.waitPhase("pendwrites", v1alpha1.PhaseRunning)
	creates := e.fake.CountOf(providertest.OpCreate)
	if creates != pends+1 {
		t.Fatalf("%d Creates, want %d pending ones and the one that went through", creates, pends+1)
	}
	// One write announcing the first Create, one per pending result (its progress moved
	// on) and the Running one.
	if got, want := int(writes.Load()), 1+pends+1; got != want {
		t.Errorf("%d status writes for %d Creates (%d pending); want %d: one per change", got, creates, pends, want)
	}
}
