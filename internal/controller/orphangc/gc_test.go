package orphangc

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// markedOnly is a provider whose ListByTag returns only the instances carrying its
// ownership mark; the others exist on the same backend but belong to someone else.
type markedOnly struct {
	*providertest.Fake
	unmarked map[string]bool // providerIDs without the mark
}

func (m *markedOnly) ListByTag(ctx context.Context) ([]provider.Instance, error) {
	all, err := m.Fake.ListByTag(ctx)
	return slices.DeleteFunc(all, func(in provider.Instance) bool { return m.unmarked[in.ProviderID] }), err
}

// GC only lists Proxies: controller-runtime's fake client stands in for the API server.
func gcClient(t *testing.T) client.Client {
	t.Helper()
	return testenv.FakeClient(t, interceptor.Funcs{})
}

// newProxyObject creates a Proxy with an empty status: what a Proxy looks like while its
// first Create is still running.
func newProxyObject(t *testing.T, ctx context.Context, c client.Client, name string) *v1alpha1.Proxy {
	t.Helper()
	px := testbuild.Proxy("gc", name, testbuild.WithUID("uid-"+name), testbuild.WithProvider("gc-a"))
	if err := c.Create(ctx, px); err != nil {
		t.Fatalf("creating proxy gc/%s: %v", name, err)
	}
	return px
}

func TestOrphanGCSweep(t *testing.T) {
	ctx := testenv.Context(t)
	c := gcClient(t)
	now := time.Now()
	old, young := now.Add(-time.Hour), now.Add(-time.Minute)
	live := newProxyObject(t, ctx, c, "live")

	a := &markedOnly{Fake: providertest.NewFake(), unmarked: map[string]bool{}}
	b := providertest.NewFake()
	orphan := a.SetInstance(provider.Instance{Name: "proxy-orphan", UID: "gone-uid", CreatedAt: old})
	owned := a.SetInstance(provider.Instance{Name: live.InstanceName(), UID: string(live.UID), CreatedAt: old})
	inGrace := a.SetInstance(provider.Instance{Name: "proxy-young", UID: "other-gone-uid", CreatedAt: young})
	noUID := a.SetInstance(provider.Instance{Name: "proxy-nouid", CreatedAt: old})
	noTime := a.SetInstance(provider.Instance{Name: "proxy-notime", UID: "third-gone-uid"})
	foreign := a.SetInstance(provider.Instance{Name: "not-ours", UID: "gone-uid-too", CreatedAt: old})
	a.unmarked[foreign] = true
	orphanB := b.SetInstance(provider.Instance{Name: "proxy-orphan-b", UID: "gone-b", CreatedAt: old})

	gc := &OrphanGC{Client: c, Providers: map[string]provider.Provider{"gc-a": a, "gc-b": b},
		Grace: 10 * time.Minute, Log: logr.Discard(), now: func() time.Time { return now }}
	before := testutil.ToFloat64(gcDeletedTotal.WithLabelValues("gc-a"))
	res, err := gc.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Deleted["gc-a"]; !slices.Equal(got, []string{orphan}) {
		t.Errorf("gc-a: deleted %v, want only the old orphan %s", got, orphan)
	}
	if got := res.Deleted["gc-b"]; !slices.Equal(got, []string{orphanB}) {
		t.Errorf("gc-b: deleted %v, want %s", got, orphanB)
	}
	for _, id := range []string{owned, inGrace, noUID, noTime, foreign} {
		if _, ok := a.Instance(id); !ok {
			t.Errorf("%s was deleted", id)
		}
	}
	for _, c := range a.CallsOf(providertest.OpDelete) {
		if c.Arg == foreign {
			t.Errorf("GC called Delete on %s, which ListByTag never returned", foreign)
		}
	}
	if d := testutil.ToFloat64(gcDeletedTotal.WithLabelValues("gc-a")) - before; d != 1 {
		t.Errorf("proxy_operator_gc_deleted_total{provider=gc-a} rose by %v, want 1", d)
	}

	// Once the grace period has passed, the young orphan goes too; the rest stays.
	now = now.Add(10 * time.Minute)
	res, err = gc.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Deleted["gc-a"]; !slices.Equal(got, []string{inGrace}) {
		t.Errorf("second sweep deleted %v, want %s", got, inGrace)
	}
}

