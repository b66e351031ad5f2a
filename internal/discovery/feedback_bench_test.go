package discovery

import (
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
)

// bench1000 is 1,000 healthy proxies, every tenth cooling for example.com.
func bench1000() []Entry {
	es := make([]Entry, 1000)
	for i := range es {
		es[i] = Entry{Name: fmt.Sprintf("px-%04d", i), Namespace: "crawl", URL: fmt.Sprintf("http://10.1.%d.%d:3128", i/250, i%250+1),
			Provider: "kvm2-home", Healthy: true}
		if i%10 == 0 {
			es[i] = cool(es[i], "example.com", time.Now().Add(time.Hour))
		}
	}
	return es
}

// BenchmarkDomainPick compares pick?domain= with a plain pick over the same 1,000
// proxies in one run; the ratio is reported as domain/plain throughput.
func BenchmarkDomainPick(b *testing.B) {
	src := newStaticSource(bench1000()...)
	h := newTestServer(b, src, Options{}).Handler()
	nsPerOp := map[string]float64{}
	for _, tc := range []struct{ name, target string }{
		{"plain", "/v1/proxies/pick?key=session-42"},
		{"domain", "/v1/proxies/pick?key=session-42&domain=shop.example.com"},
		{"plain-again", "/v1/proxies/pick?key=session-42"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			req, _ := http.NewRequest(http.MethodGet, tc.target, nil)
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				clear(w.h)
				h.ServeHTTP(w, req)
			}
			nsPerOp[tc.name] = float64(time.Since(start).Nanoseconds()) / float64(b.N)
		})
	}
	if nsPerOp["domain"] > 0 {
		plain := min(nsPerOp["plain"], nsPerOp["plain-again"])
		b.Logf("pick?domain= throughput is %.2f× plain pick's (%.0f vs %.0f ns/op)", plain/nsPerOp["domain"], nsPerOp["domain"], plain)
	}
	// What one site's candidate list costs: allocated while working it out, and kept.
	snap := NewSnapshot(bench1000())
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	sc := snap.siteCooling("example.com", time.Now())
	runtime.ReadMemStats(&after)
	kept := uintptr(cap(sc.cands))*unsafe.Sizeof(sc.cands[0]) + uintptr(cap(sc.items))*unsafe.Sizeof(sc.items[0]) + unsafe.Sizeof(*sc)
	b.Logf("one site (%d candidates, %d cooling): %d bytes allocated working it out, %d kept", len(sc.cands), len(sc.items), after.TotalAlloc-before.TotalAlloc, kept)
}

// BenchmarkDomainPickInterleaved measures the same ratio on a busy machine: batches of
// 200 plain picks and 200 pick?domain= alternate on one locked OS thread, each batch
// timed by the thread's CPU time (time spent waiting for a core does not count), and the
// ratio is that of the two medians. b.N is the number of batch pairs.
func BenchmarkDomainPickInterleaved(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h := newTestServer(b, newStaticSource(bench1000()...), Options{}).Handler()
	plainReq, _ := http.NewRequest(http.MethodGet, "/v1/proxies/pick?key=session-42", nil)
	domainReq, _ := http.NewRequest(http.MethodGet, "/v1/proxies/pick?key=session-42&domain=shop.example.com", nil)
	w := &discardWriter{h: http.Header{}}
	cpu := func() time.Duration {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ts.Nano())
	}
	const batch = 200
	run := func(req *http.Request) time.Duration {
		t0 := cpu()
		for range batch {
			clear(w.h)
			h.ServeHTTP(w, req)
		}
		return cpu() - t0
	}
	var plain, domain []time.Duration
	for i := 0; i < b.N; i++ {
		if i%2 == 0 { // alternate which goes first
			plain, domain = append(plain, run(plainReq)), append(domain, run(domainReq))
		} else {
			domain, plain = append(domain, run(domainReq)), append(plain, run(plainReq))
		}
	}
	slices.Sort(plain)
	slices.Sort(domain)
	p, d := plain[len(plain)/2], domain[len(domain)/2]
	b.ReportMetric(float64(p)/batch, "plain-cpu-ns/op")
	b.ReportMetric(float64(d)/batch, "domain-cpu-ns/op")
	b.ReportMetric(float64(p)/float64(d), "domain/plain-throughput")
}

// BenchmarkFeedback is the cost of taking 1,000 reports in one POST /v1/feedback, into
// the real recorder's queue (its status writes are coalesced to one per Proxy per second
// and measured in the recorder's tests).
func BenchmarkFeedback(b *testing.B) {
	src := newStaticSource(bench1000()...)
	rec := &bans.Recorder{}
	h := newTestServer(b, src, Options{Feedback: rec}).Handler()
	var sb strings.Builder
	sb.WriteString(`{"reports":[`)
	for i := range MaxFeedbackReports {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"proxy":"http://10.1.%d.%d:3128","domain":"s%d.example%d.com","outcome":"banned"}`, i/250, i%250+1, i, i%7)
	}
	sb.WriteString(`]}`)
	body := sb.String()
	b.ReportAllocs()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		res, got := post(b, h, "/v1/feedback", body)
		if res.StatusCode != 200 || !strings.Contains(got, `"accepted":1000`) {
			b.Fatalf("%d %s", res.StatusCode, got)
		}
	}
	b.ReportMetric(float64(b.N*MaxFeedbackReports)/time.Since(start).Seconds(), "reports/s")
}
