package pool

import (
	"bufio"
	"bytes"
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
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
// BenchmarkPoolVersusBare (bench_test.go) runs the two in alternating rounds
// and reports pool ÷ bare.

// roundFigures are what one round measured, from the first create until every Proxy is
// Ready: wall time, the CPU time (user and system) of this process and of the API
// server and etcd it runs, peak RSS of this process, API requests per Proxy, and the
// 1-minute load average at the end.
type roundFigures struct {
	created, wall, cpu       time.Duration
	rssMiB, requestsPerProxy float64
	load1                    float64
	// poolPasses are the pool reconciles of the round (none for bare Proxies);
	// heartbeatPasses the pool reconciles that rewriting every child's status once
	// caused afterwards (pool rounds of BenchmarkPoolVersusBare only).
	poolPasses, heartbeatPasses float64
}

// measure runs one round: makeAll creates n Proxies (directly or through a pool) and
// returns when the creates are sent; allReady reports whether all n are Ready.
func measure(b *testing.B, n int, requests *atomic.Int64, countCreates bool,
	makeAll func(), allReady func() (bool, error)) roundFigures {
	b.Helper()
	passes0 := poolReconciles(b)
	cpu0 := cpuTime(b)
	start := time.Now()
	makeAll()
	f := roundFigures{created: time.Since(start)}
	waitFor(b, 30*time.Minute, fmt.Sprintf("%d proxies Ready", n), allReady)
	f.wall, f.cpu = time.Since(start), cpuTime(b)-cpu0
	f.poolPasses = poolReconciles(b) - passes0
	req := requests.Load()
	if countCreates {
		req += int64(n)
	}
	f.requestsPerProxy = float64(req) / float64(n)
	if kib, err := procStatusKiB("VmHWM"); err == nil {
		f.rssMiB = float64(kib) / 1024
	}
	f.load1 = loadAverage()
	return f
}

func (f roundFigures) report(b *testing.B, n int) {
	b.ReportMetric(f.created.Seconds(), "s-to-create-all")
	b.ReportMetric(f.wall.Seconds(), "s-to-all-ready")
	b.ReportMetric(f.cpu.Seconds(), "cpu-s-to-all-ready")
	b.ReportMetric(float64(n)/f.wall.Seconds(), "proxies/s")
	b.ReportMetric(f.requestsPerProxy, "requests/proxy")
	b.ReportMetric(f.rssMiB, "peak-RSS-MiB")
	b.ReportMetric(f.load1, "loadavg-1m")
	b.ReportMetric(f.poolPasses, "pool-reconciles")
}

// poolReconciles is how many pool reconciles this process has run.
func poolReconciles(b *testing.B) float64 {
	c, err := reconcileCount("proxypool")
	if err != nil {
		b.Fatalf("reading the reconcile count: %v", err)
	}
	return c
}

// BenchmarkThousandProxies creates 1,000 Proxies at once, with the default 3 Proxy workers and
// with 10, and reports the time until every one is Ready.
func BenchmarkThousandProxies(b *testing.B) {
	env := testenv.StartT(b)
	for _, workers := range []int{3, 10} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				bareRound(b, env, 1000, workers).report(b, 1000)
			}
		})
	}
}

// bareRound creates n Proxies at once, 16 creates at a time, in an environment of its
// own (stopped when b ends), and measures until every one is Ready.
func bareRound(b *testing.B, env *testenv.Env, n, workers int) roundFigures {
	resetPeakRSS()
	var requests atomic.Int64
	e := newBenchEnv(b, env, workers, &requests)
	tmpl := e.NewPool("bench", int32(n)).Spec.Template
	return measure(b, n, &requests, true, func() {
		createConcurrently(b, e, n, 16, func(i int) *v1alpha1.Proxy {
			return &v1alpha1.Proxy{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("px-%04d", i), Namespace: e.NS, Labels: tmpl.Metadata.Labels},
				Spec:       *tmpl.Spec.DeepCopy(),
			}
		})
	}, func() (bool, error) {
		list := &v1alpha1.ProxyList{}
		if err := e.C.List(e.Ctx, list, client.InNamespace(e.NS)); err != nil {
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
}

// newBenchEnv is newPoolEnv counting requests for a benchmark round; once the round's manager has
// stopped, every Proxy and pool of the round is removed from the API server (finalizers
// dropped first), so that a later round meets the same API server state.
func newBenchEnv(b *testing.B, env *testenv.Env, workers int, requests *atomic.Int64) *poolEnv {
	var ns string
	b.Cleanup(func() { // registered first: runs after the manager's stop
		if ns != "" {
			clearNamespace(b, env, ns)
		}
	})
	e := newPoolEnv(b, env, withProxyWorkers(workers, 250*time.Millisecond), countingRequests(requests))
	ns = e.NS
	return e
}

func clearNamespace(b *testing.B, env *testenv.Env, ns string) {
	ctx := context.Background()
	list := &v1alpha1.ProxyList{}
	if err := env.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
		b.Errorf("listing the proxies of %s: %v", ns, err)
		return
	}
	unfinalize := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
	var wg sync.WaitGroup
	next := make(chan *v1alpha1.Proxy)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for px := range next {
				if err := env.Client.Patch(ctx, px, unfinalize); err != nil && !apierrors.IsNotFound(err) {
					b.Errorf("dropping the finalizers of %s/%s: %v", ns, px.Name, err)
				}
			}
		}()
	}
	for i := range list.Items {
		next <- &list.Items[i]
	}
	close(next)
	wg.Wait()
	for _, obj := range []client.Object{&v1alpha1.ProxyPool{}, &v1alpha1.Proxy{}} {
		if err := env.Client.DeleteAllOf(ctx, obj, client.InNamespace(ns)); err != nil {
			b.Errorf("deleting the %T objects of %s: %v", obj, ns, err)
		}
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
				if err := e.C.Create(e.Ctx, mk(i)); err != nil {
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

// cpuTime is the user and system CPU time used so far by this process and by its
// running children, envtest's kube-apiserver and etcd: getrusage for this process,
// /proc/<pid>/stat for the children (in USER_HZ ticks, 1/100 s on Linux). CPU time
// moves far less with the machine's other load than wall time does.
func cpuTime(b testing.TB) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	d := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	procs, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatalf("listing /proc: %v", err)
	}
	self := strconv.Itoa(os.Getpid())
	for _, de := range procs {
		if c := de.Name()[0]; c < '0' || c > '9' {
			continue
		}
		data, err := os.ReadFile("/proc/" + de.Name() + "/stat")
		if err != nil {
			continue // the process ended meanwhile
		}
		// pid (comm) state ppid ... utime stime: fields 4, 14 and 15, counted from 1.
		f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
		if len(f) < 13 || f[1] != self {
			continue
		}
		user, err1 := strconv.ParseInt(f[11], 10, 64)
		sys, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			b.Fatalf("/proc/%s/stat: utime %q, stime %q", de.Name(), f[11], f[12])
		}
		d += time.Duration(user+sys) * 10 * time.Millisecond
	}
	return d
}

// loadAverage is the machine's 1-minute load average (0 when /proc/loadavg is unreadable).
func loadAverage() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
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
