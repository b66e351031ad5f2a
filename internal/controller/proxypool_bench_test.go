package controller

import (
	"fmt"
	"testing"
	"time"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// BenchmarkProxyPoolThousand creates one pool of 1,000 replicas against a real API server
// (of its own) with the fake provider, with 3 Proxy workers (the default) and with 10, and reports the
// time until the pool has made every child, until every child is Ready (the test's
// stand-in for the health engine marks each Running child Ready, every 250 ms), and the
// process's peak RSS (manager, cache and test client; the API server and etcd run in
// processes of their own), as BenchmarkThousandProxies does for bare Proxies.
func BenchmarkProxyPoolThousand(b *testing.B) {
	env := testenv.StartT(b)
	for _, workers := range []int{3, 10} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) { benchmarkPool(b, env, 1000, workers) })
	}
}

func benchmarkPool(b *testing.B, env *testenv.Env, n int32, workers int) {
	for i := 0; i < b.N; i++ {
		e := newPoolEnvWith(b, env, workers, 250*time.Millisecond)
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
		if c := poolCondition(e.getPool("bench"), v1alpha1.PoolConditionProgressing); c.Reason != v1alpha1.PoolReasonComplete {
			b.Errorf("Progressing %+v after every child is available", c)
		}
		b.ReportMetric(created.Seconds(), "s-to-create-1000")
		b.ReportMetric(all.Seconds(), "s-to-all-ready")
		b.ReportMetric(float64(n)/all.Seconds(), "children/s")
	}
	if kib, err := procStatusKiB("VmHWM"); err == nil {
		b.ReportMetric(float64(kib)/1024, "peak-RSS-MiB")
	}
}
