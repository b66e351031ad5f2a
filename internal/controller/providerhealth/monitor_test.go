package providerhealth

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// slowCheck is a provider whose Check waits for the context, as a hung host does.
type slowCheck struct{ *providertest.Fake }

func (s slowCheck) Check(ctx context.Context) []provider.TargetStatus {
	<-ctx.Done()
	return []provider.TargetStatus{{Target: "hv-slow", Reason: "Timeout", Message: ctx.Err().Error()}}
}

func getPH(t *testing.T, ctx context.Context, name string) *v1alpha1.ProviderHealth {
	t.Helper()
	ph := &v1alpha1.ProviderHealth{}
	if err := shared.Client(t).Get(ctx, client.ObjectKey{Name: name}, ph); err != nil {
		t.Fatalf("getting providerhealth %s: %v", name, err)
	}
	return ph
}

func TestProviderHealthMonitor(t *testing.T) {
	ctx := testContext(t)
	// The gauge is process-wide: start from no series, so a repeated run (-count) or an
	// earlier test's targets do not count here.
	providerTargetUp.Reset()
	fake := providertest.NewFake()
	fake.SetCheckResult([]provider.TargetStatus{
		{Target: "hv-b", Ready: true, Reason: "Reachable", Latency: 42 * time.Millisecond,
			Details: map[string]string{"user": "proxy", "pool": "default", "poolAvailableGiB": "120"}},
		{Target: "hv-a", Ready: false, Reason: "Unreachable", Message: "dial tcp 10.0.0.9:22: connection refused",
			Details: map[string]string{"user": "proxy", "pool": "default"}},
		{Target: "hv-c", Ready: true, Reason: "Reachable"},
	})
	rec := tracetest.NewSpanRecorder()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	m := &ProviderHealthMonitor{Client: shared.Client(t), Providers: map[string]provider.Provider{
		"ph-home": fake, "ph-slow": slowCheck{providertest.NewFake()}},
		Timeout: 300 * time.Millisecond, Log: logr.Discard(),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)),
		Clock:          controllertest.FuncClock(func() time.Time { return now })}
	for _, n := range []string{"ph-home", "ph-slow"} {
		_ = shared.Client(t).Delete(ctx, &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}

	start := time.Now()
	m.CheckAll(ctx)
	if el := time.Since(start); el > 2*time.Minute { // far past 300ms: a round that waits for the hung provider
		t.Errorf("a round with a hung provider took %v; the check timeout is 300ms", el)
	}

	ph := getPH(t, ctx, "ph-home") // created on the first round
	st := ph.Status
	if st.Ready != "2/3" || st.ReadyTargets != 2 || st.TotalTargets != 3 || st.LastChecked == nil || !st.LastChecked.Time.Equal(now) {
		t.Errorf("summary: ready %q %d/%d lastChecked %v", st.Ready, st.ReadyTargets, st.TotalTargets, st.LastChecked)
	}
	var order []string
	for _, tg := range st.Targets {
		order = append(order, tg.Name)
	}
	if len(order) != 3 || order[0] != "hv-b" || order[1] != "hv-a" || order[2] != "hv-c" {
		t.Fatalf("targets %v, want the provider's order hv-b, hv-a, hv-c", order)
	}
	b, a := st.Targets[0], st.Targets[1]
	if !b.Ready || b.Reason != "Reachable" || b.Latency.Duration != 42*time.Millisecond || b.Details["poolAvailableGiB"] != "120" || !b.LastChecked.Time.Equal(now) {
		t.Errorf("hv-b: %+v", b)
	}
	if a.Ready || a.Reason != "Unreachable" || a.Message != "dial tcp 10.0.0.9:22: connection refused" || a.Details["user"] != "proxy" {
		t.Errorf("hv-a: %+v", a)
	}
	slow := getPH(t, ctx, "ph-slow").Status
	if slow.Ready != "0/1" || slow.Targets[0].Reason != "Timeout" {
		t.Errorf("hung provider: %+v", slow)
	}

	for target, want := range map[string]float64{"hv-a": 0, "hv-b": 1, "hv-c": 1} {
		if got := testutil.ToFloat64(providerTargetUp.WithLabelValues("ph-home", target)); got != want {
			t.Errorf("proxy_operator_provider_target_up{provider=ph-home,target=%s} = %v, want %v", target, got, want)
		}
	}
	spans := map[string]bool{}
	for _, s := range rec.Ended() {
		if s.Name() != "providerhealth.check" {
			continue
		}
		for _, kv := range s.Attributes() {
			if kv.Key == "provider" {
				spans[kv.Value.AsString()] = true
			}
		}
	}
	if !spans["ph-home"] || !spans["ph-slow"] {
		t.Errorf("providerhealth.check spans for %v, want ph-home and ph-slow", spans)
	}

	// hv-a recovers, hv-c leaves the config: the object follows, the gauge drops hv-c.
	fake.SetCheckResult([]provider.TargetStatus{{Target: "hv-b", Ready: true}, {Target: "hv-a", Ready: true}})
	now = now.Add(time.Minute)
	m.CheckAll(ctx)
	st = getPH(t, ctx, "ph-home").Status
	if st.Ready != "2/2" || len(st.Targets) != 2 || !st.Targets[1].Ready || !st.LastChecked.Time.Equal(now) {
		t.Errorf("second round: %+v", st)
	}
	if len(st.Targets[0].Details) != 0 || st.Targets[1].Message != "" {
		t.Errorf("second round: fields the monitor no longer reports are still there: %+v", st.Targets)
	}
	if owners := testenv.StatusManagers(getPH(t, ctx, "ph-home")); len(owners) != 1 || owners["providerhealth"] == "" {
		t.Errorf("status written by %v, want the providerhealth field manager alone", owners)
	}
	if got := testutil.ToFloat64(providerTargetUp.WithLabelValues("ph-home", "hv-a")); got != 1 {
		t.Errorf("hv-a gauge %v after recovery", got)
	}
	if n := testutil.CollectAndCount(providerTargetUp, "proxy_operator_provider_target_up"); n != 3 {
		t.Errorf("%d gauge series, want 3 (ph-home hv-a and hv-b, ph-slow hv-slow): hv-c's series should be gone", n)
	}
}

