package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/access"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// BenchmarkDiscovery1000 serves 1,000 Proxies from a real informer cache and loads the
// API over loopback with 16 concurrent keep-alive clients; in the same run the list's JSON
// payload is served as a static file by net/http's file server for comparison.
//
//	KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh) go test -run '^$' -bench Discovery1000 ./internal/discovery/
func BenchmarkDiscovery1000(b *testing.B) {
	ctx := testContext(b)
	ns := newNamespace(b, ctx)
	specs := make([]proxySpec, 1000)
	for i := range specs {
		specs[i] = proxySpec{name: fmt.Sprintf("px-%04d", i), ip: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1),
			zone: fmt.Sprintf("z%d", i%10), phase: v1alpha1.PhaseReady, healthy: i%20 != 0,
			labels: map[string]string{"tier": []string{"gold", "silver"}[i%2], "pool": "crawl"}}
	}
	createProxies(b, ctx, ns, specs)
	src := cacheSource(b, ctx, ns)
	testutil.WaitFor(b, waitLong, "1,000 proxies in the cache", func() (bool, error) {
		s, err := src.Snapshot(ctx)
		if err != nil {
			return false, err
		}
		return s.Len() == 1000, fmt.Errorf("%d proxies in the cache", s.Len())
	})
	api := serve(b, ctx, newTestServer(b, src, Options{}).Handler())

	res, err := http.Get(api + "/v1/proxies")
	if err != nil {
		b.Fatal(err)
	}
	payload, _ := io.ReadAll(res.Body)
	res.Body.Close()
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "proxies.json"), payload, 0o644); err != nil {
		b.Fatal(err)
	}
	static := serve(b, ctx, http.FileServer(http.Dir(dir)))
	var l listBody
	if err := json.Unmarshal(payload, &l); err != nil {
		b.Fatal(err)
	}
	b.Logf("list payload: %d bytes, %d healthy proxies", len(payload), l.Count)

	results := map[string]float64{}
	for _, tc := range []struct{ name, url string }{
		{"list-json", api + "/v1/proxies"},
		{"list-text", api + "/v1/proxies?format=text"},
		{"list-filtered", api + "/v1/proxies?zone=z3&labelSelector=tier%3Dgold,pool%3Dcrawl"},
		{"pick", api + "/v1/proxies/pick?key=session-"},
		{"static-file", static + "/proxies.json"},
	} {
		b.Run(tc.name, func(b *testing.B) { results[tc.name] = loadTest(b, tc.url, tc.name == "pick") })
	}
	if s := results["static-file"]; s > 0 {
		b.Logf("list-json at %.2fx the static file server's requests/s; pick at %.2fx", results["list-json"]/s, results["pick"]/s)
	}
}

