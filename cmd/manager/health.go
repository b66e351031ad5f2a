package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/access"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/orphangc"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/providerhealth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// setupHealth adds the provider health monitor, the proxy health engine and orphan GC
// (leader only) and the discovery API (every replica, with its readiness check) to mgr.
// wake is the reconciler's Wake: orphan GC calls it for the Failed Proxies an instance it
// deleted was blocking. creds reads a Proxy's basic-auth credentials, which the probe
// sends and discovery hands out on request (?credentials=true). It returns the discovery
// API's server (nil when it is off), whose drain run waits for. target is handed the
// health engine, which tells remediation whether the probe target itself is down.
// brake gives the monitor each provider's RemediationAllowed condition.
func setupHealth(mgr ctrl.Manager, providers map[string]provider.Provider, h healthOptions, wake func(context.Context, client.ObjectKey), creds proxyconfig.CredentialsFunc, target func(common.ProbeTargetWatch),
	brake func(context.Context, string, time.Time) (metav1.Condition, error)) (*listeningServer, error) {
	monitor := &providerhealth.ProviderHealthMonitor{
		Remediation: brake,
		Client:      mgr.GetClient(),
		APIReader:   mgr.GetAPIReader(),
		Providers:   providers,
		Interval:    h.ProviderCheckInterval,
		Timeout:     h.ProviderCheckTimeout,
		Log:         ctrl.Log.WithName("providerhealth"),
	}
	engine, err := health.New(mgr.GetClient(), mgr.GetAPIReader(), mgr.GetEventRecorder("proxy-health"),
		health.Options{ProbeURL: h.ProxyProbeURL, Interval: h.ProxyCheckInterval, HeartbeatInterval: h.StatusHeartbeat,
			Credentials: creds, Informers: mgr.GetCache(), BootProbeInterval: h.BootPollInterval,
			SkipTargetCheck: !h.ProbeTargetCheck, TargetCheckTimeout: health.DefaultTargetCheckTimeout, NoTargetEvents: h.NoTargetEvents,
			WireGuard: proxyconfig.SecretWireGuard{Reader: mgr.GetClient(), Metadata: mgr.GetAPIReader()}.WireGuard,
			Hint:      func(px *v1alpha1.Proxy) string { return provider.NeverAnsweredHint(providers[px.Spec.Provider]) }},
		ctrl.Log.WithName("health"))
	if err != nil {
		return nil, err
	}
	target(engine)
	gc := &orphangc.OrphanGC{
		Client:    mgr.GetClient(),
		Providers: providers,
		Interval:  h.GCInterval,
		Grace:     h.GCGrace,
		Wake:      wake,
		Log:       ctrl.Log.WithName("gc"),
	}
	for _, c := range []struct {
		name string
		r    manager.Runnable
	}{{"provider health monitor", monitor}, {"proxy health engine", engine}, {"orphan gc", gc}} {
		if err := mgr.Add(c.r); err != nil {
			return nil, fmt.Errorf("adding the %s: %w", c.name, err)
		}
	}
	if h.DiscoveryBindAddress == "0" || h.DiscoveryBindAddress == "" {
		return nil, nil
	}
	// Registering the informer here makes the cache start and sync it with the others.
	src, err := discovery.NewCacheSource(context.Background(), mgr.GetCache())
	if err != nil {
		return nil, err
	}
	tlsConfig, err := discoveryTLS(mgr, h.DiscoveryCertDir)
	if err != nil {
		return nil, err
	}
	if h.BanMaxCoolingPercent < 0 || h.BanMaxCoolingPercent > 100 {
		return nil, fmt.Errorf("--ban-max-cooling-percent %d: give 0 to 100", h.BanMaxCoolingPercent)
	}
	// Every replica takes feedback and writes it into the Proxies' status.cooldowns.
	feedback := &bans.Recorder{Client: mgr.GetClient(), Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
		Policy: banPolicy(h), UnreachableHoldoff: h.UnreachableHoldoff, Log: ctrl.Log.WithName("feedback")}
	if err := mgr.Add(feedback); err != nil {
		return nil, fmt.Errorf("adding the feedback recorder: %w", err)
	}
	// Picks are demand: each replica reports its picks per pool, and its refusals of picks
	// for pools at zero (wakes), in demand Leases of source kind discovery, in the demand
	// namespace.
	picks := &discovery.PickDemand{Reporter: demand.NewReporter(mgr.GetClient(), h.DemandNamespace, demand.KindDiscovery, "discovery-"+demand.PodName("manager")),
		Log: ctrl.Log.WithName("discovery-demand")}
	if err := mgr.Add(picks); err != nil {
		return nil, fmt.Errorf("adding discovery's demand reporter: %w", err)
	}
	srv, err := discovery.New(src, discovery.Options{
		Pools:             mgr.GetClient(),
		Demand:            picks,
		Addr:              h.DiscoveryBindAddress,
		TokenFile:         h.DiscoveryTokenFile,
		Access:            discoveryAccess(mgr, h.DiscoveryKubeAuth),
		Credentials:       creds,
		TLS:               tlsConfig,
		Feedback:          feedback,
		MaxCoolingPercent: h.BanMaxCoolingPercent,
		PoolBans:          discovery.PoolBansFrom(mgr.GetClient()),
		Log:               ctrl.Log.WithName("discovery"),
	})
	if err != nil {
		return nil, err
	}
	// Feedback taken up to the recorder's last flush is written: it stops taking more first.
	feedback.BeforeFinalFlush = srv.Drain
	return addDiscovery(mgr, srv, h.DiscoveryBindAddress, h.DiscoveryDrainDelay)
}

// discoveryAccess is what authenticates and authorizes Kubernetes callers of the
// discovery API, nil when --discovery-kubernetes-auth is off.
func discoveryAccess(mgr ctrl.Manager, on bool) *access.Access {
	if !on {
		return nil
	}
	return access.New(access.ClientReviewer{Client: mgr.GetClient()}, access.Options{})
}

// discoveryTLS is the discovery API's TLS configuration for the tls.crt and tls.key in
// dir, nil when dir is empty. The files are read at once, so a missing or broken pair
// stops the manager at start with its path; a certwatcher (added to mgr, on every
// replica) reloads them when they change, as the metrics server does with its own.
// HTTP/1.1 only, as on the metrics endpoint.
func discoveryTLS(mgr ctrl.Manager, dir string) (*tls.Config, error) {
	if dir == "" {
		return nil, nil
	}
	crt, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	w, err := certwatcher.New(crt, key)
	if err != nil {
		return nil, fmt.Errorf("--discovery-cert-dir %s: %w", dir, err)
	}
	if err := mgr.Add(w); err != nil {
		return nil, fmt.Errorf("adding the discovery certificate watcher: %w", err)
	}
	return &tls.Config{GetCertificate: w.GetCertificate, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}, nil
}

// banPolicy is the ban policy the flags give: standalone Proxies' and pools' defaults.
func banPolicy(h healthOptions) bans.Policy {
	return bans.Policy{Cooldown: h.BanCooldown, MaxCooldown: h.BanMaxCooldown,
		RetireAfterSites: h.BanRetireAfterSites, RetireWindow: h.BanRetireWindow}
}