// The object is recreated when someone deletes it.
func TestProviderHealthRecreated(t *testing.T) {
	ctx := testContext(t)
	m := &ProviderHealthMonitor{Client: shared.Client(t), Providers: map[string]provider.Provider{"ph-re": providertest.NewFake()}, Log: logr.Discard()}
	m.CheckAll(ctx)
	if err := shared.Client(t).Delete(ctx, getPH(t, ctx, "ph-re")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "providerhealth ph-re to be deleted", func() (bool, error) {
		err := shared.Client(t).Get(ctx, client.ObjectKey{Name: "ph-re"}, &v1alpha1.ProviderHealth{})
		return apierrors.IsNotFound(err), err
	})
	m.CheckAll(ctx)
	if st := getPH(t, ctx, "ph-re").Status; st.Ready != "1/1" || st.Targets[0].Name != "fake" {
		t.Errorf("recreated: %+v", st)
	}
}

// A provider taken out of the providers config leaves its ProviderHealth behind until
// the monitor starts again: Start removes it (trying again on the next round when the
// listing fails), and leaves the configured providers' objects in place.
func TestProviderHealthOfRemovedProviderDeleted(t *testing.T) {
	ctx := testContext(t)
	uids := map[string]types.UID{}
	for _, n := range []string{"ph-kept", "ph-removed-1", "ph-removed-2"} {
		_ = shared.Client(t).Delete(ctx, &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: n}})
		waitFor(t, waitLong, "providerhealth "+n+" to be gone before the test", func() (bool, error) {
			err := shared.Client(t).Create(ctx, &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: n}})
			return err == nil, err
		})
		uids[n] = getPH(t, ctx, n).UID
	}

	var lists atomic.Int32
	c := interceptor.NewClient(controllertest.NoWatch{Client: shared.Client(t)}, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*v1alpha1.ProviderHealthList); ok && lists.Add(1) == 1 {
				return apierrors.NewServiceUnavailable("the first listing fails")
			}
			return c.List(ctx, list, opts...)
		},
	})
	fake := providertest.NewFake()
	m := &ProviderHealthMonitor{Client: c, Providers: map[string]provider.Provider{"ph-kept": fake},
		Interval: 50 * time.Millisecond, Log: logr.Discard()}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Start(mctx) }()
	defer func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Start returned %v", err)
			}
		case <-time.After(waitLong):
			t.Errorf("Start still running %v after its context ended", waitLong)
		}
	}()

	for _, n := range []string{"ph-removed-1", "ph-removed-2"} {
		waitFor(t, waitLong, "providerhealth "+n+" of an unconfigured provider to be deleted", func() (bool, error) {
			err := shared.Client(t).Get(ctx, client.ObjectKey{Name: n}, &v1alpha1.ProviderHealth{})
			return apierrors.IsNotFound(err), err
		})
	}
	if n := lists.Load(); n != 2 {
		t.Errorf("%d listings, want 2: the failed one and its retry on the next round", n)
	}
	waitFor(t, waitLong, "ph-kept to be checked", func() (bool, error) {
		return getPH(t, ctx, "ph-kept").Status.Ready == "1/1", nil
	})
	if ph := getPH(t, ctx, "ph-kept"); ph.UID != uids["ph-kept"] {
		t.Errorf("ph-kept was deleted and recreated (uid %s, was %s)", ph.UID, uids["ph-kept"])
	}

	// Once removed, the monitor does not look again while it runs: the config cannot
	// change under a running process, so a later object is not its to remove.
	if err := shared.Client(t).Create(ctx, &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: "ph-removed-1"}}); err != nil {
		t.Fatal(err)
	}
	checks := fake.CountOf(providertest.OpCheck)
	waitFor(t, waitLong, "two more rounds", func() (bool, error) {
		return fake.CountOf(providertest.OpCheck) >= checks+2, nil
	})
	getPH(t, ctx, "ph-removed-1")
	if n := lists.Load(); n != 2 {
		t.Errorf("%d listings after the removal succeeded, want no more than 2", n)
	}
	if err := shared.Client(t).Delete(ctx, &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: "ph-removed-1"}}); err != nil {
		t.Error(err)
	}
}

