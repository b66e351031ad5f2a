package bans

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

var shared = testenv.NewShared()

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(shared.Run(m))
}

// newProxy creates a Proxy whose status the other two writers have set, each under its
// own field manager.
func newProxy(t *testing.T, ctx context.Context, c client.Client, ns, name string) *v1alpha1.Proxy {
	t.Helper()
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "192.0.2.1"}}
	if err := c.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		manager string
		set     func(*v1alpha1.ProxyStatus)
	}{
		{statusapply.ProxyController, func(s *v1alpha1.ProxyStatus) { s.Phase, s.IP = v1alpha1.PhaseReady, "192.0.2.1" }},
		{statusapply.ProxyHealth, func(s *v1alpha1.ProxyStatus) { s.Healthy, s.EgressIP = true, "198.51.100.1" }},
	} {
		base := px.DeepCopy()
		w.set(&px.Status)
		if err := c.Status().Patch(ctx, px, client.MergeFrom(base), client.FieldOwner(w.manager)); err != nil {
			t.Fatal(err)
		}
	}
	return px
}

func get(t *testing.T, ctx context.Context, c client.Client, key types.NamespacedName) *v1alpha1.Proxy {
	t.Helper()
	px := &v1alpha1.Proxy{}
	if err := c.Get(ctx, key, px); err != nil {
		t.Fatal(err)
	}
	return px
}

// recorderOnAProxy is a recorder on a fake clock and the key of a Proxy newProxy made.
func recorderOnAProxy(t *testing.T) (context.Context, client.Client, types.NamespacedName, *clocktesting.FakeClock, *Recorder) {
	t.Helper()
	ctx := testenv.Context(t)
	env := shared.Env(t)
	c := env.Client
	px := newProxy(t, ctx, c, env.Namespace(t, ctx, "bans"), "p1")
	clk := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	return ctx, c, client.ObjectKeyFromObject(px), clk, &Recorder{Client: c, Reader: c, APIReader: c, Clock: clk, Policy: DefaultPolicy}
}

// The recorder writes status.cooldowns alone, under proxy-feedback, coalescing the
// reports of one Proxy into one write per interval, and leaves the other writers' fields
// and ownership as they were.
func TestRecorderOwnsOnlyCooldownsAndCoalesces(t *testing.T) {
	ctx, c, key, clk, r := recorderOnAProxy(t)

	for _, site := range []string{"a.com", "b.com", "c.com"} {
		r.Add(key, Report{Site: site, Outcome: Banned})
	}
	r.Add(key, Report{Site: "d.com", Outcome: Throttled, RetryAfter: 30 * time.Second})
	if next := r.Flush(ctx); !next.IsZero() {
		t.Errorf("flush left work for %s, want none", next)
	}
	if w := r.Writes(); w != 1 {
		t.Fatalf("four reports made %d writes, want 1", w)
	}
	got := get(t, ctx, c, key)
	if n := len(got.Status.Cooldowns); n != 4 {
		t.Fatalf("cooldowns %+v, want 4 entries", got.Status.Cooldowns)
	}
	if cd := got.Status.Cooldowns[0]; cd.Site != "a.com" || cd.Bans != 1 || cd.LastOutcome != v1alpha1.CooldownBanned ||
		!cd.Until.Time.Equal(clk.Now().Add(DefaultCooldown)) {
		t.Errorf("entry %+v, want a.com banned once until %s", cd, clk.Now().Add(DefaultCooldown))
	}
	if got.Status.Phase != v1alpha1.PhaseReady || !got.Status.Healthy || got.Status.EgressIP != "198.51.100.1" {
		t.Errorf("the other writers' fields changed: %+v", got.Status)
	}
	owners := testenv.StatusManagers(got)
	fb := owners[FieldManager]
	if !strings.Contains(fb, `"f:cooldowns"`) || strings.Contains(fb, "f:phase") || strings.Contains(fb, "f:healthy") {
		t.Errorf("%s owns %s, want status.cooldowns alone", FieldManager, fb)
	}
	if !strings.Contains(owners[statusapply.ProxyController], "f:phase") || !strings.Contains(owners[statusapply.ProxyHealth], "f:healthy") ||
		strings.Contains(owners[statusapply.ProxyController]+owners[statusapply.ProxyHealth], "cooldowns") {
		t.Errorf("the other managers' fields moved: %v", owners)
	}

	// Within the interval a report waits; at its end it is written.
	r.Add(key, Report{Site: "e.com", Outcome: Banned})
	if next := r.Flush(ctx); !next.Equal(clk.Now().Add(DefaultWriteInterval)) {
		t.Errorf("next flush at %s, want %s", next, clk.Now().Add(DefaultWriteInterval))
	}
	if w := r.Writes(); w != 1 {
		t.Fatalf("a report within the interval was written at once (%d writes)", w)
	}
	clk.Step(DefaultWriteInterval)
	r.Flush(ctx)
	if w := r.Writes(); w != 2 {
		t.Fatalf("%d writes after the interval, want 2", w)
	}
	if n := len(get(t, ctx, c, key).Status.Cooldowns); n != 5 {
		t.Fatalf("%d cooldowns, want 5", n)
	}
	// Reports that change nothing (ok while cooling, a ban while cooling) write nothing.
	clk.Step(DefaultWriteInterval)
	r.Add(key, Report{Site: "a.com", Outcome: OK})
	r.Add(key, Report{Site: "a.com", Outcome: Banned})
	r.Flush(ctx)
	if w := r.Writes(); w != 2 {
		t.Errorf("reports that change nothing made a write (%d writes)", w)
	}
	// Every entry ended and forgotten: the apply carries no cooldowns, which removes them,
	// and the other fields stay.
	clk.Step(DefaultMaxCooldown + DefaultCooldown)
	r.Add(key, Report{Site: "d.com", Outcome: OK})
	r.Flush(ctx)
	got = get(t, ctx, c, key)
	if len(got.Status.Cooldowns) != 0 || got.Status.Phase != v1alpha1.PhaseReady || !got.Status.Healthy {
		t.Errorf("after expiry: %+v, want no cooldowns and the rest as it was", got.Status)
	}
}

