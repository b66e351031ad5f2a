package autoscaler

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
)

// farm is pools autoscaled pools, each with a demand Lease from each of gateways gateway
// replicas, settled at the size their demand asks.
func (e *syncEnv) farm(pools, gateways int) []*v1alpha1.ProxyPool {
	e.T.Helper()
	var out []*v1alpha1.ProxyPool
	for i := range pools {
		p := e.CreatePool(fmt.Sprintf("pool-%03d", i), Autoscaling(1, 20, 10))
		e.gatewaysRate(p.Name, gateways, 40, 0)
		out = append(out, p)
	}
	for range 4 {
		for _, p := range out {
			e.Available(p, replicas(p))
			e.Pass(p)
		}
	}
	for _, p := range out {
		if replicas(p) != 4 {
			e.T.Fatalf("pool %s settled at %d replicas, want 4", p.Name, replicas(p))
		}
	}
	return out
}

// gatewaysRate writes the same share of sessions and of rate from each of n gateways.
func (e *syncEnv) gatewaysRate(pool string, n int, sessions, rate float64) {
	e.T.Helper()
	for i := range n {
		e.Demand(pool, fmt.Sprintf("egress-gw-%d", i), demand.Measure{Sessions: sessions / float64(n), RequestsPerSecond: rate / float64(n)})
	}
}

// TestSteadyStateWritesPerMinute counts what the autoscaler writes to the API server in a
// minute of steady state, for 5 pools and 10 gateway replicas, a pass run whenever the
// Leases are written (as the watch would): with the gateways' numbers unchanged (they renew their
// Leases once a minute) it writes nothing; with numbers changing at every report (each
// 15 s), it writes the demand into the status at most once per StatusInterval (30 s), 2
// writes a minute per pool.
func TestSteadyStateWritesPerMinute(t *testing.T) {
	const pools, gateways = 5, 10
	for _, tc := range []struct {
		name     string
		changing bool
		most     int64
	}{
		{"unchanged numbers", false, 0},
		{"numbers changing each report", true, 2 * pools},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newSyncEnv(t)
			ps := e.farm(pools, gateways)
			e.N.writes.Store(0)
			e.N.reads.Store(0)
			passes := 0
			for tick := 1; tick <= 4; tick++ {
				e.Clock.Step(15 * time.Second)
				for _, p := range ps {
					switch {
					case tc.changing:
						e.gatewaysRate(p.Name, gateways, 40, float64(100+tick))
					case tick == 4: // the Reporter's refresh, a minute on
						e.gatewaysRate(p.Name, gateways, 40, 0)
					default:
						continue
					}
					// The watch wakes the pool; the work queue folds the
					// gateways' writes into one pass (more passes write no more:
					// StatusInterval bounds them).
					e.Pass(p)
					passes++
				}
			}
			w := e.N.writes.Load()
			t.Logf("%s: %d autoscaler writes in a minute for %d pools (%d passes, %d reads)", tc.name, w, pools, passes, e.N.reads.Load())
			if w > tc.most {
				t.Fatalf("%d writes in a minute, want at most %d", w, tc.most)
			}
			for _, p := range ps {
				if replicas(p) != 4 {
					t.Fatalf("pool %s moved to %d replicas in steady state", p.Name, replicas(p))
				}
			}
		})
	}
}

// benchFarm is 100 pools with 10 gateway replicas' Leases each, settled, built once for
// the benchmarks (each runs several times).
var benchFarm struct {
	once  sync.Once
	e     *syncEnv
	pools []*v1alpha1.ProxyPool
}

func farm100(b *testing.B) (*syncEnv, []*v1alpha1.ProxyPool) {
	benchFarm.once.Do(func() {
		env := shared.Env(b)
		ctx := context.Background()
		clk := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
		n := &counts{}
		dns := env.Namespace(b, ctx, "demand-bench")
		e := &syncEnv{T: b, Ctx: ctx, C: env.Client, NS: env.Namespace(b, ctx, "autoscale-bench"), DemandNS: dns, Clock: clk, N: n,
			R: &Reconciler{Client: countingClient(env.Client, n), Clock: clk, DemandNamespace: dns}}
		benchFarm.e, benchFarm.pools = e, e.farm(100, 10)
	})
	if benchFarm.e == nil {
		b.Fatal("the benchmark farm could not be built")
	}
	benchFarm.e.T = b
	return benchFarm.e, benchFarm.pools
}

// BenchmarkAutoscalerPass is one pass over 100 pools with 10 gateway replicas' Leases
// each, in steady state, every read a request to the API server (envtest). It reports the
// requests per pass over the 100 pools.
func BenchmarkAutoscalerPass(b *testing.B) {
	e, ps := farm100(b)
	e.N.writes.Store(0)
	e.N.reads.Store(0)
	b.ResetTimer()
	for range b.N {
		for _, p := range ps {
			e.Pass(p)
		}
	}
	b.ReportMetric(float64(e.N.reads.Load())/float64(b.N), "reads/pass")
	b.ReportMetric(float64(e.N.writes.Load())/float64(b.N), "writes/pass")
}

// BenchmarkAutoscalerPassCached is the same pass reading, as in the manager, from an
// informer cache of the pools, Leases and HPAs (writes would go to the API server): the
// autoscaler's own work per pass.
func BenchmarkAutoscalerPassCached(b *testing.B) {
	e, ps := farm100(b)
	env := shared.Env(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ca, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{e.NS: {}},
		ByObject: map[client.Object]cache.ByObject{&coordinationv1.Lease{}: LeaseCache(e.DemandNS)}})
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		b.Fatal("the cache did not start")
	}
	c, err := client.New(env.Config, client.Options{Scheme: env.Scheme, Cache: &client.CacheOptions{Reader: ca}})
	if err != nil {
		b.Fatal(err)
	}
	r := &Reconciler{Client: c, Clock: e.Clock, DemandNamespace: e.DemandNS}
	pass := func() {
		for _, p := range ps {
			res, err := r.Reconcile(ctx, reconcileRequest{NamespacedName: client.ObjectKeyFromObject(p)})
			if err != nil || res.RequeueAfter <= 0 {
				b.Fatalf("pass of %s: %v, requeue %s", p.Name, err, res.RequeueAfter)
			}
		}
	}
	pass() // starts the informers and waits for their sync
	b.ResetTimer()
	for range b.N {
		pass()
	}
}