// The monitor publishes the RemediationAllowed condition its Remediation func gives with
// each round: its transition time moves only when its status does, and a round whose
// func fails keeps the condition the object has.
func TestProviderHealthPublishesRemediationAllowed(t *testing.T) {
	ctx := testContext(t)
	const name = "ph-brake"
	_ = shared.Client(t).Delete(ctx, &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: name}})
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC).Truncate(time.Second)
	var give metav1.Condition
	var fail error
	m := &ProviderHealthMonitor{Client: shared.Client(t), Providers: map[string]provider.Provider{name: providertest.NewFake()},
		Log: logr.Discard(), Clock: controllertest.FuncClock(func() time.Time { return now }),
		Remediation: func(_ context.Context, p string, at time.Time) (metav1.Condition, error) {
			if p != name || !at.Equal(now) {
				t.Errorf("Remediation(%q, %v), want (%q, %v)", p, at, name, now)
			}
			return give, fail
		}}
	cond := func(round string) metav1.Condition {
		t.Helper()
		for _, c := range getPH(t, ctx, name).Status.Conditions {
			if c.Type == common.ConditionRemediationAllowed {
				return c
			}
		}
		t.Fatalf("%s: no %s condition on ProviderHealth %s", round, common.ConditionRemediationAllowed, name)
		return metav1.Condition{}
	}
	held := metav1.Condition{Type: common.ConditionRemediationAllowed, Status: metav1.ConditionFalse, Reason: "TooManyUnhealthy",
		Message: "standalone proxies of provider/ph-brake: 3 of 5 unhealthy, more than 2: remediation held"}
	give = held
	m.CheckAll(ctx)
	if c := cond("engaged"); c.Status != metav1.ConditionFalse || c.Message != held.Message || !c.LastTransitionTime.Time.Equal(now) {
		t.Errorf("engaged: %+v", c)
	}
	engagedAt := now

	// A later round with the same status and new counts keeps the transition time.
	now = now.Add(time.Minute)
	give.Message = "standalone proxies of provider/ph-brake: 4 of 5 unhealthy, more than 2: remediation held"
	m.CheckAll(ctx)
	if c := cond("still held"); c.Message != give.Message || !c.LastTransitionTime.Time.Equal(engagedAt) {
		t.Errorf("still held: %+v, want the new message and the transition at %v", c, engagedAt)
	}

	// A round whose func fails keeps the condition as it is.
	now = now.Add(time.Minute)
	fail = errors.New("listing proxies: the cache is not synced")
	m.CheckAll(ctx)
	if c := cond("func failed"); c.Status != metav1.ConditionFalse || c.Message != give.Message {
		t.Errorf("after a failed round: %+v, want the condition kept", c)
	}

	// Released.
	now, fail = now.Add(time.Minute), nil
	give = metav1.Condition{Type: common.ConditionRemediationAllowed, Status: metav1.ConditionTrue, Reason: common.PoolReasonWithinMaxUnhealthy,
		Message: "standalone proxies of provider/ph-brake: 1 of 5 unhealthy, at most 2: remediation allowed"}
	m.CheckAll(ctx)
	if c := cond("released"); c.Status != metav1.ConditionTrue || !c.LastTransitionTime.Time.Equal(now) {
		t.Errorf("released: %+v", c)
	}
}
