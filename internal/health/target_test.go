package health

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
)

// deadTarget serves the discovery API's /v1/whoami on loopback, or, while down, takes
// every connection and closes it unanswered, as a probe target that has died.
type deadTarget struct {
	down atomic.Bool
	url  string
}

func newDeadTarget(t testing.TB) *deadTarget {
	s, err := discovery.New(nil, discovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h, d := s.Handler(), &deadTarget{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !d.down.Load() {
			h.ServeHTTP(w, r)
			return
		}
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			c.Close()
		}
	}))
	t.Cleanup(srv.Close)
	d.url = srv.URL
	return d
}

// countingRecorder counts the Events the engine records by reason and the regarded
// object's name (the API server folds repeats of an Event into a series it writes only
// every half hour, so its list cannot tell one from ten), and passes them on.
type countingRecorder struct {
	inner events.EventRecorder
	mu    sync.Mutex
	n     map[string]int
}

func (r *countingRecorder) Eventf(regarding, related runtime.Object, typ, reason, action, note string, args ...any) {
	r.mu.Lock()
	if o, ok := regarding.(client.Object); ok {
		r.n[reason+"/"+o.GetName()]++
	}
	r.mu.Unlock()
	r.inner.Eventf(regarding, related, typ, reason, action, note, args...)
}

func (r *countingRecorder) count(reason, name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason+"/"+name]
}

// providerHealth creates a ProviderHealth for the test, deleted when it ends.
func (e *engineEnv) providerHealth() *v1alpha1.ProviderHealth {
	e.t.Helper()
	ph := &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: "target-" + e.ns}}
	if err := e.c.Create(e.ctx, ph); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = e.c.Delete(e.ctx, ph) })
	return ph
}

// waitClusterEvent waits for an Event with reason on the cluster-scoped object name (such
// Events go to the default namespace) and returns its note.
func (e *engineEnv) waitClusterEvent(name, reason string) string {
	e.t.Helper()
	note := ""
	waitFor(e.t, waitLong, fmt.Sprintf("a %s event on %s", reason, name), func() (bool, error) {
		var list eventsv1.EventList
		if err := e.c.List(e.ctx, &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return false, err
		}
		for _, ev := range list.Items {
			if ev.Regarding.Name == name && ev.Reason == reason {
				note = ev.Note
				return true, nil
			}
		}
		return false, nil
	})
	return note
}