// staleReader answers with a copy taken before another replica's write.
type staleReader struct {
	client.Reader
	px *v1alpha1.Proxy
}

func (s staleReader) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	s.px.DeepCopyInto(obj.(*v1alpha1.Proxy))
	return nil
}

// Two replicas writing one Proxy from their own caches: the one whose copy is stale is
// refused, reads again and applies again, so neither loses the other's entries.
func TestRecorderReplicasDoNotLoseEachOthersEntries(t *testing.T) {
	ctx := testenv.Context(t)
	env := shared.Env(t)
	c := env.Client
	ns := env.Namespace(t, ctx, "bans")
	px := newProxy(t, ctx, c, ns, "p2")
	key := client.ObjectKeyFromObject(px)
	stale := get(t, ctx, c, key)

	a := &Recorder{Client: c, Reader: c, APIReader: c, Policy: DefaultPolicy}
	a.Add(key, Report{Site: "a.com", Outcome: Banned})
	a.Flush(ctx)
	b := &Recorder{Client: c, Reader: staleReader{c, stale}, APIReader: c, Policy: DefaultPolicy}
	b.Add(key, Report{Site: "b.com", Outcome: Banned})
	b.Flush(ctx)
	var sites []string
	for _, cd := range get(t, ctx, c, key).Status.Cooldowns {
		sites = append(sites, cd.Site)
	}
	if strings.Join(sites, ",") != "a.com,b.com" {
		t.Fatalf("cooldowns for %v, want a.com and b.com", sites)
	}
}