func serve(b *testing.B, ctx context.Context, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

const loadWorkers = 16

// loadTest sends b.N GETs from loadWorkers goroutines and reports requests/s and the
// latency percentiles; it returns the requests/s. With perKey, each request carries a
// distinct key appended to url.
func loadTest(b *testing.B, url string, perKey bool) float64 {
	tr := &http.Transport{MaxIdleConnsPerHost: loadWorkers, MaxConnsPerHost: loadWorkers}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	var next atomic.Int64
	var failed atomic.Value
	lat := make([][]time.Duration, loadWorkers)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < loadWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				u := url
				if perKey {
					u = fmt.Sprint(url, i)
				}
				t0 := time.Now()
				res, err := c.Get(u)
				if err != nil {
					failed.Store(err.Error())
					return
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				lat[w] = append(lat[w], time.Since(t0))
				if res.StatusCode != http.StatusOK {
					failed.Store(fmt.Sprintf("%s: status %d", u, res.StatusCode))
					return
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	if f := failed.Load(); f != nil {
		b.Fatal(f)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	pct := func(p float64) float64 { return float64(all[int(float64(len(all)-1)*p)].Microseconds()) }
	rps := float64(b.N) / el.Seconds()
	b.ReportMetric(rps, "req/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	b.ReportMetric(0, "ns/op")
	return rps
}

// BenchmarkHandler is the server-side cost of one request over a snapshot of 1,000
// proxies, without the network: what a request costs the manager.
func BenchmarkHandler(b *testing.B) {
	es := make([]Entry, 1000)
	for i := range es {
		es[i] = Entry{Name: fmt.Sprintf("px-%04d", i), Namespace: "crawl", URL: fmt.Sprintf("http://10.1.%d.%d:3128", i/250, i%250+1),
			Provider: "kvm2-home", Region: "home", Zone: fmt.Sprintf("z%d", i%10), Healthy: i%20 != 0,
			Labels: map[string]string{"tier": []string{"gold", "silver"}[i%2], "pool": "crawl"}}
	}
	src := &staticSource{}
	src.snap.Store(NewSnapshot(es))
	h := newTestServer(b, src, Options{}).Handler()
	for _, tc := range []struct{ name, target string }{
		{"list-json", "/v1/proxies"},
		{"list-filtered", "/v1/proxies?zone=z3&labelSelector=tier%3Dgold,pool%3Dcrawl"},
		{"pick", "/v1/proxies/pick?key=session-42"},
		{"pick-filtered", "/v1/proxies/pick?key=session-42&labelSelector=tier%3Dgold"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			req, _ := http.NewRequest(http.MethodGet, tc.target, nil)
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				clear(w.h)
				h.ServeHTTP(w, req)
			}
		})
	}
}

type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}

// BenchmarkPickAuthorized compares, on the same 1,000 proxies in two namespaces, a pick
// by the static token with a pick by a Kubernetes caller allowed in both namespaces but
// not cluster-wide, whose authentication and namespace scope come from the caches (the
// reviews go to a counting fake). The target is kubernetes at 0.9x static or better.
//
//	go test -run '^$' -bench PickAuthorized ./internal/discovery/
func BenchmarkPickAuthorized(b *testing.B) {
	es := make([]Entry, 1000)
	for i := range es {
		es[i] = Entry{Name: fmt.Sprintf("px-%04d", i), Namespace: []string{"crawl", "crawl-b"}[i%2], URL: fmt.Sprintf("http://10.1.%d.%d:3128", i/250, i%250+1),
			Provider: "kvm2-home", Region: "home", Zone: fmt.Sprintf("z%d", i%10), Healthy: i%20 != 0}
	}
	src := &staticSource{}
	src.snap.Store(NewSnapshot(es))
	f := crawlReviewer()
	f.grants[crawlSA+" list proxies crawl-b"] = true
	path := filepath.Join(b.TempDir(), "token")
	if err := os.WriteFile(path, []byte(testToken), 0o600); err != nil {
		b.Fatal(err)
	}
	h := newTestServer(b, src, Options{TokenFile: path, Access: access.New(f, access.Options{})}).Handler()
	ns := map[string]float64{}
	for _, tc := range []struct{ name, token string }{{"static-token", testToken}, {"kubernetes", "tok-crawl"}} {
		b.Run(tc.name, func(b *testing.B) {
			req, _ := http.NewRequest(http.MethodGet, "/v1/proxies/pick?key=session-42", nil)
			req.Header.Set("Authorization", "Bearer "+tc.token)
			w := &discardWriter{h: http.Header{}}
			h.ServeHTTP(w, req) // fills the caches
			before := f.reviews.Load()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				clear(w.h)
				h.ServeHTTP(w, req)
			}
			b.StopTimer()
			if n := f.reviews.Load() - before; n > 0 {
				b.Errorf("%d reviews in %d cached picks", n, b.N)
			}
			ns[tc.name] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		})
	}
	if ns["kubernetes"] > 0 {
		b.Logf("kubernetes pick at %.2fx the static token's throughput", ns["static-token"]/ns["kubernetes"])
	}
}
