package health

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRound1000External is one full round over 1,000 External proxies, each a
// forward proxy on loopback in this process, probing the operator's /v1/whoami and
// writing 1,000 statuses to a real API server. It reports the round's wall time and this
// process's CPU time (getrusage), which includes the test proxies and the probe target;
// "probe-only" is the same probes without the status writes.
//
//	KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh) go test -run '^$' -bench Round1000 -benchtime=3x ./internal/health/
func BenchmarkRound1000External(b *testing.B) {
	const n = 1000
	e := newEngineEnv(b, nil)
	fps := make([]*healthtest.ForwardProxy, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range fps {
		fps[i] = healthtest.New(b, "")
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			e.proxyAt(fmt.Sprintf("ext-%04d", i), v1alpha1.ProxyModeExternal, fps[i].Host, fps[i].Port, v1alpha1.PhaseRunning)
		}()
	}
	wg.Wait()
	waitFor(b, waitLong, "1,000 proxies in the engine's cache", func() (bool, error) {
		var l v1alpha1.ProxyList
		err := e.mgr.GetClient().List(e.ctx, &l, client.InNamespace(e.ns))
		return len(l.Items) == n, err
	})

	b.Run("round", func(b *testing.B) {
		var wall, cpu time.Duration
		for i := 0; i < b.N; i++ {
			c0, t0 := cpuTime(), time.Now()
			st := e.round()
			wall += time.Since(t0)
			cpu += cpuTime() - c0
			b.Logf("round %d: %+v", i, st)
			if st.Probed != n || st.Succeeded != n || st.WriteErrors != 0 {
				b.Fatalf("round %d: %+v", i, st)
			}
		}
		b.ReportMetric(float64(wall.Milliseconds())/float64(b.N), "wall-ms/round")
		b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/round")
		b.ReportMetric(0, "ns/op")
	})
	b.Run("probe-only", func(b *testing.B) {
		var l v1alpha1.ProxyList
		if err := e.mgr.GetClient().List(e.ctx, &l, client.InNamespace(e.ns)); err != nil {
			b.Fatal(err)
		}
		var wall, cpu time.Duration
		for i := 0; i < b.N; i++ {
			c0, t0 := cpuTime(), time.Now()
			var wg sync.WaitGroup
			sem := make(chan struct{}, e.engine.opts.Concurrency)
			for j := range l.Items {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					if r := e.engine.prober.probe(e.ctx, proxyURL(&l.Items[j]), nil, e.engine.opts.Timeout); r.err != nil {
						b.Error(r.err)
					}
				}()
			}
			wg.Wait()
			wall += time.Since(t0)
			cpu += cpuTime() - c0
		}
		b.ReportMetric(float64(wall.Milliseconds())/float64(b.N), "wall-ms/round")
		b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/round")
		b.ReportMetric(0, "ns/op")
	})
}
