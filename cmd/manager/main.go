// Command manager runs the egress-proxies-operator: the Proxy reconciler and the
// components that check providers and proxies, collect orphans and serve discovery.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/autoscaler"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxybans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing/otlp"
)

// options are the manager's flags.
type options struct {
	providersConfig         string
	providersConfigGiven    bool // --providers-config was on the command line
	installID               string
	maxConcurrentReconciles int
	quotaRetry              time.Duration
	pendingRetry            time.Duration
	failedRecheck           time.Duration
	addressHold             time.Duration
	deletionDrain           time.Duration
	metricsAddr             string
	metricsSecure           bool
	metricsCertDir          string
	enableHTTP2             bool
	probeAddr               string
	leaderElect             bool
	autoscaler              bool
	leaderElectionNS        string
	// demandNamespaceFrom is where health.DemandNamespace came from, for the start log.
	demandNamespaceFrom string
	watchNamespaces     []string // nil: every namespace
	health              healthOptions
	// remediation is the policy of every Proxy's remediation: the timeouts of Proxies
	// without spec.remediation's and the brake of groups without a pool's maxUnhealthy.
	remediation remediation.Policy
	// probeTarget is the health engine's word on the probe target, set by setupHealth
	// for the pool reconciler (not a flag).
	probeTarget common.ProbeTargetWatch
	zap         zap.Options
}