// A pool child cools by its pool's spec.bans; a standalone Proxy by the recorder's policy.
func TestRecorderUsesThePoolsPolicy(t *testing.T) {
	ctx := testenv.Context(t)
	env := shared.Env(t)
	c := env.Client
	ns := env.Namespace(t, ctx, "bans")
	pool := &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"},
		Spec: v1alpha1.ProxyPoolSpec{Template: v1alpha1.ProxyTemplate{Spec: v1alpha1.ProxySpec{Provider: "kvm2-home"}},
			Bans: &v1alpha1.PoolBans{CooldownSeconds: ptr.To[int32](42)}}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	child := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "child",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: "pool", UID: pool.UID, Controller: ptr.To(true)}}},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "192.0.2.9"}}
	if err := c.Create(ctx, child); err != nil {
		t.Fatal(err)
	}
	standalone := newProxy(t, ctx, c, ns, "alone")
	clk := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	r := &Recorder{Client: c, Reader: c, APIReader: c, Clock: clk, Policy: Policy{Cooldown: 7 * time.Second}}
	for _, px := range []*v1alpha1.Proxy{child, standalone} {
		r.Add(client.ObjectKeyFromObject(px), Report{Site: "a.com", Outcome: Banned})
	}
	r.Flush(ctx)
	for px, want := range map[*v1alpha1.Proxy]time.Duration{child: 42 * time.Second, standalone: 7 * time.Second} {
		got := get(t, ctx, c, client.ObjectKeyFromObject(px)).Status.Cooldowns
		if len(got) != 1 || got[0].Until.Sub(clk.Now()) != want {
			t.Errorf("%s: cooldowns %+v, want one of %s", px.Name, got, want)
		}
	}
}

// Told to stop, the recorder calls BeforeFinalFlush (the discovery server's Drain, which
// stops new feedback) and then writes what is pending, including a report taken up to
// that moment.
func TestRecorderStopsFeedbackBeforeItsLastFlush(t *testing.T) {
	ctx := testenv.Context(t)
	env := shared.Env(t)
	c := env.Client
	ns := env.Namespace(t, ctx, "bans")
	px := newProxy(t, ctx, c, ns, "p1")
	key := client.ObjectKeyFromObject(px)
	r := &Recorder{Client: c, Reader: c, APIReader: c, Policy: DefaultPolicy}
	r.BeforeFinalFlush = func() { r.Add(key, Report{Site: "late.example", Outcome: Banned}) }
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Start(rctx) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the recorder did not stop within 30s of its context's end")
	}
	got := get(t, ctx, c, key)
	if len(got.Status.Cooldowns) != 1 || got.Status.Cooldowns[0].Site != "late.example" {
		t.Errorf("cooldowns %+v, want the report taken before the last flush", got.Status.Cooldowns)
	}
}

// A write the API server refuses as invalid (here a site longer than status.cooldowns
// allows, which bans.Site now refuses before it reaches a recorder) is dropped and
// counted: it does not hold back the Proxy's later reports, and no write repeats it.
func TestRecorderDropsAWriteRefusedAsInvalid(t *testing.T) {
	ctx, c, key, clk, r := recorderOnAProxy(t)
	dropped := testutil.ToFloat64(droppedReports.WithLabelValues(DropInvalid))

	overlong := strings.Repeat("a", 42) + strings.Repeat(".abcde", 41) + ".example.com" // 300 characters
	r.Add(key, Report{Site: overlong, Outcome: Banned})
	r.Add(key, Report{Site: overlong, Outcome: Throttled})
	r.Add(key, Report{Site: "b.com", Outcome: Banned})
	r.Flush(ctx)
	if n := r.Pending(); n != 0 {
		t.Fatalf("%d pairs still pending after the write was refused as invalid, want none", n)
	}
	if d := testutil.ToFloat64(droppedReports.WithLabelValues(DropInvalid)) - dropped; d != 3 {
		t.Errorf("%v reports counted dropped as invalid, want 3", d)
	}
	for i, site := range []string{"c.com", "d.com"} {
		clk.Step(DefaultWriteInterval)
		r.Add(key, Report{Site: site, Outcome: Banned})
		if next := r.Flush(ctx); !next.IsZero() {
			t.Errorf("flush %d left work for %s, want none", i+1, next)
		}
	}
	var sites []string
	for _, cd := range get(t, ctx, c, key).Status.Cooldowns {
		sites = append(sites, cd.Site)
	}
	if strings.Join(sites, ",") != "c.com,d.com" || r.Writes() != 2 {
		t.Errorf("cooldowns for %v after %d writes, want c.com and d.com in 2", sites, r.Writes())
	}
}
