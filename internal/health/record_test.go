package health

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// recordAfterReplacement probes px (the old instance), lets the reconciler publish
// another instance before the engine's write (an apply under proxy-controller), and
// returns the Proxy after record. The engine's apply, carrying the version it read, meets
// a conflict once, as it does when the reconciler wrote in between.
func recordAfterReplacement(t *testing.T, px *v1alpha1.Proxy, replace func(*v1alpha1.ProxyStatus)) (*v1alpha1.Proxy, int) {
	t.Helper()
	ctx := testContext(t)
	env := shared.Env(t)
	px = px.DeepCopy()
	px.Namespace = env.Namespace(t, ctx, "record")
	st := px.Status
	if err := env.Client.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	reconcilerWrites(t, env.Client, px, st)
	applies := 0
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	c := interceptor.NewClient(wc, interceptor.Funcs{
		SubResourceApply: func(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
			if applies++; applies == 1 {
				stored := &v1alpha1.Proxy{}
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(px), stored); err != nil {
					return err
				}
				next := stored.Status
				replace(&next)
				reconcilerWrites(t, env.Client, stored, next)
			}
			return c.SubResource(sub).Apply(ctx, obj, opts...)
		},
	})
	eng, err := New(c, env.Client, nil, Options{ProbeURL: "http://127.0.0.1:1/v1/whoami"}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	listed := &v1alpha1.Proxy{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(px), listed); err != nil {
		t.Fatal(err)
	}
	conflicts, _, err := eng.record(ctx, listed, result{latency: 5 * time.Millisecond, egressIP: "198.51.100.7"})
	if err != nil {
		t.Fatalf("record: %v", err)
	}
	got := &v1alpha1.Proxy{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(px), got); err != nil {
		t.Fatal(err)
	}
	return got, conflicts
}

// reconcilerWrites applies st's reconciler fields to px as the Proxy reconciler does.
func reconcilerWrites(t *testing.T, c client.Client, px *v1alpha1.Proxy, st v1alpha1.ProxyStatus) {
	t.Helper()
	own := &v1alpha1.ProxyStatus{Phase: st.Phase, ProviderID: st.ProviderID, IP: st.IP, Message: st.Message}
	if err := statusapply.Status(context.Background(), c, px.DeepCopy(), own, statusapply.ProxyController); err != nil {
		t.Fatal(err)
	}
}

func runningProxy() *v1alpha1.Proxy {
	return &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: "swap", Namespace: "default"},
		Spec:       v1alpha1.ProxySpec{Provider: "kvm2-home", Port: 3128},
		Status:     v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseRunning, ProviderID: "kvm2://hv1/proxy-old", IP: "10.0.0.1"},
	}
}

// A good probe of the old VM, recorded after a conflict with the reconciler publishing
// a new VM (another providerID or address), must not mark the never-probed new VM Ready.
func TestRecordDropsResultOfAnotherInstance(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replace func(*v1alpha1.ProxyStatus)
	}{
		{"new instance and address", func(st *v1alpha1.ProxyStatus) {
			st.ProviderID, st.IP = "kvm2://hv2/proxy-new", "10.0.0.2"
		}},
		{"same instance, new address", func(st *v1alpha1.ProxyStatus) { st.IP = "10.0.0.2" }},
		{"new instance at the same address", func(st *v1alpha1.ProxyStatus) { st.ProviderID = "kvm2://hv2/proxy-new" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, conflicts := recordAfterReplacement(t, runningProxy(), tc.replace)
			if conflicts != 1 {
				t.Errorf("%d conflicts, want 1", conflicts)
			}
			st := got.Status
			if st.Phase != v1alpha1.PhaseRunning || st.Healthy || st.LastProbeTime != nil || st.EgressIP != "" {
				t.Errorf("status %+v: the old instance's probe was applied to the new one", st)
			}
		})
	}
}

// The same conflict with a write that left the probed instance and address alone (the
// reconciler's message, say): the result is laid onto the fresh copy.
func TestRecordAppliesResultAfterUnrelatedConflict(t *testing.T) {
	got, conflicts := recordAfterReplacement(t, runningProxy(), func(st *v1alpha1.ProxyStatus) {
		st.Message = "instance proxy-old is running at 10.0.0.1"
	})
	if conflicts != 1 {
		t.Errorf("%d conflicts, want 1", conflicts)
	}
	st := got.Status
	if shown(got) != v1alpha1.PhaseReady || !st.Healthy || st.EgressIP != "198.51.100.7" || st.Message != "instance proxy-old is running at 10.0.0.1" {
		t.Errorf("status %+v, want Ready and healthy with the reconciler's message kept", st)
	}
}

