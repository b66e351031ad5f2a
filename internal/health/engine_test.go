package health

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

type health struct {
	phase    v1alpha1.ProxyPhase
	healthy  bool
	cond     metav1.ConditionStatus
	failures int32
}

// shown is the phase a user sees once the Proxy reconciler (which these tests do not run)
// has settled Running against Ready from what the engine recorded.
func shown(px *v1alpha1.Proxy) v1alpha1.ProxyPhase {
	if px.Status.Phase != v1alpha1.PhaseRunning && px.Status.Phase != v1alpha1.PhaseReady {
		return px.Status.Phase
	}
	if px.ProbedHealthy() {
		return v1alpha1.PhaseReady
	}
	return v1alpha1.PhaseRunning
}

func observe(px *v1alpha1.Proxy) health {
	h := health{shown(px), px.Status.Healthy, "", px.Status.ConsecutiveProbeFailures}
	if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy); c != nil {
		h.cond = c.Status
	}
	return h
}

// A Managed proxy becomes Ready on the first good probe, survives two lost probes in
// Ready, drops to Running on the third, and comes back; the reconciler's fields survive.
func TestEngineTransitionsWithoutFlapping(t *testing.T) {
	e := newEngineEnv(t, nil)
	fp := healthtest.New(t, "127.0.0.3")
	e.proxyAt("m", v1alpha1.ProxyModeManaged, fp.Host, fp.Port, v1alpha1.PhaseRunning)
	okBefore := testutil.ToFloat64(probesTotal.WithLabelValues("success", "fake-home"))
	badBefore := testutil.ToFloat64(probesTotal.WithLabelValues("failure", "fake-home"))

	if st := e.round(); st.Probed != 1 || st.Succeeded != 1 || st.WriteErrors != 0 {
		t.Fatalf("first round: %+v", st)
	}
	px := e.get("m")
	if got := observe(px); got != (health{v1alpha1.PhaseReady, true, metav1.ConditionTrue, 0}) {
		t.Fatalf("after a good probe: %+v", got)
	}
	if f := testenv.StatusManagers(px)["proxy-health"]; !strings.Contains(f, `"f:healthy"`) || !strings.Contains(f, `"f:lastProbeTime"`) {
		t.Errorf("status managers %v: the probe result is not the proxy-health field manager's", testenv.StatusManagers(px))
	}
	if px.Status.EgressIP != "127.0.0.3" {
		t.Errorf("egressIP %q, want the proxy's outgoing address 127.0.0.3", px.Status.EgressIP)
	}
	if px.Status.ProbeLatencyMilliseconds < 1 || px.Status.LastProbeTime == nil {
		t.Errorf("latency %d, lastProbeTime %v", px.Status.ProbeLatencyMilliseconds, px.Status.LastProbeTime)
	}
	e.waitEvent("m", v1alpha1.ReasonProbeSucceeded, 1)

	// Lost probes below the threshold change nothing a user sees: no status write (the
	// engine counts them itself).
	fp.SetMode(healthtest.Fail)
	rv := px.ResourceVersion
	for i := int32(1); i <= 2; i++ {
		if st := e.round(); st.Writes != 0 {
			t.Errorf("after %d failed probe(s): %d writes, want none", i, st.Writes)
		}
		px := e.get("m")
		if got := observe(px); got != (health{v1alpha1.PhaseReady, true, metav1.ConditionTrue, 0}) || px.ResourceVersion != rv {
			t.Fatalf("after %d failed probe(s): %+v at version %s (was %s); one lost probe must not take it out of rotation",
				i, got, px.ResourceVersion, rv)
		}
	}
	e.round()
	px = e.get("m")
	if got := observe(px); got != (health{v1alpha1.PhaseRunning, false, metav1.ConditionFalse, 3}) {
		t.Fatalf("after 3 failed probes: %+v", got)
	}
	c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy)
	if c.Reason != v1alpha1.ReasonProbeFailed || !contains(c.Message, "502") {
		t.Errorf("Healthy condition %+v: want reason ProbeFailed and the proxy's answer", c)
	}
	e.waitEvent("m", v1alpha1.ReasonProbeFailed, 1)

	fp.SetMode(healthtest.Forward)
	e.round()
	px = e.get("m")
	if got := observe(px); got != (health{v1alpha1.PhaseReady, true, metav1.ConditionTrue, 0}) {
		t.Fatalf("after recovery: %+v", got)
	}
	if p := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned); p == nil || p.Reason != v1alpha1.ReasonInstanceRunning {
		t.Errorf("the reconciler's Provisioned condition was lost: %+v", px.Status.Conditions)
	}
	if px.Status.ProviderID != "fake/m" || px.Status.IP != fp.Host {
		t.Errorf("the reconciler's fields changed: %+v", px.Status)
	}
	if d := testutil.ToFloat64(probesTotal.WithLabelValues("success", "fake-home")) - okBefore; d != 2 {
		t.Errorf("probes_total{result=success} rose by %v, want 2", d)
	}
	if d := testutil.ToFloat64(probesTotal.WithLabelValues("failure", "fake-home")) - badBefore; d != 3 {
		t.Errorf("probes_total{result=failure} rose by %v, want 3", d)
	}
}

