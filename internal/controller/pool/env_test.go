package pool

import (
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// The ProxyPool tests start an API server of their own through testenv (one for all of
// them, in TestProxyPool) rather than sharing the package's, and run, in one manager per
// test (controllertest.PoolEnv): the Proxy reconciler on the fake provider, the pool
// reconciler on a fake clock, and the health engine's stand-in.

// poolEnv is controllertest.PoolEnv with the pool tests' own helpers.
type poolEnv struct{ *controllertest.PoolEnv }

func newPoolEnv(t testing.TB, env *testenv.Env) *poolEnv {
	t.Helper()
	return newPoolEnvWith(t, env, 10, 20*time.Millisecond)
}

// newPoolEnvWith runs proxyWorkers Proxy reconciles at once and the health loop every
// healthEvery; with proxyWorkers 0, neither (the pool reconciler alone).
func newPoolEnvWith(t testing.TB, env *testenv.Env, proxyWorkers int, healthEvery time.Duration) *poolEnv {
	t.Helper()
	return newPoolEnvCounting(t, env, proxyWorkers, healthEvery, nil)
}

// newPoolEnvCounting is newPoolEnvWith whose manager's client and the pool's live reader
// count, in requests (when not nil), every request they send to the API server.
func newPoolEnvCounting(t testing.TB, env *testenv.Env, proxyWorkers int, healthEvery time.Duration, requests *atomic.Int64) *poolEnv {
	t.Helper()
	return newPoolEnvProxy(t, env, proxyWorkers, healthEvery, requests, nil)
}

// newPoolEnvProxy is newPoolEnvCounting that calls setupProxy, when not nil, with the
// Proxy reconciler and the fake clock before the reconciler is set up.
func newPoolEnvProxy(t testing.TB, env *testenv.Env, proxyWorkers int, healthEvery time.Duration, requests *atomic.Int64,
	setupProxy func(*proxy.ProxyReconciler, *clocktesting.FakeClock)) *poolEnv {
	t.Helper()
	var mutate func(*ctrl.Options)
	if requests != nil {
		mutate = func(o *ctrl.Options) { o.NewClient = countingNewClient(requests) }
	}
	if proxyWorkers <= 0 {
		healthEvery = 0
	}
	e := controllertest.NewPoolEnv(t, env, healthEvery, mutate, func(mgr ctrl.Manager, e *controllertest.PoolEnv) {
		pr := &proxy.ProxyReconciler{
			Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorder("proxy-controller"),
			Providers: map[string]provider.Provider{testProvider: e.Fake, "other-home": e.Fake}, QuotaRetry: time.Hour,
		}
		if setupProxy != nil {
			setupProxy(pr, e.Clock)
		}
		if proxyWorkers > 0 {
			if err := pr.SetupWithManager(mgr, proxyWorkers); err != nil {
				t.Fatalf("setting up the proxy reconciler: %v", err)
			}
		}
		r := &ProxyPoolReconciler{
			Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorder("proxypool-controller"),
			Zones: controllertest.PoolZones, Clock: e.Clock,
		}
		if requests != nil {
			reader, err := client.New(countingConfig(mgr.GetConfig(), requests), client.Options{Scheme: mgr.GetScheme()})
			if err != nil {
				t.Fatalf("creating the counting live reader: %v", err)
			}
			r.APIReader = reader
		}
		if err := r.SetupWithManager(mgr); err != nil {
			t.Fatalf("setting up the pool reconciler: %v", err)
		}
	})
	return &poolEnv{e}
}

// TestProxyPool runs the pool's API-server tests against one API server of their own.
func TestProxyPool(t *testing.T) {
	env := testenv.StartT(t)
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *testenv.Env)
	}{
		{"Validation", testPoolValidation},
		{"Defaults", testPoolDefaults},
		{"Sample", testPoolSample},
		{"Children", testPoolChildren},
		{"Scale", testPoolScale},
		{"Rollout", testPoolRollout},
		{"Rotation", testPoolRotation},
		{"Failed", testPoolFailed},
		{"Cordon", testPoolCordon},
		{"Deletion", testPoolDeletion},
		{"Placement", testPoolPlacement},
		{"NameLength", testPoolNameLength},
		{"StuckDeleting", testPoolStuckDeleting},
		{"NeverReady", testPoolNeverReady},
		{"RotationStuck", testPoolRotationStuck},
		{"ConfigOutdated", testPoolConfigOutdated},
		{"Credentials", testPoolCredentials},
		{"PasswordRotation", testPoolPasswordRotation},
		{"UpgradeRolls", testPoolUpgradeRolls},
		{"EndpointSlice", testPoolEndpointSlice},
		{"EndpointSliceShards", testPoolSliceShards},
		{"Metrics", testPoolMetrics},
		{"EgressIdentities", testPoolEgressIdentities},
		{"WireGuardAssignment", testPoolWireGuardAssignment},
		{"WireGuardNoMatch", testPoolWireGuardNoMatch},
		{"WireGuardDeleteFirst", testPoolWireGuardDeleteFirst},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, env) })
	}
}