// healthOptions are the settings of the components beside the reconciler: the provider
// health monitor, the proxy health engine, orphan GC and the discovery API.
type healthOptions struct {
	// DemandNamespace is where the demand Leases live (--demand-namespace): discovery's
	// picks write theirs there, and the autoscaler reads them there.
	DemandNamespace       string
	ProviderCheckInterval time.Duration
	ProviderCheckTimeout  time.Duration
	ProxyCheckInterval    time.Duration
	ProxyProbeURL         string
	ProbeTargetCheck      bool // fetch the probe URL from the manager itself when probes fail
	// NoTargetEvents: the manager watches only some namespaces (--watch-namespaces), so
	// it may not create Events in default, where the ProviderHealths' Events go.
	NoTargetEvents       bool
	StatusHeartbeat      time.Duration
	GCInterval           time.Duration
	GCGrace              time.Duration
	DiscoveryBindAddress string
	DiscoveryTokenFile   string
	DiscoveryKubeAuth    bool // Kubernetes bearer tokens, by TokenReview and SubjectAccessReview
	DiscoveryCertDir     string
	DiscoveryDrainDelay  time.Duration // discovery goes on answering this long after SIGTERM
	BootPollInterval     time.Duration // the reconciler's Get of a booting instance, the engine's probes until Ready
	// The cooldowns of standalone Proxies and the defaults of pools' spec.bans.
	BanCooldown, BanMaxCooldown time.Duration
	BanMaxCoolingPercent        int
	// Retirement of standalone Proxies and the defaults of pools' spec.bans.
	BanRetireAfterSites int
	BanRetireWindow     time.Duration
	// How long unreachable reports are ignored after a probe passed that answered one.
	UnreachableHoldoff time.Duration
	// The retirement budget of pools without spec.bans.maxRetirementsPerHour.
	BanMaxRetirementsPerHour intstr.IntOrString
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{zap: zap.Options{Development: false}}
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.providersConfig, "providers-config", defaultProvidersConfig, "The providers config file. Left at its default while nothing is at that path, or given empty (--providers-config=): no providers, so only External Proxies are served and Managed ones fail with reason ProviderNotConfigured; a path given that does not exist is an error.")
	fs.StringVar(&o.installID, "install-id", "", "Identity of this install, written into every instance's ownership mark; instances marked by another install are never listed, adopted or deleted. Default: the UID of the kube-system namespace.")
	fs.IntVar(&o.maxConcurrentReconciles, "max-concurrent-reconciles", 3, "Proxies reconciled at once.")
	fs.DurationVar(&o.quotaRetry, "quota-retry", proxy.DefaultQuotaRetry, "Wait before retrying a Proxy whose provider reported exceeded quota.")
	fs.DurationVar(&o.pendingRetry, "pending-retry", proxy.DefaultPendingRetry, "Wait before asking again for a Proxy whose provider is still working in the background (an image download).")
	fs.DurationVar(&o.health.BootPollInterval, "boot-poll-interval", proxy.DefaultPollInterval, "How often a booting Proxy is looked at: its instance while it has no address yet, then a probe through it from Running until the first one succeeds (for up to 2m). Fixed, not on the error backoff curve.")
	fs.DurationVar(&o.addressHold, "address-hold", proxy.DefaultAddressHold, "How long a running Proxy whose instance stops reporting an address keeps its last address and phase before it goes back to Provisioning.")
	fs.DurationVar(&o.deletionDrain, "deletion-drain", proxy.DefaultDeletionDrain, "How long a deleted Proxy that was healthy keeps its instance, from its deletion timestamp: discovery and a pool's EndpointSlice drop it at once, and requests it was handed just before finish. 0: delete the instance at once.")
	fs.DurationVar(&o.failedRecheck, "failed-recheck-interval", proxy.DefaultFailedRecheckInterval, "How often a Proxy Failed because another owner's instance holds its name is tried again (orphan GC also wakes it when it removes that instance).")
	fs.DurationVar(&o.health.StatusHeartbeat, "proxy-status-heartbeat", health.DefaultHeartbeatInterval, "A probe that changes nothing a user sees is written to the Proxy's status only when its lastProbeTime is this old.")
	fs.DurationVar(&o.health.ProviderCheckInterval, "provider-check-interval", time.Minute, "How often every provider's targets are checked.")
	fs.DurationVar(&o.health.ProviderCheckTimeout, "provider-check-timeout", 15*time.Second, "Time limit of one round of provider checks.")
	fs.DurationVar(&o.health.ProxyCheckInterval, "proxy-check-interval", 30*time.Second, "How often every running proxy is probed.")
	fs.StringVar(&o.health.ProxyProbeURL, "proxy-probe-url", "http://checkip.amazonaws.com/", "URL fetched through each proxy to probe it; an answer holding the caller's address is recorded as the egress IP.")
	fs.BoolVar(&o.health.ProbeTargetCheck, "probe-target-direct-check", true, "When probes fail and none in the round reached --proxy-probe-url, fetch it from the manager itself (5s limit): if it does not answer either, the probe target is down and the failures are not counted against the proxies (see docs/health.md). false: every failed probe counts; for a manager that cannot reach the probe target itself.")
	fs.DurationVar(&o.health.GCInterval, "gc-interval", 10*time.Minute, "How often orphaned instances are collected.")
	fs.DurationVar(&o.health.GCGrace, "gc-grace", 10*time.Minute, "An instance younger than this (by its creation time) is never collected.")
	fs.StringVar(&o.health.DiscoveryBindAddress, "discovery-bind-address", ":8082", "Address of the discovery API (0 disables it).")
	fs.StringVar(&o.health.DiscoveryTokenFile, "discovery-token-file", "", "File holding a static bearer token of the discovery API (re-read every 30s): its holder is one cluster-wide crawler, allowed every namespace, credentials and feedback; empty: none.")
	fs.BoolVar(&o.health.DiscoveryKubeAuth, "discovery-kubernetes-auth", true, "Accept Kubernetes bearer tokens (ServiceAccount tokens) on the discovery API, authenticated by TokenReview and authorized per namespace by SubjectAccessReview on proxies (see docs/discovery.md). With neither this nor --discovery-token-file, listings are open to anyone and credentials and feedback refused.")
	fs.StringVar(&o.health.DiscoveryCertDir, "discovery-cert-dir", "", "Directory holding tls.crt and tls.key: the discovery API serves HTTPS with them, reloaded when they change; empty: plain HTTP.")
	fs.DurationVar(&o.health.DiscoveryDrainDelay, "discovery-drain-delay", 5*time.Second, "After SIGTERM the discovery API goes on answering this long, so that the Service's endpoints drop the pod before its port closes; the leader's work stops and the lease is released at once. 0: close at once.")
	fs.DurationVar(&o.health.BanCooldown, "ban-cooldown", bans.DefaultCooldown, "How long a proxy reported banned on a site is left out of ?domain= answers for that site; each further ban of the pair doubles it. A pool's spec.bans.cooldownSeconds overrides it.")
	fs.DurationVar(&o.health.BanMaxCooldown, "ban-max-cooldown", bans.DefaultMaxCooldown, "The longest ban cooldown the doubling reaches. A pool's spec.bans.maxCooldownSeconds overrides it.")
	fs.IntVar(&o.health.BanMaxCoolingPercent, "ban-max-cooling-percent", bans.DefaultMaxCoolingPercent, "A ?domain= request is answered 503 with Retry-After when more than this percentage of the proxies it matches are cooling for its site. A pool's spec.bans.maxCoolingPercent overrides it for requests naming the pool.")
	fs.IntVar(&o.health.BanRetireAfterSites, "ban-retire-after-sites", bans.DefaultRetireAfterSites, "A proxy reported banned on at least this many distinct sites within --ban-retire-window is retired: cordoned, with the egress.hrajfrisbee.cz/retired annotation and a Warning event (a pool then replaces it); 0: never. A pool's spec.bans.retireAfterSites overrides it.")
	fs.DurationVar(&o.health.BanRetireWindow, "ban-retire-window", bans.DefaultRetireWindow, "How far back the bans counted by --ban-retire-after-sites reach. A pool's spec.bans.retireWindowSeconds overrides it.")
	fs.DurationVar(&o.health.UnreachableHoldoff, "unreachable-report-holdoff", bans.DefaultUnreachableHoldoff, "After a probe passed that answered a crawler's unreachable report of a proxy, further unreachable reports of that proxy are ignored this long: a crawler reporting a healthy proxy unreachable keeps it out of discovery's answers for at most one prompt probe per this time. More than 0.")
	retireBudget := fs.String("ban-max-retirements-per-hour", bans.DefaultMaxRetirementsPerHour.String(), "A pool retires at most this many of its children within any hour, a number (0 to 1000) or a percentage of its replicas rounded up; children due past it keep serving, cooling for each site they were banned on. Standalone Proxies have no budget. A pool's spec.bans.maxRetirementsPerHour overrides it.")
	o.remediation = remediation.DefaultPolicy()
	fs.DurationVar(&o.remediation.BootTimeout, "remediation-boot-timeout", remediation.DefaultBootTimeout, "A Managed Proxy whose instance has run this long without answering a probe is rebooted, then replaced (see docs/health.md, Remediation). A Proxy's spec.remediation.bootTimeout overrides it. From 1m to 24h.")
	fs.DurationVar(&o.remediation.UnhealthyTimeout, "remediation-unhealthy-timeout", remediation.DefaultUnhealthyTimeout, "A Managed Proxy that answered once and has then failed its probes this long is rebooted, then replaced. A Proxy's spec.remediation.unhealthyTimeout overrides it. From 1m to 24h.")
	maxUnhealthy := fs.String("max-unhealthy", remediation.DefaultMaxUnhealthy.String(), "Remediation is held in a group (a pool's children, or the standalone Proxies of one provider host or zone) while more of its proxies than this are past their timeouts at once: a count such as 2 or a percentage of the group such as 40% (rounded up). A pool's spec.remediation.maxUnhealthy overrides it.")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", "Address of the metrics endpoint (0 disables it).")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", true, "Serve metrics over HTTPS to callers the API server authenticates (TokenReview) and authorizes for GET /metrics (SubjectAccessReview); false: plain HTTP to anyone.")
	fs.StringVar(&o.metricsCertDir, "metrics-cert-dir", "", "Directory holding tls.crt and tls.key for the metrics endpoint; empty: a self-signed certificate made at start.")
	fs.BoolVar(&o.enableHTTP2, "enable-http2", false, "Offer HTTP/2 on the metrics endpoint (off: HTTP/1.1 alone, out of reach of the HTTP/2 stream-reset attacks, CVE-2023-44487).")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	fs.BoolVar(&o.autoscaler, "autoscaler", true, "Run the built-in autoscaler, which sizes the ProxyPools with spec.autoscaling from their demand (see docs/pools.md, Autoscaling); false: such pools keep the spec.replicas they have.")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "Elect a leader, so that only one manager replica is active.")
	fs.StringVar(&o.leaderElectionNS, "leader-election-namespace", "", "Namespace of the leader election lease (default: the pod's own).")
	demandNS := fs.String("demand-namespace", "", "Namespace of the pools' demand Leases (written by discovery's picks and the gateways, read by the autoscaler; see docs/pools.md, Autoscaling): one namespace for every pool, where the manager alone needs access to Leases. Give the gateway's --demand-namespace the same. Default: the pod's own (POD_NAMESPACE, else the service account's namespace file, else default).")
	watchNamespaces := fs.String("watch-namespaces", "", "Comma-separated namespaces whose Proxies, ProxyPools and Secrets the manager watches and reconciles; objects in other namespaces are not seen. Empty: every namespace (needs cluster-wide access to Secrets and Proxies; with a list, Roles in those namespaces suffice).")
	if f := flag.CommandLine.Lookup("kubeconfig"); f != nil { // registered by controller-runtime
		fs.Var(f.Value, f.Name, f.Usage)
	}
	o.zap.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	fs.Visit(func(f *flag.Flag) { o.providersConfigGiven = o.providersConfigGiven || f.Name == "providers-config" })
	if o.maxConcurrentReconciles < 1 {
		return nil, fmt.Errorf("--max-concurrent-reconciles must be at least 1, got %d", o.maxConcurrentReconciles)
	}
	if o.health.BanRetireAfterSites < 0 || o.health.BanRetireAfterSites > bans.MaxEntries {
		return nil, fmt.Errorf("--ban-retire-after-sites %d: give 0 (never retire) to %d", o.health.BanRetireAfterSites, bans.MaxEntries)
	}
	if o.deletionDrain < 0 {
		return nil, fmt.Errorf("--deletion-drain %s: give 0 (delete at once) or a positive duration", o.deletionDrain)
	}
	if o.health.BanRetireWindow <= 0 {
		return nil, fmt.Errorf("--ban-retire-window %s: give a positive duration", o.health.BanRetireWindow)
	}
	if o.health.UnreachableHoldoff <= 0 {
		return nil, fmt.Errorf("--unreachable-report-holdoff %s: give a positive duration", o.health.UnreachableHoldoff)
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"remediation-boot-timeout", o.remediation.BootTimeout}, {"remediation-unhealthy-timeout", o.remediation.UnhealthyTimeout}} {
		if f.v < time.Minute || f.v > 24*time.Hour {
			return nil, fmt.Errorf("--%s %s: give a duration from 1m to 24h", f.name, f.v)
		}
	}
	mu, err := remediation.ParseMaxUnhealthy("--max-unhealthy", *maxUnhealthy)
	if err != nil {
		return nil, err
	}
	o.remediation.MaxUnhealthy = mu
	budget, err := bans.ParseRetirementBudget(*retireBudget)
	if err != nil {
		return nil, fmt.Errorf("--ban-max-retirements-per-hour: %w", err)
	}
	o.health.BanMaxRetirementsPerHour = budget
	if err := checkInstallID(o.installID); err != nil {
		return nil, err
	}
	if o.health.DemandNamespace, o.demandNamespaceFrom, err = demand.FlagNamespace(*demandNS); err != nil {
		return nil, err
	}
	ns, err := parseWatchNamespaces(*watchNamespaces)
	if err != nil {
		return nil, err
	}
	if len(ns) > 0 && o.installID == "" {
		return o, errWatchNamespacesNeedInstallID
	}
	o.watchNamespaces = ns
	o.health.NoTargetEvents = ns != nil
	return o, nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run is the whole manager; it returns the exit code.
