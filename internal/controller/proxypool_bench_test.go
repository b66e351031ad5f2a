package controller

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// BenchmarkProxyPoolThousand creates one pool of 1,000 replicas, with 3 Proxy workers (the
// default) and with 10, in the environment BenchmarkThousandProxies uses (see there), and
// reports the time until the pool has made every child and until every child is Ready,
// the peak RSS, the API requests per child, and, when BenchmarkThousandProxies ran first
// in the same process, pool ÷ bare for the three. It then rewrites every child's status
// once the way the health engine's heartbeat does (a new probe time and latency) and
// reports how many pool reconciles the 1,000 writes caused.
func BenchmarkProxyPoolThousand(b *testing.B) {
	env := testenv.StartT(b)
	for _, workers := range []int{3, 10} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) { benchmarkPool(b, env, 1000, workers) })
	}
}

func benchmarkPool(b *testing.B, env *testenv.Env, n int32, workers int) {
	for i := 0; i < b.N; i++ {
		resetPeakRSS()
		var requests atomic.Int64
		e := newPoolEnvCounting(b, env, workers, 250*time.Millisecond, &requests)
		start := time.Now()
		e.create(e.newPool("bench", n))
		var created time.Duration
		waitFor(b, 10*time.Minute, fmt.Sprintf("%d children Ready", n), func() (bool, error) {
			pool := e.getPool("bench")
			if created == 0 && pool.Status.Replicas == n {
				created = time.Since(start)
			}
			st := pool.Status
			return st.ReadyReplicas == n && st.AvailableReplicas == n,
				fmt.Errorf("%d children, %d Ready, %d available", st.Replicas, st.ReadyReplicas, st.AvailableReplicas)
		})
		all := time.Since(start)
		f := benchFigures{seconds: all.Seconds(), requestsPerProxy: float64(requests.Load()) / float64(n)}
		if kib, err := procStatusKiB("VmHWM"); err == nil {
			f.rssMiB = float64(kib) / 1024
		}
		if c := poolCondition(e.getPool("bench"), v1alpha1.PoolConditionProgressing); c.Reason != v1alpha1.PoolReasonComplete {
			b.Errorf("Progressing %+v after every child is available", c)
		}
		b.ReportMetric(created.Seconds(), "s-to-create-1000")
		b.ReportMetric(all.Seconds(), "s-to-all-ready")
		b.ReportMetric(float64(n)/all.Seconds(), "children/s")
		b.ReportMetric(f.requestsPerProxy, "requests/proxy")
		b.ReportMetric(f.rssMiB, "peak-RSS-MiB")
		if v, ok := benchBare.Load(workers); ok {
			bare := v.(benchFigures)
			b.ReportMetric(f.seconds/bare.seconds, "time-pool/bare")
			b.ReportMetric(f.rssMiB/bare.rssMiB, "RSS-pool/bare")
			b.ReportMetric(f.requestsPerProxy/bare.requestsPerProxy, "requests-pool/bare")
		}
		b.ReportMetric(heartbeatReconciles(b, e, n), "reconciles/1000-heartbeats")
	}
}

// heartbeatReconciles rewrites every child's probe time and latency once, as the health
// engine does on each successful probe, and counts the pool reconciles that follow.
func heartbeatReconciles(b *testing.B, e *poolEnv, n int32) float64 {
	count := func() float64 {
		c, err := reconcileCount("proxypool")
		if err != nil {
			b.Fatalf("reading the reconcile count: %v", err)
		}
		return c
	}
	before := quiet(e.ctx, count, 2*time.Second, time.Minute)
	list := &v1alpha1.ProxyList{}
	if err := e.c.List(e.ctx, list, client.InNamespace(e.ns)); err != nil {
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
		if err := e.c.Status().Patch(e.ctx, px, client.MergeFrom(base)); err != nil {
			b.Fatalf("rewriting the status of %s: %v", px.Name, err)
		}
	}
	return quiet(e.ctx, count, 2*time.Second, time.Minute) - before
}