// External proxies are probed like Managed ones; proxies the reconciler has not
// published (or is replacing, or has failed) are not probed at all.
func TestEngineProbesExternalAndOnlyRunningOrReady(t *testing.T) {
	e := newEngineEnv(t, nil)
	ext := healthtest.New(t, "127.0.0.4")
	e.proxyAt("ext", v1alpha1.ProxyModeExternal, ext.Host, ext.Port, v1alpha1.PhaseRunning)
	skipped := healthtest.New(t, "")
	for _, ph := range []v1alpha1.ProxyPhase{v1alpha1.PhaseProvisioning, v1alpha1.PhaseFailed, v1alpha1.PhasePending} {
		e.proxyAt("p-"+strings.ToLower(string(ph)), v1alpha1.ProxyModeManaged, skipped.Host, skipped.Port, ph)
	}
	if st := e.round(); st.Probed != 1 {
		t.Errorf("probed %d proxies, want only the External one", st.Probed)
	}
	px := e.get("ext")
	if shown(px) != v1alpha1.PhaseReady || !px.Status.Healthy || px.Status.EgressIP != "127.0.0.4" {
		t.Errorf("external proxy: %+v", px.Status)
	}
	if n := skipped.Requests.Load(); n != 0 {
		t.Errorf("proxies outside Running/Ready got %d probes", n)
	}
	for _, name := range []string{"p-provisioning", "p-failed", "p-pending"} {
		if s := e.get(name).Status; s.LastProbeTime != nil || s.Healthy {
			t.Errorf("%s was touched: %+v", name, s)
		}
	}
}

// A healthy proxy that the reconciler takes back to Provisioning (a replacement) is not
// probed, and no longer shows as healthy; its phase stays the reconciler's.
func TestEngineClearsHealthOutsideRunning(t *testing.T) {
	e := newEngineEnv(t, nil)
	fp := healthtest.New(t, "")
	e.proxyAt("re", v1alpha1.ProxyModeManaged, fp.Host, fp.Port, v1alpha1.PhaseRunning)
	e.round()
	px := e.get("re")
	if !px.Status.Healthy {
		t.Fatalf("not healthy after a good probe: %+v", px.Status)
	}
	px.Status.Phase = v1alpha1.PhaseProvisioning
	if err := e.c.Status().Update(e.ctx, px); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "the engine's cache to see the proxy Provisioning", func() (bool, error) {
		cached := &v1alpha1.Proxy{}
		err := e.mgr.GetClient().Get(e.ctx, client.ObjectKeyFromObject(px), cached)
		return err == nil && cached.Status.Phase == v1alpha1.PhaseProvisioning, err
	})
	e.round()
	s := e.get("re").Status
	if s.Healthy {
		t.Fatalf("still healthy while Provisioning: %+v", s)
	}
	c := meta.FindStatusCondition(s.Conditions, v1alpha1.ConditionHealthy)
	if s.Phase != v1alpha1.PhaseProvisioning || c.Status != metav1.ConditionFalse || c.Reason != ReasonNotProbed {
		t.Errorf("phase %s, Healthy %+v", s.Phase, c)
	}
	if n := fp.Requests.Load(); n != 1 {
		t.Errorf("%d probes; the Provisioning proxy must not be probed", n)
	}
}