// Steady probes write nothing; a change a user sees is written at once, and
// lastProbeTime is refreshed once per heartbeat interval.
func TestRecordWritesTransitionsAndHeartbeatsOnly(t *testing.T) {
	px := runningProxy()
	writes := 0
	c := testenv.FakeClient(t, interceptor.Funcs{
		SubResourceApply: func(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
			writes++
			return c.SubResource(sub).Apply(ctx, obj, opts...)
		},
	}, px.DeepCopy())
	eng, err := New(c, c, nil, Options{ProbeURL: "http://127.0.0.1:1/v1/whoami", FailureThreshold: 3,
		HeartbeatInterval: 10 * time.Minute}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	eng.now = func() time.Time { return now }
	ok := result{latency: 5 * time.Millisecond, egressIP: "198.51.100.7"}
	bad := result{err: errors.New("probe through 10.0.0.1:3128: connection refused"), latency: time.Millisecond}
	heartbeats := testutil.ToFloat64(statusWrites.WithLabelValues(writeHeartbeat))

	for i, step := range []struct {
		after    time.Duration
		r        result
		write    bool
		phase    v1alpha1.ProxyPhase
		failures int32 // as the status shows them
	}{
		{0, ok, true, v1alpha1.PhaseReady, 0},                 // Running -> Ready
		{30 * time.Second, ok, false, v1alpha1.PhaseReady, 0}, // nothing changed
		{30 * time.Second, result{latency: 9 * time.Millisecond, egressIP: "198.51.100.7"}, false, v1alpha1.PhaseReady, 0}, // latency alone
		{30 * time.Second, result{latency: 5 * time.Millisecond, egressIP: "198.51.100.8"}, true, v1alpha1.PhaseReady, 0},  // egress IP
		{30 * time.Second, bad, false, v1alpha1.PhaseReady, 0},                                                             // 1 of 3: still in rotation
		{30 * time.Second, bad, false, v1alpha1.PhaseReady, 0},                                                             // 2 of 3
		{30 * time.Second, bad, true, v1alpha1.PhaseRunning, 3},                                                            // threshold crossed
		{30 * time.Second, bad, false, v1alpha1.PhaseRunning, 3},                                                           // still failing, same message
		{10 * time.Minute, bad, true, v1alpha1.PhaseRunning, 5},                                                            // heartbeat, with the engine's count
		{30 * time.Second, ok, true, v1alpha1.PhaseReady, 0},                                                               // recovered
		{9 * time.Minute, ok, false, v1alpha1.PhaseReady, 0},                                                               // heartbeat not due yet
		{time.Minute, ok, true, v1alpha1.PhaseReady, 0},                                                                    // 10 minutes since the last write
	} {
		now = now.Add(step.after)
		listed := &v1alpha1.Proxy{}
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(px), listed); err != nil {
			t.Fatal(err)
		}
		before := writes
		if _, wrote, err := eng.record(context.Background(), listed, step.r); err != nil || wrote != step.write {
			t.Fatalf("step %d: record wrote=%v err=%v, want wrote=%v", i, wrote, err, step.write)
		}
		got := &v1alpha1.Proxy{}
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(px), got); err != nil {
			t.Fatal(err)
		}
		st := got.Status
		if (writes > before) != step.write || shown(got) != step.phase || st.ConsecutiveProbeFailures != step.failures {
			t.Fatalf("step %d: %d writes, phase %s, failures %d; want write=%v, %s, %d",
				i, writes-before, shown(got), st.ConsecutiveProbeFailures, step.write, step.phase, step.failures)
		}
		if step.write && !st.LastProbeTime.Time.Equal(now) {
			t.Errorf("step %d: lastProbeTime %v, want %v", i, st.LastProbeTime, now)
		}
	}
	if d := testutil.ToFloat64(statusWrites.WithLabelValues(writeHeartbeat)) - heartbeats; d != 2 {
		t.Errorf("status_writes_total{why=heartbeat} rose by %v, want 2", d)
	}
}

