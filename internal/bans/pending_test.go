package bans

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// The reports of one pair folded into a pendingPair give the entry that applying them
// one by one gives, from every kind of entry the pair may already have, when they are
// taken within a second or so (as between two writes) and no cooldown, the pair's own or
// one they start, ends meanwhile except a short throttle's before an ok.
func TestPendingPairFoldsLikeReportsOneByOne(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(d time.Duration) metav1.Time { return metav1.NewTime(t0.Add(d)) }
	lastBanned := func(d time.Duration) *metav1.Time { tm := at(d); return &tm }
	starts := map[string][]v1alpha1.ProxyCooldown{
		"none":                  nil,
		"throttle cooling":      {{Site: "a.com", Until: at(10 * time.Minute), LastOutcome: v1alpha1.CooldownThrottled}},
		"throttle cooling soon": {{Site: "a.com", Until: at(2 * time.Second), LastOutcome: v1alpha1.CooldownThrottled}},
		"ban cooling":           {{Site: "a.com", Until: at(5 * time.Minute), Bans: 2, LastOutcome: v1alpha1.CooldownBanned, LastBanned: lastBanned(-5 * time.Minute)}},
		"ban ended":             {{Site: "a.com", Until: at(-10 * time.Minute), Bans: 3, LastOutcome: v1alpha1.CooldownBanned, LastBanned: lastBanned(-50 * time.Minute)}},
		"ban forgotten":         {{Site: "a.com", Until: at(-48 * time.Hour), Bans: 1, LastOutcome: v1alpha1.CooldownBanned, LastBanned: lastBanned(-49 * time.Hour)}},
	}
	long := []Report{
		{Site: "a.com", Outcome: Banned},
		{Site: "a.com", Outcome: OK},
		{Site: "a.com", Outcome: Throttled},
		{Site: "a.com", Outcome: Throttled, RetryAfter: 1500 * time.Millisecond},
		{Site: "a.com", Outcome: Throttled, RetryAfter: 30 * time.Second},
	}
	short := []Report{ // a throttle that ends within the span, then oks
		{Site: "a.com", Outcome: OK},
		{Site: "a.com", Outcome: Throttled, RetryAfter: 200 * time.Millisecond},
		{Site: "a.com", Outcome: Throttled, RetryAfter: 30 * time.Second},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		n := 1 + rng.IntN(7)
		reps := make([]timedReport, n)
		outcomes := long
		if i%2 == 1 {
			outcomes = short
		}
		var when time.Duration
		for j := range reps {
			when += time.Duration(rng.IntN(3)) * 100 * time.Millisecond // some at one instant
			reps[j] = timedReport{Report: outcomes[rng.IntN(len(outcomes))], at: t0.Add(when)}
		}
		var p pendingPair
		for _, r := range reps {
			p.add(r.Report, r.at)
		}
		if p.reports != n {
			t.Fatalf("the pair counts %d reports, want %d", p.reports, n)
		}
		for name, start := range starts {
			want, got := start, start
			for _, r := range reps {
				want, _ = CooldownsAfter(want, r.Report, r.at, DefaultPolicy)
			}
			for _, r := range p.fold("a.com") {
				got, _ = CooldownsAfter(got, r.Report, r.at, DefaultPolicy)
			}
			if !sameCooldowns(got, want) {
				t.Fatalf("from %s, reports %s: folded %+v, one by one %+v", name, describe(reps), got, want)
			}
		}
	}
}

func sameCooldowns(a, b []v1alpha1.ProxyCooldown) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.Site != y.Site || !x.Until.Equal(&y.Until) || x.Bans != y.Bans || x.LastOutcome != y.LastOutcome ||
			(x.LastBanned == nil) != (y.LastBanned == nil) || (x.LastBanned != nil && !x.LastBanned.Equal(y.LastBanned)) {
			return false
		}
	}
	return true
}

func describe(reps []timedReport) string {
	s := ""
	for _, r := range reps {
		s += string(r.Outcome)
		if r.RetryAfter > 0 {
			s += "(" + r.RetryAfter.String() + ")"
		}
		s += "@" + r.at.Format("05.000") + " "
	}
	return s
}

// However many reports come between two writes, the recorder holds one pair per (proxy,
// site) and at most its bounds of pairs; the reports past them are dropped and counted.
func TestRecorderPendingIsBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	r := &Recorder{Clock: clk, MaxPendingPairsPerProxy: 100, MaxPendingPairs: 250}
	proxy := func(i int) types.NamespacedName {
		return types.NamespacedName{Namespace: "crawl", Name: "p" + strconv.Itoa(i)}
	}
	for i := 0; i < 100000; i++ {
		r.Add(proxy(0), Report{Site: "a.com", Outcome: []Outcome{Banned, Throttled, OK}[i%3]})
	}
	if n := r.Pending(); n != 1 {
		t.Fatalf("100,000 reports of one pair hold %d pairs, want 1", n)
	}
	proxyFull := testutil.ToFloat64(droppedReports.WithLabelValues(DropProxyFull))
	full := testutil.ToFloat64(droppedReports.WithLabelValues(DropFull))
	for px := 0; px < 4; px++ {
		for s := 0; s < 150; s++ {
			r.Add(proxy(px), Report{Site: "site" + strconv.Itoa(s) + ".com", Outcome: Banned})
		}
	}
	// p0: a.com and 99 sites, then 51 dropped; p1: 100, 50 dropped; p2: 50, then 100
	// dropped with the recorder full; p3: all 150 dropped.
	if n := r.Pending(); n != 250 {
		t.Errorf("%d pairs pending, want the bound of 250", n)
	}
	if d := testutil.ToFloat64(droppedReports.WithLabelValues(DropProxyFull)) - proxyFull; d != 101 {
		t.Errorf("%v reports dropped with their proxy full, want 101", d)
	}
	if d := testutil.ToFloat64(droppedReports.WithLabelValues(DropFull)) - full; d != 250 {
		t.Errorf("%v reports dropped with the recorder full, want 250", d)
	}
	// A pair already waiting still takes its reports.
	r.Add(proxy(1), Report{Site: "site0.com", Outcome: OK})
	if n := r.pending[proxy(1)]["site0.com"].reports; n != 2 {
		t.Errorf("a waiting pair folded %d reports, want 2", n)
	}
}

// The memory a recorder holds stays flat however many reports of new sites come while
// nothing is written: what is past the default bounds is dropped.
func TestRecorderMemoryStaysFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("adds a million reports")
	}
	r := &Recorder{Clock: clocktesting.NewFakeClock(time.Now())}
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	add := func(from, to int) {
		for i := from; i < to; i++ {
			r.Add(types.NamespacedName{Namespace: "crawl", Name: "p" + strconv.Itoa(i%500)},
				Report{Site: "a-site-of-some-length-" + strconv.Itoa(i) + ".example.com", Outcome: Banned})
		}
	}
	before := heap()
	add(0, DefaultMaxPendingPairs)
	full := heap()
	add(DefaultMaxPendingPairs, 1_000_000)
	after := heap()
	t.Logf("heap: %d KiB empty, %d KiB at %d pairs, %d KiB after 950,000 more reports", before>>10, full>>10, DefaultMaxPendingPairs, after>>10)
	if r.Pending() != DefaultMaxPendingPairs {
		t.Errorf("%d pairs pending, want %d", r.Pending(), DefaultMaxPendingPairs)
	}
	if after > full+full/10 {
		t.Errorf("heap grew from %d to %d KiB past the bound", full>>10, after>>10)
	}
}