func run(args []string, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap), zap.WriteTo(stderr)))
	log := ctrl.Log.WithName("setup")

	// The providers config is read and checked before anything talks to the API server,
	// so a broken config fails the pod at once with its message.
	cfg, none, err := loadProvidersConfig(o.providersConfig, o.providersConfigGiven)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if none != "" {
		log.Info("starting with no providers: only External Proxies are served; a Managed Proxy fails with reason "+
			v1alpha1.ReasonProviderNotConfigured+" until a providers config names its provider and the manager restarts", "why", none)
	}
	if err := addressesFree(o); err != nil {
		log.Error(err, "an address the manager must listen on is taken")
		return 1
	}
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		log.Error(err, "loading kubeconfig")
		return 1
	}
	installID, err := installIDFor(restCfg, o.installID)
	if err != nil {
		log.Error(err, "resolving the install identity")
		return 1
	}
	log.Info("install identity", "installID", installID.id, "source", installID.source)
	registerProviderMetrics()
	providers, err := provider.Build(cfg, registry(installID.id), ctrl.Log)
	if err != nil {
		fmt.Fprintf(stderr, "providers config %s: %v\n", o.providersConfig, err)
		return 1
	}
	defer closeProviders(providers, log)

	ctx := ctrl.SetupSignalHandler()
	shutdownTracing, err := otlp.Setup(ctx)
	if err != nil {
		log.Error(err, "setting up tracing")
		return 1
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdownTracing(sctx); err != nil {
			log.Error(err, "flushing traces")
		}
	}()

	mgr, err := newManager(o, restCfg)
	if err != nil {
		log.Error(err, "creating the manager")
		return 1
	}
	disc, err := setupComponents(mgr, providers, o)
	if err != nil {
		log.Error(err, "setting up components")
		return 1
	}
	if err := setupPools(mgr, cfg, o.remediation, o.probeTarget); err != nil {
		log.Error(err, "setting up components")
		return 1
	}
	if err := setupCosts(mgr, cfg, log); err != nil { // costs.go
		log.Error(err, "setting up components")
		return 1
	}
	if err := setupAutoscaler(mgr, o.autoscaler, o.health.DemandNamespace, cfg); err != nil {
		log.Error(err, "setting up components")
		return 1
	}
	log.Info("starting manager", "providers", len(providers), "leaderElect", o.leaderElect,
		"demandNamespace", o.health.DemandNamespace, "demandNamespaceFrom", o.demandNamespaceFrom)
	err = mgr.Start(ctx)
	// The discovery API may still be draining (--discovery-drain-delay).
	if werr := disc.waitServed(o.health.DiscoveryDrainDelay + 10*time.Second); werr != nil {
		log.Error(werr, "waiting for the discovery api to drain")
	}
	if err != nil {
		log.Error(err, "manager stopped")
		return 1
	}
	log.Info("manager stopped")
	return 0
}