// A Create that has made the instance but not yet written the Proxy's status (no
// providerID, no IP) is never collected: the match is on the owner UID, and a Proxy the
// cache has not seen yet is covered by the grace period.
func TestOrphanGCInFlightCreate(t *testing.T) {
	ctx := testenv.Context(t)
	c := gcClient(t)
	px := newProxyObject(t, ctx, c, "creating")
	fake := providertest.NewFake()
	release := make(chan struct{})
	created := make(chan struct{})
	fake.SetCreateHook(func(ctx context.Context, req provider.CreateRequest) error {
		close(created)
		<-release
		return nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := fake.Create(ctx, provider.CreateRequest{Name: px.InstanceName(), UID: string(px.UID)})
		done <- err
	}()
	<-created
	// The VM exists at the provider while Create is still running, long before grace.
	now := time.Now()
	fake.SetInstance(provider.Instance{Name: px.InstanceName(), UID: string(px.UID), CreatedAt: now.Add(-time.Hour)})
	// And one whose Proxy this GC's view does not contain yet (a lagging cache).
	unseen := fake.SetInstance(provider.Instance{Name: "proxy-unseen", UID: "uid-not-in-cache-yet", CreatedAt: now.Add(-5 * time.Second)})

	gc := &OrphanGC{Client: c, Providers: map[string]provider.Provider{"gc-a": fake},
		Grace: 10 * time.Minute, Log: logr.Discard(), now: func() time.Time { return now }}
	res, err := gc.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deleted) != 0 || fake.CountOf(providertest.OpDelete) != 0 {
		t.Fatalf("in-flight instances collected: %v", res.Deleted)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, ok := fake.Instance(unseen); !ok {
		t.Error("the instance of a Proxy the cache had not seen was deleted within grace")
	}
}

func TestOrphanGCListingFailureSkipsOnlyThatProvider(t *testing.T) {
	ctx := testenv.Context(t)
	now := time.Now()
	bad, good := providertest.NewFake(), providertest.NewFake()
	badOrphan := bad.SetInstance(provider.Instance{Name: "proxy-x", UID: "gone", CreatedAt: now.Add(-time.Hour)})
	goodOrphan := good.SetInstance(provider.Instance{Name: "proxy-y", UID: "gone", CreatedAt: now.Add(-time.Hour)})
	bad.NextListErr(provider.Transient(errors.New("ssh: connect to host hv1: connection refused")))

	var lines controllertest.LogLines
	gc := &OrphanGC{Client: gcClient(t), Providers: map[string]provider.Provider{"bad": bad, "good": good},
		Grace: time.Minute, Log: lines.Logger(), now: func() time.Time { return now }}
	res, err := gc.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Skipped, []string{"bad"}) || !slices.Equal(res.Deleted["good"], []string{goodOrphan}) {
		t.Fatalf("skipped %v, deleted %v", res.Skipped, res.Deleted)
	}
	if n := lines.Count("skipping provider"); n != 1 {
		t.Errorf("%d log lines about the skipped provider, want 1:\n%s", n, &lines)
	}
	if _, ok := bad.Instance(badOrphan); !ok {
		t.Fatal("instance of the failing provider deleted")
	}
	// The failure was one-shot: the next sweep collects it.
	res, _ = gc.Sweep(ctx)
	if !slices.Equal(res.Deleted["bad"], []string{badOrphan}) {
		t.Errorf("next sweep deleted %v from bad", res.Deleted["bad"])
	}
}

// Start sweeps first one interval after it starts, then every interval, until its
// context ends, and then returns nil.
func TestOrphanGCStartSweepsEveryInterval(t *testing.T) {
	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	fake := providertest.NewFake()
	orphan := fake.SetInstance(provider.Instance{Name: "proxy-o", UID: "gone", CreatedAt: time.Now().Add(-time.Hour)})
	const interval = 200 * time.Millisecond
	gc := &OrphanGC{Client: gcClient(t), Providers: map[string]provider.Provider{"gc-a": fake},
		Interval: interval, Grace: time.Minute, Log: logr.Discard()}
	started := time.Now()
	done := make(chan error, 1)
	go func() { done <- gc.Start(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for fake.CountOf(providertest.OpList) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30s for three sweeps, saw %d listings", fake.CountOf(providertest.OpList))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if elapsed := time.Since(started); elapsed < 3*interval {
		t.Errorf("three sweeps after %v, want the first one interval after start and one an interval after each (>= %v)", elapsed, 3*interval)
	}
	if _, ok := fake.Instance(orphan); ok {
		t.Error("the sweeps Start ran left the orphan in place")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start returned %v after its context ended, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Start did not return within 30s of its context ending")
	}
}
