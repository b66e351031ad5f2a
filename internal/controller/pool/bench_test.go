package pool

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// BenchmarkProxyPoolThousand creates one pool of 1,000 replicas, with 3 Proxy workers (the
// default) and with 10, in the environment BenchmarkThousandProxies uses (see there), and
// reports the time until the pool has made every child and until every child is Ready,
// the CPU time, the peak RSS and the API requests per child. It then rewrites every
// child's status once the way the health engine's heartbeat does (a new probe time and
// latency) and reports how many pool reconciles the 1,000 writes caused.
func BenchmarkProxyPoolThousand(b *testing.B) {
	env := testenv.StartT(b)
	for _, workers := range []int{3, 10} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				f, e := poolRound(b, env, 1000, workers)
				f.report(b, 1000)
				b.ReportMetric(heartbeatReconciles(b, e, 1000), "reconciles/1000-heartbeats")
			}
		})
	}
}

// poolRound creates a pool of n in an environment of its own (stopped when b ends) and
// measures until every child is Ready and available.
func poolRound(b *testing.B, env *testenv.Env, n, workers int) (roundFigures, *poolEnv) {
	resetPeakRSS()
	var requests atomic.Int64
	e := newBenchEnv(b, env, workers, &requests)
	f := measure(b, n, &requests, false, func() {
		e.Create(e.NewPool("bench", int32(n)))
	}, func() (bool, error) {
		st := e.GetPool("bench").Status
		return st.ReadyReplicas == int32(n) && st.AvailableReplicas == int32(n),
			fmt.Errorf("%d children, %d Ready, %d available", st.Replicas, st.ReadyReplicas, st.AvailableReplicas)
	})
	if c := controllertest.PoolCondition(e.GetPool("bench"), v1alpha1.PoolConditionProgressing); c.Reason != v1alpha1.PoolReasonComplete {
		b.Errorf("Progressing %+v after every child is available", c)
	}
	return f, e
}

// BenchmarkPoolVersusBare compares a pool of n with n bare Proxies in rounds that
// alternate between the two, so that the machine's other load, which drifts during a
// run, falls on both alike: rounds of pairs (POOL_BENCH_ROUNDS, default 3) of n children
// (POOL_BENCH_CHILDREN, default 1000), the order within a pair alternating (bare then
// pool, pool then bare, ...) so that neither always goes first. Every round is a
// sub-benchmark of its own with its figures (roundFigures.report); the last, "ratios",
// reports the median over the pairs of pool ÷ bare in wall time, CPU time (this process
// and the API server and etcd: far less sensitive to other load), peak RSS and API
// requests per child, and the median pool reconciles that one status write to every
// child caused (each pool round ends with heartbeatReconciles), and logs each pair.
func BenchmarkPoolVersusBare(b *testing.B) {
	rounds, n := benchEnvInt(b, "POOL_BENCH_ROUNDS", 3), benchEnvInt(b, "POOL_BENCH_CHILDREN", 1000)
	env := testenv.StartT(b)
	for _, workers := range []int{3, 10} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			bare, pool := make([]roundFigures, rounds), make([]roundFigures, rounds)
			for r := range rounds {
				kinds := []string{"bare", "pool"}
				if r%2 == 1 {
					kinds = []string{"pool", "bare"}
				}
				for _, kind := range kinds {
					b.Run(fmt.Sprintf("round%d-%s", r+1, kind), func(b *testing.B) {
						if kind == "bare" {
							bare[r] = bareRound(b, env, n, workers)
							bare[r].report(b, n)
						} else {
							var e *poolEnv
							pool[r], e = poolRound(b, env, n, workers)
							pool[r].heartbeatPasses = heartbeatReconciles(b, e, int32(n))
							pool[r].report(b, n)
							b.ReportMetric(pool[r].heartbeatPasses/float64(n), "reconciles/child-status-write")
						}
					})
				}
			}
			b.Run("ratios", func(b *testing.B) {
				reportRatios(b, bare, pool)
			})
		})
	}
}

// reportRatios reports the medians of pool ÷ bare over the pairs and logs each pair.
func reportRatios(b *testing.B, bare, pool []roundFigures) {
	var wall, cpu, rss, req, beats []float64
	for r := range bare {
		if bare[r].wall == 0 || pool[r].wall == 0 {
			b.Fatalf("round %d did not finish (bare %+v, pool %+v)", r+1, bare[r], pool[r])
		}
		wall = append(wall, pool[r].wall.Seconds()/bare[r].wall.Seconds())
		cpu = append(cpu, pool[r].cpu.Seconds()/bare[r].cpu.Seconds())
		rss = append(rss, pool[r].rssMiB/bare[r].rssMiB)
		req = append(req, pool[r].requestsPerProxy/bare[r].requestsPerProxy)
		beats = append(beats, pool[r].heartbeatPasses)
		b.Logf("round %d: time %.2f (%.1f s / %.1f s), CPU %.2f (%.1f s / %.1f s), RSS %.2f (%.0f MiB / %.0f MiB), "+
			"requests %.2f (%.2f / %.2f per child); pool passes %.0f to all Ready, %.0f for a status write to every child; load %.1f / %.1f",
			r+1, wall[r], pool[r].wall.Seconds(), bare[r].wall.Seconds(), cpu[r], pool[r].cpu.Seconds(), bare[r].cpu.Seconds(),
			rss[r], pool[r].rssMiB, bare[r].rssMiB, req[r], pool[r].requestsPerProxy, bare[r].requestsPerProxy,
			pool[r].poolPasses, pool[r].heartbeatPasses, pool[r].load1, bare[r].load1)
	}
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(median(wall), "time-pool/bare")
	b.ReportMetric(median(cpu), "cpu-pool/bare")
	b.ReportMetric(median(rss), "RSS-pool/bare")
	b.ReportMetric(median(req), "requests-pool/bare")
	b.ReportMetric(median(beats), "reconciles/status-write-to-every-child")
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// benchEnvInt is the positive integer in the environment variable name, or def when unset.
func benchEnvInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// heartbeatReconciles rewrites every child's probe time and latency once, as the health
// engine does on each successful probe, and counts the pool reconciles that follow.
func heartbeatReconciles(b *testing.B, e *poolEnv, n int32) float64 {
	count := func() float64 { return poolReconciles(b) }
	before := quiet(e.Ctx, count, 2*time.Second, time.Minute)
	list := &v1alpha1.ProxyList{}
	if err := e.C.List(e.Ctx, list, client.InNamespace(e.NS)); err != nil {
		b.Fatalf("listing the children: %v", err)
	}
	if len(list.Items) != int(n) {
		b.Fatalf("%d children, want %d", len(list.Items), n)
	}
	for i := range list.Items {
		px := &list.Items[i]
		base := px.DeepCopy()
		now := metav1.Now()
		px.Status.LastProbeTime = &now
		px.Status.ProbeLatencyMilliseconds = 2 + int64(i%7)
		if err := e.C.Status().Patch(e.Ctx, px, client.MergeFrom(base)); err != nil {
			b.Fatalf("rewriting the status of %s: %v", px.Name, err)
		}
	}
	return quiet(e.Ctx, count, 2*time.Second, time.Minute) - before
}
