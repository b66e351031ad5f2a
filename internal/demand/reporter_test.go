package demand

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// The writes go to a real API server (envtest), shared by the package's tests.
var shared = testenv.NewShared()

func TestMain(m *testing.M) { os.Exit(shared.Run(m)) }

func poolKey(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}

// countingClient counts the Reporter's writes, and fails them while fail is set.
type countingClient struct {
	client.Client
	writes atomic.Int32
	fail   atomic.Bool
}

func (c *countingClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	if c.fail.Load() {
		return errors.New("the API server is away")
	}
	c.writes.Add(1)
	return c.Client.Apply(ctx, obj, opts...)
}

// newReporterEnv is a Reporter of kind and source on a fake clock, writing through a
// counting client to a demand namespace of the test's own (the one returned; the pools
// are in other namespaces).
func newReporterEnv(t *testing.T, kind, source string) (*testenv.Env, context.Context, string, *clocktesting.FakeClock, *countingClient, *Reporter) {
	env := shared.Env(t)
	ctx := testenv.Context(t)
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cc := &countingClient{Client: env.Client}
	return env, ctx, env.Namespace(t, ctx, "demand"), clk, cc, &Reporter{Client: cc, Kind: kind, Source: source, Clock: clk}
}

func newReporter(t *testing.T, kind, source string) (*testenv.Env, context.Context, string, *clocktesting.FakeClock, *countingClient, *Reporter) {
	env, ctx, ns, clk, cc, r := newReporterEnv(t, kind, source)
	r.Namespace = ns
	return env, ctx, ns, clk, cc, r
}

// TestReporterWriteBound walks one pool's numbers through every rule of the write bound on
// a fake clock, and checks after each step whether it wrote and what the Lease holds.
func TestReporterWriteBound(t *testing.T) {
	env, ctx, ns, clk, cc, r := newReporter(t, KindGateway, "egress-gw-0")
	pool := poolKey("team-a", "crawl")

	lastWrites := int32(0)
	step := func(name string, advance time.Duration, m *Measure, wantWrite bool, wantSessions float64, wantHeld int32) {
		t.Helper()
		clk.Step(advance)
		var err error
		if m != nil {
			_, err = r.Report(ctx, pool, *m)
		} else {
			err = r.Flush(ctx)
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		w := cc.writes.Load()
		if wrote := w > lastWrites; wrote != wantWrite {
			t.Fatalf("%s: wrote %v, want %v", name, wrote, wantWrite)
		}
		lastWrites = w
		l := &coordinationv1.Lease{}
		err = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: LeaseName(pool, "egress-gw-0")}, l)
		if wantSessions < 0 {
			if err == nil {
				t.Fatalf("%s: a Lease %s exists, want none", name, l.Name)
			}
			return
		}
		if err != nil {
			t.Fatalf("%s: reading the Lease: %v", name, err)
		}
		s, err := Parse(l)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Sessions != wantSessions || s.Held != wantHeld || s.Source != "egress-gw-0" {
			t.Fatalf("%s: the Lease holds %+v, want %g sessions, %d held from egress-gw-0", name, s, wantSessions, wantHeld)
		}
		if wantWrite && !s.At.Equal(clk.Now()) {
			t.Fatalf("%s: renewTime %s, want the write's time %s", name, s.At, clk.Now())
		}
		if l.Labels[LabelFor] != "crawl" || l.Labels[LabelNamespace] != "team-a" || l.Labels[LabelSource] != KindGateway {
			t.Fatalf("%s: labels %v", name, l.Labels)
		}
	}
	m := func(sessions float64, held int32) *Measure {
		return &Measure{Sessions: sessions, Held: held, RequestsPerSecond: sessions / 2}
	}

	step("zero demand never written", 0, m(0, 0), false, -1, 0)
	step("zero demand, a minute on", time.Minute, m(0, 0), false, -1, 0)
	step("the first demand is written at once", 0, m(4, 0), true, 4, 0)
	step("a change within the report interval waits", 5*time.Second, m(6, 0), false, 4, 0)
	step("nor does a flush before the interval write", 5*time.Second, nil, false, 4, 0)
	step("a flush at the interval writes the change", 5*time.Second, nil, true, 6, 0)
	step("a change that rounds alike is no change", 20*time.Second, m(6.0001, 0), false, 6, 0)
	step("unchanged numbers before the refresh: nothing", 30*time.Second, nil, false, 6, 0)
	step("unchanged numbers at the refresh age are written again", 10*time.Second, nil, true, 6, 0)
	step("a wake within a second of a write waits", 500*time.Millisecond, m(6, 1), false, 6, 0)
	step("the wake is written a second after the last write", 500*time.Millisecond, m(6, 1), true, 6, 1)
	step("more held is a change, bound by the interval", time.Second, m(6, 5), false, 6, 1)
	step("zero after nonzero is written, at the interval", 14*time.Second, m(0, 0), true, 0, 0)
	step("a wake after zero", 3*time.Second, m(0, 2), true, 0, 2)

	// A failed write is tried again on the next flush.
	cc.fail.Store(true)
	clk.Step(DefaultReportInterval)
	if _, err := r.Report(ctx, pool, *m(9, 0)); err == nil || !strings.Contains(err.Error(), ns+"/team-a.crawl.demand.egress-gw-0") {
		t.Fatalf("a failed write returned %v, want an error naming the Lease", err)
	}
	cc.fail.Store(false)
	step("the failed write is retried by the next flush", 0, nil, true, 9, 0)

	// Forget: nothing more is written for the pool.
	r.Forget(pool)
	step("a forgotten pool is not refreshed", time.Hour, nil, false, 9, 0)
}

// TestReporterWritesPerMinute: a measurer whose numbers change all the time writes each
// pool at most 60s/ReportInterval times a minute (4), and one whose numbers hold still
// once a minute; a thousand reports a minute make no more.
func TestReporterWritesPerMinute(t *testing.T) {
	_, ctx, _, clk, cc, r := newReporter(t, KindDiscovery, "discovery-mgr-0")
	busy, still := poolKey("team-a", "busy"), poolKey("team-b", "still")
	// A first minute to settle, then count one full minute of 60ms reports.
	run := func() {
		for i := range 1000 {
			clk.Step(60 * time.Millisecond)
			if _, err := r.Report(ctx, busy, Measure{Sessions: float64(1 + i%7)}); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Report(ctx, still, Measure{Sessions: 3}); err != nil {
				t.Fatal(err)
			}
		}
	}
	run()
	cc.writes.Store(0)
	run()
	if got := cc.writes.Load(); got != 5 {
		t.Fatalf("one minute of reports for a busy and a still pool wrote %d times, want 4 for the busy one and 1 for the still one", got)
	}
}

// A Reporter without a demand namespace writes nothing, and says so naming the pool.
func TestReporterWithoutNamespaceRefuses(t *testing.T) {
	_, ctx, _, _, cc, r := newReporterEnv(t, KindGateway, "egress-gw-0")
	_, err := r.Report(ctx, poolKey("team-a", "crawl"), Measure{Sessions: 1})
	if err == nil || !strings.Contains(err.Error(), "team-a/crawl") || !strings.Contains(err.Error(), "demand namespace") {
		t.Fatalf("Report without a demand namespace = %v, want an error naming the pool and the missing demand namespace", err)
	}
	if cc.writes.Load() != 0 {
		t.Fatalf("wrote %d times, want none", cc.writes.Load())
	}
}
