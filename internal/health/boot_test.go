package health

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
)

// startWatching runs an engine on the env's manager with Informers set and rounds an
// hour apart, so that only the probes on turning Running can reach a proxy after the
// first round. It returns once the first round has run: a sentinel proxy, Running when
// the engine starts, is Ready.
func (e *engineEnv) startWatching(mutate func(*Options)) *Engine {
	e.t.Helper()
	sentinel := healthtest.New(e.t, "")
	e.proxyAt("first-round", v1alpha1.ProxyModeManaged, sentinel.Host, sentinel.Port, v1alpha1.PhaseRunning)
	opts := e.engine.opts
	opts.Interval, opts.Informers = time.Hour, e.mgr.GetCache()
	if mutate != nil {
		mutate(&opts)
	}
	eng, err := New(e.mgr.GetClient(), e.mgr.GetAPIReader(), e.mgr.GetEventRecorder("proxy-health"), opts, e.mgr.GetLogger())
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- eng.Start(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("engine: %v", err)
		}
	})
	waitFor(e.t, waitLong, "the engine's first round (proxy first-round Ready)", func() (bool, error) {
		return shown(e.get("first-round")) == v1alpha1.PhaseReady, nil
	})
	return eng
}

// setPhase writes phase to the Proxy's status, as the reconciler would.
func (e *engineEnv) setPhase(name string, phase v1alpha1.ProxyPhase) {
	e.t.Helper()
	px := e.get(name)
	px.Status.Phase = phase
	if err := e.c.Status().Update(e.ctx, px); err != nil {
		e.t.Fatalf("setting phase %s on proxy %s: %v", phase, name, err)
	}
}

// TestEngineProbesOnRunning: a Proxy turning Running is probed at once, and becomes
// Ready, without waiting for the next round (an hour away here).
func TestEngineProbesOnRunning(t *testing.T) {
	e := newEngineEnv(t, nil)
	fp := healthtest.New(t, "127.0.0.5")
	e.proxyAt("boot", v1alpha1.ProxyModeManaged, fp.Host, fp.Port, v1alpha1.PhaseProvisioning)
	e.startWatching(nil)

	e.setPhase("boot", v1alpha1.PhaseRunning)
	running := time.Now()
	var px *v1alpha1.Proxy
	waitFor(t, waitLong, "proxy boot to be Ready", func() (bool, error) {
		px = e.get("boot")
		return shown(px) == v1alpha1.PhaseReady && px.Status.Healthy, nil
	})
	took := time.Since(running)
	if px.Status.EgressIP != "127.0.0.5" || fp.Requests.Load() != 1 {
		t.Errorf("egress IP %q after %d probes; want one probe, through the proxy", px.Status.EgressIP, fp.Requests.Load())
	}
	t.Logf("Running -> Ready in %s", took.Round(time.Millisecond))

	// Another instance while Running (a new providerID) is a new target: probed at once.
	px.Status.Phase, px.Status.ProviderID = v1alpha1.PhaseRunning, "fake/boot-2"
	if err := e.c.Status().Update(e.ctx, px); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "the new instance to be probed and the proxy Ready again", func() (bool, error) {
		px = e.get("boot")
		return fp.Requests.Load() == 2 && shown(px) == v1alpha1.PhaseReady, nil
	})
}

// TestEngineReprobesBootingProxy: a Proxy whose proxy does not answer yet when it turns
// Running (the guest still starting its proxy) is probed again every BootProbeInterval
// until it answers, then no more until the rounds; one that never answers is left to
// the rounds after BootProbeWindow.
func TestEngineReprobesBootingProxy(t *testing.T) {
	e := newEngineEnv(t, nil)
	fp := healthtest.New(t, "")
	fp.SetMode(healthtest.Fail)
	late := healthtest.New(t, "")
	late.SetMode(healthtest.Fail)
	e.proxyAt("late", v1alpha1.ProxyModeManaged, fp.Host, fp.Port, v1alpha1.PhaseProvisioning)
	e.proxyAt("never", v1alpha1.ProxyModeManaged, late.Host, late.Port, v1alpha1.PhaseProvisioning)
	e.startWatching(func(o *Options) { o.BootProbeInterval, o.BootProbeWindow = 100*time.Millisecond, 3*time.Second })

	e.setPhase("late", v1alpha1.PhaseRunning)
	e.setPhase("never", v1alpha1.PhaseRunning)
	waitFor(t, waitLong, "three failed probes of proxy late", func() (bool, error) { return fp.Requests.Load() >= 3, nil })
	if px := e.get("late"); shown(px) != v1alpha1.PhaseRunning || px.Status.Healthy {
		t.Fatalf("after failed probes: %+v", px.Status)
	}
	fp.SetMode(healthtest.Forward)
	waitFor(t, waitLong, "proxy late to be Ready once its proxy answers", func() (bool, error) {
		px := e.get("late")
		return shown(px) == v1alpha1.PhaseReady && px.Status.Healthy, nil
	})
	answered := fp.Requests.Load()

	// "never" is given up after the window: its probes stop.
	waitFor(t, waitLong, "the boot probes of proxy never to stop", func() (bool, error) {
		before := late.Requests.Load()
		time.Sleep(500 * time.Millisecond) // five boot intervals without a probe
		return late.Requests.Load() == before, nil
	})
	if n := late.Requests.Load(); n < 10 {
		t.Errorf("proxy never got %d probes in its 3 s window at 100 ms; want about 30", n)
	}
	if n := fp.Requests.Load(); n != answered {
		t.Errorf("proxy late was probed %d more times after its good probe; the rounds take over then", n-answered)
	}
	if s := e.get("never").Status; s.Healthy || s.Phase != v1alpha1.PhaseRunning {
		t.Errorf("proxy never: %+v", s)
	}
	var px v1alpha1.Proxy
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: "never"}, &px); err != nil || px.Status.ConsecutiveProbeFailures < e.engine.opts.FailureThreshold {
		t.Errorf("proxy never: %d consecutive failures recorded (%v); want the threshold crossed", px.Status.ConsecutiveProbeFailures, err)
	}
}
