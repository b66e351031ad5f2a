package controller

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// BenchmarkThousandProxies creates 1,000 Proxies at once against a real API server with
// the fake provider, with the default 3 workers and with 10, and reports the time until
// every one is Running and the process's peak RSS so far (manager, cache and test client
// together; the API server and etcd run in processes of their own).
func BenchmarkThousandProxies(b *testing.B) {
	for _, workers := range []int{3, 10} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) { benchmarkProxies(b, 1000, workers) })
	}
}

func benchmarkProxies(b *testing.B, n, workers int) {
	for i := 0; i < b.N; i++ {
		e := newProxyEnvWorkers(b, workers)
		start := time.Now()
		createConcurrently(b, e, n, 16)
		created := time.Since(start)
		waitFor(b, 10*time.Minute, fmt.Sprintf("%d proxies Running", n), func() (bool, error) {
			list := &v1alpha1.ProxyList{}
			if err := e.c.List(e.ctx, list, client.InNamespace(e.ns)); err != nil {
				return false, err
			}
			running := 0
			for _, px := range list.Items {
				if px.Status.Phase == v1alpha1.PhaseRunning {
					running++
				}
			}
			return running == n, fmt.Errorf("%d of %d Running", running, n)
		})
		all := time.Since(start)
		b.ReportMetric(created.Seconds(), "s-to-create-1000")
		b.ReportMetric(all.Seconds(), "s-to-all-running")
		b.ReportMetric(float64(n)/all.Seconds(), "proxies/s")
	}
	if kib, err := procStatusKiB("VmHWM"); err == nil {
		b.ReportMetric(float64(kib)/1024, "peak-RSS-MiB")
	}
}

func createConcurrently(b *testing.B, e *proxyEnv, n, workers int) {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := e.c.Create(e.ctx, e.newProxy(fmt.Sprintf("px-%04d", i))); err != nil {
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
