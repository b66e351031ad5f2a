package controller

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// The two thousand-Proxy benchmarks measure the same thing: from the first create until
// 1,000 Proxies are Ready, in the pool test environment (its own API server, the Proxy
// reconciler on the fake provider, the pool reconciler, and the stand-in for the health
// engine marking each Running Proxy Ready every 250 ms), one made by hand 1,000 times and
// one made by a pool of 1,000. Each reports its peak RSS since its own start (the high
// water mark is reset first), and the API requests the manager's client and the pool's
// live reader sent per Proxy made (for bare Proxies, the 1,000 creates are counted too).
// BenchmarkProxyPoolThousand, run after BenchmarkThousandProxies in one process, reports
// pool ÷ bare for the three.

// benchBare holds BenchmarkThousandProxies' figures by worker count.
var benchBare sync.Map // int -> benchFigures

type benchFigures struct {
	seconds, rssMiB, requestsPerProxy float64
}

// BenchmarkThousandProxies creates 1,000 Proxies at once, with the default 3 Proxy workers and
// with 10, and reports the time until every one is Ready.
func BenchmarkThousandProxies(b *testing.B) {
	env := testenv.StartT(b)
	for _, workers := range []int{3, 10} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) { benchmarkProxies(b, env, 1000, workers) })
	}
}

func benchmarkProxies(b *testing.B, env *testenv.Env, n, workers int) {
	for i := 0; i < b.N; i++ {
		resetPeakRSS()
		var requests atomic.Int64
		e := newPoolEnvCounting(b, env, workers, 250*time.Millisecond, &requests)
		tmpl := e.newPool("bench", int32(n)).Spec.Template
		start := time.Now()
		createConcurrently(b, e, n, 16, func(i int) *v1alpha1.Proxy {
			return &v1alpha1.Proxy{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("px-%04d", i), Namespace: e.ns, Labels: tmpl.Metadata.Labels},
				Spec:       *tmpl.Spec.DeepCopy(),
			}
		})
		created := time.Since(start)
		waitFor(b, 10*time.Minute, fmt.Sprintf("%d proxies Ready", n), func() (bool, error) {
			list := &v1alpha1.ProxyList{}
			if err := e.c.List(e.ctx, list, client.InNamespace(e.ns)); err != nil {
				return false, err
			}
			ready := 0
			for _, px := range list.Items {
				if px.Status.Phase == v1alpha1.PhaseReady && px.Status.Healthy {
					ready++
				}
			}
			return ready == n, fmt.Errorf("%d of %d Ready", ready, n)
		})
		all := time.Since(start)
		f := benchFigures{seconds: all.Seconds(), requestsPerProxy: float64(requests.Load()+int64(n)) / float64(n)}
		b.ReportMetric(created.Seconds(), "s-to-create-1000")
		b.ReportMetric(all.Seconds(), "s-to-all-ready")
		b.ReportMetric(float64(n)/all.Seconds(), "proxies/s")
		b.ReportMetric(f.requestsPerProxy, "requests/proxy")
		if kib, err := procStatusKiB("VmHWM"); err == nil {
			f.rssMiB = float64(kib) / 1024
			b.ReportMetric(f.rssMiB, "peak-RSS-MiB")
		}
		benchBare.Store(workers, f)
	}
}

func createConcurrently(b *testing.B, e *poolEnv, n, workers int, mk func(int) *v1alpha1.Proxy) {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := e.c.Create(e.ctx, mk(i)); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("creating proxies: %v", err)
	}
}

// resetPeakRSS collects garbage, returns what it can to the kernel and resets the
// process's peak RSS (VmHWM) to its current RSS, so that the next benchmark's peak is its
// own and not a predecessor's.
func resetPeakRSS() {
	runtime.GC()
	debug.FreeOSMemory()
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
}

// procStatusKiB reads a "<field>: <n> kB" line of /proc/self/status.
func procStatusKiB(field string) (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/self/status has no %s line", field)
}

// countingConfig is cfg whose transport adds one to n for every request sent.
func countingConfig(cfg *rest.Config, n *atomic.Int64) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			n.Add(1)
			return rt.RoundTrip(req)
		})
	})
	return c
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// countingNewClient is the manager's client constructor over countingConfig: every
// request the client sends (writes and uncached reads; cached reads send none) adds to n.
func countingNewClient(n *atomic.Int64) func(*rest.Config, client.Options) (client.Client, error) {
	return func(cfg *rest.Config, o client.Options) (client.Client, error) {
		o.HTTPClient = nil // built anew from the counting config
		return client.New(countingConfig(cfg, n), o)
	}
}

// reconcileCount is how many reconciles the named controller has run in this process
// (controller-runtime's controller_runtime_reconcile_total, every result).
func reconcileCount(controller string) (float64, error) {
	families, err := metrics.Registry.Gather()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum, nil
}

// quiet waits until count has not changed for settle (at most limit in all) and
// returns its last value.
func quiet(ctx context.Context, count func() float64, settle, limit time.Duration) float64 {
	last, since := count(), time.Now()
	for deadline := time.Now().Add(limit); time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(100 * time.Millisecond)
		if c := count(); c != last {
			last, since = c, time.Now()
		} else if time.Since(since) >= settle {
			break
		}
	}
	return last
}