// installIdentity is the install's identity and where it came from, for the log.
type installIdentity struct{ id, source string }

// installIDFor resolves the install identity before the manager exists (the providers
// are built with it), with a client of its own and a time limit.
func installIDFor(restCfg *rest.Config, flagValue string) (installIdentity, error) {
	c, err := client.New(restCfg, client.Options{})
	if err != nil {
		return installIdentity{}, fmt.Errorf("a client for the install identity: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, source, err := resolveInstallID(ctx, c, flagValue)
	return installIdentity{id, source}, err
}

// addressesFree fails naming the flag when an address the manager listens on is taken.
// controller-runtime starts the metrics, health-probe and discovery listeners side by
// side, so without this a taken metrics port could fail the manager only after /readyz
// had already answered 200 to whoever waits for it.
func addressesFree(o *options) error {
	for _, a := range []struct{ flag, addr string }{
		{"--metrics-bind-address", o.metricsAddr},
		{"--health-probe-bind-address", o.probeAddr},
		{"--discovery-bind-address", o.health.DiscoveryBindAddress},
	} {
		if a.addr == "" || a.addr == "0" {
			continue
		}
		l, err := net.Listen("tcp", a.addr)
		if err != nil {
			return fmt.Errorf("%s %s: %w", a.flag, a.addr, err)
		}
		l.Close()
	}
	return nil
}

func newManager(o *options, restCfg *rest.Config) (ctrl.Manager, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsOptions(o),
		HealthProbeBindAddress:        o.probeAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              "egress-proxies-operator.egress.hrajfrisbee.cz",
		LeaderElectionNamespace:       o.leaderElectionNS,
		LeaderElectionReleaseOnCancel: true,
		Cache:                         cache.Options{ByObject: cacheByObject(o.health.DemandNamespace), DefaultNamespaces: cacheNamespaces(o.watchNamespaces)},
	})
	if err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}

