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

// The ProxyPool tests run on the package's API server (shared), each in a namespace and
// a manager of its own (controllertest.PoolEnv): the Proxy reconciler on the fake
// provider, the pool reconciler on a fake clock, and the health engine's stand-in.

// poolEnv is controllertest.PoolEnv with the pool tests' own helpers.
type poolEnv struct{ *controllertest.PoolEnv }

// poolEnvConfig is what newPoolEnv's options change.
type poolEnvConfig struct {
	proxyWorkers int
	healthEvery  time.Duration
	requests     *atomic.Int64
	setupProxy   func(*proxy.ProxyReconciler, *clocktesting.FakeClock)
}

// poolEnvOption changes newPoolEnv's defaults: 10 Proxy reconciles at once, the health
// loop every 20 ms, no request counting.
type poolEnvOption func(*poolEnvConfig)

// withProxyWorkers runs n Proxy reconciles at once and the health loop every
// healthEvery; with n 0, neither (the pool reconciler alone).
func withProxyWorkers(n int, healthEvery time.Duration) poolEnvOption {
	return func(c *poolEnvConfig) { c.proxyWorkers, c.healthEvery = n, healthEvery }
}

// countingRequests makes the manager's client and the pool's live reader count, in
// requests, every request they send to the API server.
func countingRequests(requests *atomic.Int64) poolEnvOption {
	return func(c *poolEnvConfig) { c.requests = requests }
}

// withProxySetup calls setup with the Proxy reconciler and the fake clock before the
// reconciler is set up.
func withProxySetup(setup func(*proxy.ProxyReconciler, *clocktesting.FakeClock)) poolEnvOption {
	return func(c *poolEnvConfig) { c.setupProxy = setup }
}

// newPoolEnv starts, on env, a namespace and a manager running the Proxy and pool
// reconcilers and the health loop, as opts say.
func newPoolEnv(t testing.TB, env *testenv.Env, opts ...poolEnvOption) *poolEnv {
	t.Helper()
	cfg := poolEnvConfig{proxyWorkers: 10, healthEvery: 20 * time.Millisecond}
	for _, o := range opts {
		o(&cfg)
	}
	var mutate func(*ctrl.Options)
	if cfg.requests != nil {
		mutate = func(o *ctrl.Options) { o.NewClient = countingNewClient(cfg.requests) }
	}
	if cfg.proxyWorkers <= 0 {
		cfg.healthEvery = 0
	}
	e := controllertest.NewPoolEnv(t, env, cfg.healthEvery, mutate, func(mgr ctrl.Manager, e *controllertest.PoolEnv) {
		pr := &proxy.ProxyReconciler{
			Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorder("proxy-controller"),
			Providers: map[string]provider.Provider{testProvider: e.Fake, "other-home": e.Fake}, QuotaRetry: time.Hour,
		}
		if cfg.setupProxy != nil {
			cfg.setupProxy(pr, e.Clock)
		}
		if cfg.proxyWorkers > 0 {
			if err := pr.SetupWithManager(mgr, cfg.proxyWorkers); err != nil {
				t.Fatalf("setting up the proxy reconciler: %v", err)
			}
		}
		r := &ProxyPoolReconciler{
			Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorder("proxypool-controller"),
			Zones: controllertest.PoolZones, Clock: e.Clock,
		}
		if cfg.requests != nil {
			reader, err := client.New(countingConfig(mgr.GetConfig(), cfg.requests), client.Options{Scheme: mgr.GetScheme()})
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

// TestProxyPool runs the pool's API-server stories on the package's API server.
// UpgradeRolls changes the rendering of every Proxy reconciler in the process
// (controllertest.UpgradeRendering), so it runs first and alone; the others then run in
// parallel, each in its own namespace with its own manager, fake provider and fake clock,
// and no top-level parallel test runs until this one is done (it is not parallel itself).
func TestProxyPool(t *testing.T) {
	env := shared.Env(t)
	t.Run("UpgradeRolls", func(t *testing.T) { testPoolUpgradeRolls(t, env) })
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *testenv.Env)
	}{
		{"EndpointSliceShards", testPoolSliceShards}, // the longest: started first
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
		{"EndpointSlice", testPoolEndpointSlice},
		{"Metrics", testPoolMetrics},
		{"EgressIdentities", testPoolEgressIdentities},
		{"WireGuardAssignment", testPoolWireGuardAssignment},
		{"WireGuardNoMatch", testPoolWireGuardNoMatch},
		{"WireGuardDeleteFirst", testPoolWireGuardDeleteFirst},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, env)
		})
	}
}