// The engine decides from the manager's cache, which may not show its own last write
// yet. A recovery probe judged against such a copy (still "healthy") must still be
// written, with its Event: the engine's own record of what it applied stands for the
// fields only it writes. Before that record the proxy stayed out of rotation until the
// next heartbeat.
func TestRecordRecoveryFromACacheBehindItsOwnWrite(t *testing.T) {
	px := runningProxy()
	c := testenv.FakeClient(t, interceptor.Funcs{}, px.DeepCopy())
	rec := events.NewFakeRecorder(10)
	eng, err := New(c, c, rec, Options{ProbeURL: "http://127.0.0.1:1/v1/whoami", FailureThreshold: 3,
		HeartbeatInterval: 10 * time.Minute}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	eng.now = func() time.Time { now = now.Add(10 * time.Second); return now }
	read := func() *v1alpha1.Proxy {
		got := &v1alpha1.Proxy{}
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(px), got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	ok := result{latency: 5 * time.Millisecond, egressIP: "198.51.100.7"}
	bad := result{err: errors.New("probe through 10.0.0.1:3128: connection refused"), latency: time.Millisecond}

	if _, wrote, err := eng.record(context.Background(), read(), ok); err != nil || !wrote {
		t.Fatalf("first good probe: wrote=%v err=%v", wrote, err)
	}
	lagging := read() // healthy: what the cache still shows after the failures below
	for i := 1; i <= 3; i++ {
		if _, _, err := eng.record(context.Background(), read(), bad); err != nil {
			t.Fatalf("failed probe %d: %v", i, err)
		}
	}
	if got := read(); got.Status.Healthy || got.Status.ConsecutiveProbeFailures != 3 {
		t.Fatalf("after 3 failed probes: %+v, want unhealthy with 3 failures", got.Status)
	}
	for len(rec.Events) > 0 {
		<-rec.Events
	}

	if _, wrote, err := eng.record(context.Background(), lagging, ok); err != nil || !wrote {
		t.Fatalf("recovery decided from a lagging copy: wrote=%v err=%v, want a write", wrote, err)
	}
	got := read()
	if shown(got) != v1alpha1.PhaseReady || !got.Status.Healthy || got.Status.ConsecutiveProbeFailures != 0 {
		t.Errorf("after recovery: phase %s healthy=%v failures=%d, want Ready, healthy, 0",
			shown(got), got.Status.Healthy, got.Status.ConsecutiveProbeFailures)
	}
	select {
	case ev := <-rec.Events:
		if !strings.Contains(ev, v1alpha1.ReasonProbeSucceeded) {
			t.Errorf("event %q, want %s", ev, v1alpha1.ReasonProbeSucceeded)
		}
	default:
		t.Errorf("no %s event for the recovery", v1alpha1.ReasonProbeSucceeded)
	}
}

// A write refused for a conflict and tried again on a fresh copy counts the failed probe
// once: the count was once advanced by each attempt, and a proxy was taken out after
// fewer failed probes than the threshold (TestProbeTargetReachedOnlyThroughProxies saw 4
// failures counted for 3 probes).
func TestRecordCountsAFailureOnceAcrossAConflict(t *testing.T) {
	px := runningProxy()
	applies := 0
	c := testenv.FakeClient(t, interceptor.Funcs{
		SubResourceApply: func(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
			if applies++; applies == 1 {
				return apierrors.NewConflict(schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "proxies"}, px.Name,
					errors.New("the object has been modified"))
			}
			return c.SubResource(sub).Apply(ctx, obj, opts...)
		},
	}, px.DeepCopy())
	eng, err := New(c, c, nil, Options{ProbeURL: "http://127.0.0.1:1/v1/whoami", FailureThreshold: 1}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	listed := &v1alpha1.Proxy{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(px), listed); err != nil {
		t.Fatal(err)
	}
	conflicts, wrote, err := eng.record(context.Background(), listed, result{err: errors.New("probe through 10.0.0.1:3128: connection refused")})
	if err != nil || !wrote || conflicts != 1 {
		t.Fatalf("record: %d conflicts, wrote %v, %v; want one conflict, then the write", conflicts, wrote, err)
	}
	got := &v1alpha1.Proxy{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(px), got); err != nil {
		t.Fatal(err)
	}
	if n := got.Status.ConsecutiveProbeFailures; n != 1 || got.Status.Healthy {
		t.Errorf("after one failed probe and a conflict: %d failures counted, healthy %v; want 1, out", n, got.Status.Healthy)
	}
}
