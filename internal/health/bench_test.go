package health

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

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

// externalProxies starts n forward proxies on loopback and creates an External Proxy
// ext-NNNN, Running, for each, a few at a time.
func (e *engineEnv) externalProxies(n int) []*healthtest.ForwardProxy {
	fps := make([]*healthtest.ForwardProxy, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range fps {
		fps[i] = healthtest.New(e.t, "")
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			e.proxyAt(fmt.Sprintf("ext-%04d", i), v1alpha1.ProxyModeExternal, fps[i].Host, fps[i].Port, v1alpha1.PhaseRunning)
		}()
	}
	wg.Wait()
	return fps
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
	e.externalProxies(n)
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

// BenchmarkSteadyState1000External runs an engine over 1,000 healthy External proxies
// (forward proxies on loopback) against a real API server and counts its status writes
// with a client wrapper: one settling round (every proxy becomes Ready), then b.N rounds
// in which nothing a user sees changes. It reports the writes per steady round; then one
// proxy's forward proxy fails and the next round must show it unhealthy in the status
// (failure threshold 1) with a single write.
//
//	KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh) go test -run '^$' -bench SteadyState1000 -benchtime=3x ./internal/health/
func BenchmarkSteadyState1000External(b *testing.B) {
	const n = 1000
	e := newEngineEnv(b, nil)
	fps := e.externalProxies(n)
	var writes atomic.Int64
	counting := interceptor.NewClient(noWatch{e.mgr.GetClient()}, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			writes.Add(1)
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
	opts := e.engine.opts
	opts.FailureThreshold = 1
	eng, err := New(counting, e.mgr.GetAPIReader(), nil, opts, logr.Discard())
	if err != nil {
		b.Fatal(err)
	}
	round := func(what string) RoundStats {
		st, err := eng.Round(e.ctx)
		if err != nil || st.Probed != n || st.WriteErrors != 0 {
			b.Fatalf("%s: %+v, %v", what, st, err)
		}
		return st
	}
	waitReady := func(what string, want int) {
		waitFor(b, waitLong, what, func() (bool, error) {
			var l v1alpha1.ProxyList
			err := e.mgr.GetClient().List(e.ctx, &l, client.InNamespace(e.ns))
			ready := 0
			for _, px := range l.Items {
				if shown(&px) == v1alpha1.PhaseReady {
					ready++
				}
			}
			return len(l.Items) == n && ready == want, err
		})
	}
	waitReady("1,000 proxies in the engine's cache", 0)
	w0 := writes.Load()
	round("settling round")
	b.Logf("settling round: %d writes", writes.Load()-w0)
	waitReady("1,000 Ready proxies in the engine's cache", n)

	b.Run("steady", func(b *testing.B) {
		var total int64
		var wall time.Duration
		for i := 0; i < b.N; i++ {
			w, t0 := writes.Load(), time.Now()
			round(fmt.Sprintf("steady round %d", i))
			wall += time.Since(t0)
			d := writes.Load() - w
			total += d
			b.Logf("steady round %d: %d writes for %d probes", i, d, n)
		}
		b.ReportMetric(float64(wall.Milliseconds())/float64(b.N), "wall-ms/round")
		b.ReportMetric(float64(total)/float64(b.N), "writes/round")
		b.ReportMetric(float64(total)*100/float64(b.N*n), "writes-%-of-probes")
		b.ReportMetric(0, "ns/op")
	})

	fps[7].SetMode(healthtest.Fail)
	w := writes.Load()
	round("round after a change")
	if px := e.get("ext-0007"); px.Status.Healthy || shown(px) != v1alpha1.PhaseRunning {
		b.Errorf("one round after its proxy failed, ext-0007 is %s healthy=%v", shown(px), px.Status.Healthy)
	}
	b.Logf("round after one proxy failed: %d writes", writes.Load()-w)
}

// noWatch lets interceptor wrap a manager's client, which has no Watch.
type noWatch struct{ client.Client }

func (noWatch) Watch(context.Context, client.ObjectList, ...client.ListOption) (watch.Interface, error) {
	return nil, errors.New("watch is not supported here")
}