// A round of many proxies probes them concurrently, and a probe that hangs ends at the
// timeout. Concurrency is shown without a clock: with a timeout no test waits out, all
// eight hanging probes reach their proxies at once, which probes run one after another
// never could; closing the proxies then ends the round.
func TestEngineTimeoutAndConcurrency(t *testing.T) {
	e := newEngineEnv(t, func(o *Options) { o.Timeout = time.Hour; o.Concurrency = 8 })
	var fps []*healthtest.ForwardProxy
	for i := 0; i < 8; i++ {
		fp := healthtest.New(t, "")
		fp.SetMode(healthtest.Hang)
		fps = append(fps, fp)
		e.proxyAt("hang-"+string(rune('a'+i)), v1alpha1.ProxyModeManaged, fp.Host, fp.Port, v1alpha1.PhaseRunning)
	}
	done := make(chan RoundStats, 1)
	go func() { st, _ := e.engine.Round(e.ctx); done <- st }()
	end := sync.OnceValue(func() RoundStats { // closing the proxies ends their probes
		for _, fp := range fps {
			fp.Close()
		}
		return <-done
	})
	t.Cleanup(func() { end() }) // the round is over before the test, whatever happens
	waitFor(t, waitLong, "all 8 hanging probes in flight at once (concurrency 8)", func() (bool, error) {
		for _, fp := range fps {
			if fp.Requests.Load() == 0 {
				return false, nil
			}
		}
		return true, nil
	})
	if st := end(); st.Failed != 8 {
		t.Fatalf("round: %+v", st)
	}

	e.engine.opts.Timeout = 2 * time.Second
	fp := healthtest.New(t, "")
	fp.SetMode(healthtest.Hang)
	e.proxyAt("hang-timeout", v1alpha1.ProxyModeManaged, fp.Host, fp.Port, v1alpha1.PhaseRunning)
	if st := e.round(); st.Failed != 9 {
		t.Fatalf("round with the 2s timeout: %+v", st)
	}
	c := meta.FindStatusCondition(e.get("hang-timeout").Status.Conditions, v1alpha1.ConditionHealthy)
	if c == nil || c.Status != metav1.ConditionFalse || !contains(c.Message, "deadline") {
		t.Errorf("a never-healthy proxy should say why at once: %+v", c)
	}
}

// staleLister hands the engine the Proxies as they were when captured, like a cache that
// has not seen the reconciler's latest write yet.
type staleLister struct {
	client.Client
	list v1alpha1.ProxyList
}

func (s *staleLister) List(_ context.Context, l client.ObjectList, _ ...client.ListOption) error {
	s.list.DeepCopyInto(l.(*v1alpha1.ProxyList))
	return nil
}

// The reconciler moves a Ready proxy to Provisioning (replacing its instance) while a
// probe is in flight: the engine's write conflicts, and it does not put Ready back.
func TestEngineDoesNotOverwriteReconcilerPhase(t *testing.T) {
	e := newEngineEnv(t, nil)
	fp := healthtest.New(t, "")
	e.proxyAt("r", v1alpha1.ProxyModeManaged, fp.Host, fp.Port, v1alpha1.PhaseRunning)
	stale := &staleLister{Client: e.c}
	if err := e.c.List(e.ctx, &stale.list, client.InNamespace(e.ns)); err != nil {
		t.Fatal(err)
	}
	px := e.get("r")
	px.Status.Phase = v1alpha1.PhaseProvisioning
	px.Status.Message = "replacing the instance"
	if err := e.c.Status().Update(e.ctx, px); err != nil {
		t.Fatal(err)
	}
	eng, err := New(stale, e.c, nil, e.engine.opts, e.engine.log)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Round(e.ctx); err != nil {
		t.Fatal(err)
	}
	if fp.Requests.Load() != 1 {
		t.Fatalf("the stale Running proxy was not probed")
	}
	if s := e.get("r").Status; s.Phase != v1alpha1.PhaseProvisioning || s.Healthy || s.Message != "replacing the instance" {
		t.Errorf("the engine overwrote the reconciler's write: %+v", s)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// A round cut short by shutdown (or a lost lease) does not count the cancelled probes
// as the proxies' failures.
func TestEngineShutdownIsNotAFailure(t *testing.T) {
	e := newEngineEnv(t, func(o *Options) { o.Timeout = time.Hour }) // only the cancel ends the probe
	fp := healthtest.New(t, "")
	fp.SetMode(healthtest.Hang)
	e.proxyAt("s", v1alpha1.ProxyModeManaged, fp.Host, fp.Port, v1alpha1.PhaseReady)
	failuresBefore := testutil.ToFloat64(probesTotal.WithLabelValues("failure", "fake-home"))
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	round := make(chan error, 1)
	go func() {
		_, err := e.engine.Round(ctx)
		round <- err
	}()
	waitFor(t, waitLong, "the probe to reach the hanging proxy", func() (bool, error) {
		return fp.Requests.Load() > 0, errors.New("no request at the proxy yet")
	})
	cancel()
	if err := <-round; err == nil {
		t.Error("a cancelled round reported no error")
	}
	if s := e.get("s").Status; s.ConsecutiveProbeFailures != 0 || s.LastProbeTime != nil {
		t.Errorf("the cancelled probe was recorded: %+v", s)
	}
	if d := testutil.ToFloat64(probesTotal.WithLabelValues("failure", "fake-home")) - failuresBefore; d != 0 {
		t.Errorf("the cancelled probe counted as %v failure(s) in proxy_operator_proxy_probes_total", d)
	}
}