// A probe target that dies for ten rounds leaves every proxy as it was: healthy ones
// healthy, failure counts where they were, no status write. The engine says the target
// is down (ProbeTargetDown, the gauge, one Warning Event on the ProviderHealth) and, when
// it answers again, counts failures again: a proxy that is really broken is taken out
// as before.
func TestProbeTargetOutageCountsNothingAgainstTheProxies(t *testing.T) {
	tgt := newDeadTarget(t)
	e := newEngineEnv(t, func(o *Options) { o.ProbeURL = tgt.url + "/v1/whoami"; o.TargetCheckTimeout = 5 * time.Second })
	rec := &countingRecorder{inner: e.engine.recorder, n: map[string]int{}}
	e.engine.recorder = rec
	ph := e.providerHealth()
	names := []string{"a", "b", "broken"}
	fps := map[string]*healthtest.ForwardProxy{}
	for _, n := range names {
		fps[n] = healthtest.New(t, "127.0.0.4")
		e.proxyAt(n, v1alpha1.ProxyModeManaged, fps[n].Host, fps[n].Port, v1alpha1.PhaseRunning)
	}
	if st := e.round(); st.Succeeded != 3 || st.TargetDown {
		t.Fatalf("first round: %+v", st)
	}
	if down, _ := e.engine.ProbeTargetDown(); down || !e.engine.ProbeTargetUpSince().IsZero() {
		t.Fatalf("before any outage: ProbeTargetDown() %v, ProbeTargetUpSince() %v", down, e.engine.ProbeTargetUpSince())
	}
	// "broken" loses one probe while the target answers: that one counts.
	fps["broken"].SetMode(healthtest.Fail)
	if st := e.round(); st.Failed != 1 || st.TargetDown || st.Uncounted != 0 {
		t.Fatalf("round with one broken proxy and the target up: %+v", st)
	}
	want := map[string]int32{"a": 0, "b": 0, "broken": 1}
	counts := func(when string) {
		t.Helper()
		for _, n := range names {
			px := e.get(n)
			if got := observe(px); got != (health{v1alpha1.PhaseReady, true, metav1.ConditionTrue, 0}) {
				t.Fatalf("%s: proxy %s %+v, want it Ready and healthy", when, n, got)
			}
			if f := e.engine.failuresOf(px); f != want[n] {
				t.Fatalf("%s: proxy %s has %d failures counted, want %d", when, n, f, want[n])
			}
		}
	}
	counts("before the outage")

	roundsBefore := testutil.ToFloat64(uncountedRounds)
	tgt.down.Store(true)
	var since time.Time
	for i := 1; i <= 10; i++ {
		st := e.round()
		if st.Failed != 3 || !st.TargetDown || st.Uncounted != 3 || st.Writes != 0 {
			t.Fatalf("outage round %d: %+v, want 3 failures, none counted, no write", i, st)
		}
		down, at := e.engine.ProbeTargetDown()
		if !down || at.IsZero() || (i > 1 && !at.Equal(since)) {
			t.Fatalf("outage round %d: ProbeTargetDown() = %v, %v (first %v)", i, down, at, since)
		}
		since = at
		if g := testutil.ToFloat64(targetUp); g != 0 {
			t.Fatalf("outage round %d: proxy_operator_probe_target_up %v, want 0", i, g)
		}
		counts(fmt.Sprintf("outage round %d", i))
	}
	if d := testutil.ToFloat64(uncountedRounds) - roundsBefore; d != 10 {
		t.Errorf("proxy_operator_probe_target_down_rounds_total rose by %v, want 10", d)
	}
	if n := rec.count(ReasonProbeTargetDown, ph.Name); n != 1 {
		t.Errorf("%d %s events on the ProviderHealth over ten rounds, want 1", n, ReasonProbeTargetDown)
	}
	note := e.waitClusterEvent(ph.Name, ReasonProbeTargetDown)
	if !strings.Contains(note, tgt.url) || !strings.Contains(note, "directly from the manager") {
		t.Errorf("event note %q: want the probe url and the direct check's failure", note)
	}

	tgt.down.Store(false)
	if st := e.round(); st.TargetDown || st.Uncounted != 0 || st.Failed != 1 {
		t.Fatalf("first round with the target back: %+v", st)
	}
	if down, at := e.engine.ProbeTargetDown(); down || !at.IsZero() {
		t.Errorf("target back: ProbeTargetDown() = %v, %v", down, at)
	}
	if up := e.engine.ProbeTargetUpSince(); !up.After(since) {
		t.Errorf("target back: ProbeTargetUpSince() = %v, want after the outage's start %v", up, since)
	}
	if g := testutil.ToFloat64(targetUp); g != 1 {
		t.Errorf("target back: proxy_operator_probe_target_up %v, want 1", g)
	}
	if n := rec.count(ReasonProbeTargetUp, ph.Name); n != 1 {
		t.Errorf("%d %s events, want 1", n, ReasonProbeTargetUp)
	}
	e.waitClusterEvent(ph.Name, ReasonProbeTargetUp)
	// broken's count resumed from 1: its third failure in all takes it out now.
	e.round()
	for _, n := range []string{"a", "b"} {
		if got := observe(e.get(n)); got != (health{v1alpha1.PhaseReady, true, metav1.ConditionTrue, 0}) {
			t.Errorf("proxy %s after the outage: %+v", n, got)
		}
	}
	px := e.get("broken")
	if got := observe(px); got != (health{v1alpha1.PhaseRunning, false, metav1.ConditionFalse, 3}) {
		t.Fatalf("broken proxy after the outage: %+v, want it out after 3 failures counted in all", got)
	}
	if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy); c.Reason != v1alpha1.ReasonProbeFailed {
		t.Errorf("broken proxy's Healthy condition %+v", c)
	}
}