// cacheByObject restricts what the manager's cache holds: the pools' Services and
// EndpointSlices (poolCacheByObject), and only the Secrets opted in as proxy credentials
// (v1alpha1.CredentialsLabel "true"), and only the pools' demand Leases
// in the demand namespace (autoscaler.LeaseCache). Every other Secret of the cluster stays out of the
// manager's memory, and its data never reaches the operator: a Proxy naming one is told
// so from a metadata-only read (proxyconfig.SecretCredentials.Metadata).
func cacheByObject(demandNamespace string) map[client.Object]cache.ByObject {
	by := poolCacheByObject()
	by[&corev1.Secret{}] = cache.ByObject{Label: labels.SelectorFromSet(labels.Set{v1alpha1.CredentialsLabel: "true"})}
	by[&coordinationv1.Lease{}] = autoscaler.LeaseCache(demandNamespace)
	return by
}

// metricsOptions: HTTPS behind the API server's authentication and authorization unless
// --metrics-secure=false, as today's kubebuilder scaffold serves them.
func metricsOptions(o *options) metricsserver.Options {
	m := metricsserver.Options{BindAddress: o.metricsAddr, SecureServing: o.metricsSecure, CertDir: o.metricsCertDir}
	if o.metricsSecure {
		m.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	if !o.enableHTTP2 {
		m.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	return m
}

// setupComponents adds the reconciler and its companions to mgr; it returns the
// discovery API's server, nil when it is off.
func setupComponents(mgr ctrl.Manager, providers map[string]provider.Provider, o *options) (*listeningServer, error) {
	// The rendered configuration takes the credentials from the Secrets the Proxies name;
	// the probe and discovery from each Proxy's snapshot of what its instance was built
	// with (the referenced Secret for a Proxy without one). Both read through the
	// manager's cache (the reconciler watches Secrets), which holds only the opted-in
	// Secrets; one the cache lacks is looked up by its metadata alone, to say whether it
	// is missing or lacks the label.
	r := &proxy.ProxyReconciler{
		Credentials:   proxyconfig.SecretCredentials{Reader: mgr.GetClient(), Metadata: mgr.GetAPIReader()}.Credentials,
		Client:        mgr.GetClient(),
		Scheme:        mgr.GetScheme(),
		Recorder:      mgr.GetEventRecorder("proxy-controller"),
		Providers:     providers,
		QuotaRetry:    o.quotaRetry,
		PendingRetry:  o.pendingRetry,
		PollInterval:  o.health.BootPollInterval,
		AddressHold:   o.addressHold,
		DeletionDrain: o.deletionDrain,

		FailedRecheckInterval: o.failedRecheck,
		Remediation:           o.remediation,
		NoProviderEvents:      o.health.NoTargetEvents,
	}
	if err := r.SetupWithManager(mgr, o.maxConcurrentReconciles); err != nil {
		return nil, fmt.Errorf("proxy reconciler: %w", err)
	}
	// The leader (as every controller) counts cooling sites, retires burnt proxies and
	// keeps the pools' saturation; every replica takes feedback (setupHealth).
	br := &proxybans.BansReconciler{
		Client:                mgr.GetClient(),
		Recorder:              mgr.GetEventRecorder("proxy-bans"),
		Policy:                banPolicy(o.health),
		MaxCoolingPercent:     o.health.BanMaxCoolingPercent,
		MaxRetirementsPerHour: &o.health.BanMaxRetirementsPerHour,
	}
	if err := br.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("ban controller: %w", err)
	}
	if err := addReadyChecks(mgr, providers); err != nil { // readiness.go
		return nil, fmt.Errorf("readiness checks: %w", err)
	}
	return setupHealth(mgr, providers, o.health, r.Wake, proxyconfig.SnapshotCredentials{Reader: mgr.GetClient(), Metadata: mgr.GetAPIReader()}.Credentials,
		func(w common.ProbeTargetWatch) { r.ProbeTarget, o.probeTarget = w, w }, r.ProviderRemediation)
}

func closeProviders(providers map[string]provider.Provider, log interface{ Error(error, string, ...any) }) {
	for name, p := range providers {
		if c, ok := p.(io.Closer); ok {
			if err := c.Close(); err != nil {
				log.Error(err, "closing provider", "provider", name)
			}
		}
	}
}