// A probe target the manager cannot reach itself (a name only the proxies resolve)
// still judges the proxies while one of them reaches it: the broken one is taken out,
// and the target is not held down.
func TestProbeTargetReachedOnlyThroughProxies(t *testing.T) {
	tgt := newDeadTarget(t)
	port := tgt.url[strings.LastIndex(tgt.url, ":")+1:]
	e := newEngineEnv(t, func(o *Options) { o.ProbeURL = "http://probe-target.invalid:" + port + "/v1/whoami" })
	good, bad := healthtest.New(t, "127.0.0.5"), healthtest.New(t, "127.0.0.6")
	for _, fp := range []*healthtest.ForwardProxy{good, bad} {
		fp.Resolve("probe-target.invalid", "127.0.0.1")
	}
	e.proxyAt("good", v1alpha1.ProxyModeManaged, good.Host, good.Port, v1alpha1.PhaseRunning)
	e.proxyAt("bad", v1alpha1.ProxyModeManaged, bad.Host, bad.Port, v1alpha1.PhaseRunning)
	if st := e.round(); st.Succeeded != 2 {
		t.Fatalf("first round: %+v", st)
	}
	bad.SetMode(healthtest.Fail)
	for i := 1; i <= 3; i++ {
		if st := e.round(); st.TargetDown || st.Uncounted != 0 || st.Failed != 1 {
			t.Fatalf("round %d: %+v, want the failure counted", i, st)
		}
	}
	if got := observe(e.get("bad")); got != (health{v1alpha1.PhaseRunning, false, metav1.ConditionFalse, 3}) {
		t.Errorf("bad proxy: %+v, want it out after 3 failures", got)
	}
	if down, _ := e.engine.ProbeTargetDown(); down {
		t.Error("ProbeTargetDown() true while a proxy reaches the target")
	}
}

// With the direct check off (--probe-target-direct-check=false) every failed probe
// counts, as where the manager cannot reach the target at all.
func TestProbeTargetDirectCheckOff(t *testing.T) {
	tgt := newDeadTarget(t)
	e := newEngineEnv(t, func(o *Options) { o.ProbeURL = tgt.url + "/v1/whoami"; o.SkipTargetCheck = true })
	fp := healthtest.New(t, "127.0.0.7")
	e.proxyAt("m", v1alpha1.ProxyModeManaged, fp.Host, fp.Port, v1alpha1.PhaseRunning)
	e.round()
	tgt.down.Store(true)
	for i := 1; i <= 3; i++ {
		if st := e.round(); st.TargetDown || st.Uncounted != 0 {
			t.Fatalf("round %d: %+v, want no judgement of the target", i, st)
		}
	}
	if got := observe(e.get("m")); got != (health{v1alpha1.PhaseRunning, false, metav1.ConditionFalse, 3}) {
		t.Errorf("proxy: %+v, want it out after 3 failures", got)
	}
	if down, _ := e.engine.ProbeTargetDown(); down {
		t.Error("ProbeTargetDown() true with the direct check off")
	}
}

// A crawler's unreachable report of a healthy proxy while the probe target is down does
// not take the proxy out: the prompt probe fails, but the target is down, so it is not
// counted and the report waits for a probe while the target answers.
func TestUnreachableReportDuringProbeTargetOutage(t *testing.T) {
	tgt := newDeadTarget(t)
	e := newEngineEnv(t, func(o *Options) { o.ProbeURL = tgt.url + "/v1/whoami" })
	fp := healthtest.New(t, "127.0.0.8")
	e.proxyAt("victim", v1alpha1.ProxyModeManaged, fp.Host, fp.Port, v1alpha1.PhaseReady)
	eng := e.startWatching(nil)
	fs := e.feedbackSide(time.Minute)
	waitFor(t, waitLong, "proxy victim healthy and listed", func() (bool, error) {
		return e.get("victim").Status.Healthy && fs.listed("victim"), nil
	})
	tgt.down.Store(true)
	if st, err := eng.Round(e.ctx); err != nil || !st.TargetDown {
		t.Fatalf("a round with the target down: %+v, %v", st, err)
	}
	probes := fp.Requests.Load()
	fs.report("victim")
	waitFor(t, waitLong, "the prompt probe of the reported proxy to have run and finished", func() (bool, error) {
		eng.mu.Lock()
		busy := len(eng.inflight) > 0
		eng.mu.Unlock()
		return fp.Requests.Load() > probes && !busy, nil
	})
	px := e.get("victim")
	if !px.Status.Healthy || px.Status.ConsecutiveProbeFailures != 0 || px.Status.UnreachableProbe != nil {
		t.Fatalf("after a failed probe answering a report during the outage: healthy %v, %d failures, answer %+v; want it untouched",
			px.Status.Healthy, px.Status.ConsecutiveProbeFailures, px.Status.UnreachableProbe)
	}
	if f := eng.failuresOf(px); f != 0 {
		t.Errorf("the engine counted %d failures", f)
	}
	// The target back, the report is answered by the next probe (the round's here).
	tgt.down.Store(false)
	if _, err := eng.Round(e.ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "a passing probe to answer the report", func() (bool, error) {
		done, ok := answered(e.get("victim"))
		return done && ok, nil
	})
}
