// Command gateway runs the one-URL gateway: an HTTP forward proxy (with CONNECT) and a
// SOCKS5 proxy in front of the farm's exits, choosing each request's or tunnel's exit by
// discovery's own selection code over an informer cache of its own (docs/gateway.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gateway"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gateway/kube"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/watchns"
)

// options are the gateway's flags.
type options struct {
	listen, socksListen string
	metricsAddr         string
	probeAddr           string
	tokenFile           string
	kubeAuth            bool
	maxAttempts         int
	headerTimeout       time.Duration
	shutdownGrace       time.Duration
	activationTimeout   time.Duration
	maxHeldPerPool      int
	watchNamespaces     []string // nil: every namespace
	// demandNamespace is where the demand Leases are written (--demand-namespace), and
	// demandNamespaceFrom where its value came from, for the start log.
	demandNamespace, demandNamespaceFrom string
	zap                                  zap.Options
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen-address", ":8080", "Address of the HTTP proxy (absolute-URI requests and CONNECT).")
	fs.StringVar(&o.socksListen, "socks-listen-address", ":1080", "Address of the SOCKS5 proxy (0 disables it).")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":9090", "Address of the plain-HTTP /metrics endpoint (0 disables it).")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints.")
	fs.StringVar(&o.tokenFile, "discovery-token-file", "", "File holding the static discovery token (re-read every 30s): a proxy password equal to it may use every namespace; empty: none.")
	fs.BoolVar(&o.kubeAuth, "discovery-kubernetes-auth", true, "Accept Kubernetes tokens (ServiceAccount tokens) as proxy passwords, authenticated by TokenReview and allowed the namespaces where SubjectAccessReview grants list on proxies, as the discovery API does. With neither this nor --discovery-token-file the gateway does not start.")
	fs.IntVar(&o.maxAttempts, "max-attempts", gateway.DefaultMaxAttempts, "Exits one request or tunnel tries at most (the first and the retries), 1 to 10.")
	fs.DurationVar(&o.headerTimeout, "header-timeout", gateway.DefaultHeaderTimeout, "Time a request header (or a SOCKS5 handshake) must arrive in, from the connection or its first byte.")
	fs.DurationVar(&o.shutdownGrace, "shutdown-grace", 30*time.Second, "After SIGTERM the gateway stops accepting and lets open requests and tunnels finish this long, then closes what is left.")
	fs.DurationVar(&o.activationTimeout, "activation-timeout", gateway.DefaultActivationTimeout, "How long a request for a pool that exists but has no eligible exit yet (at zero, or its children still starting) is held waiting for one; past it: 503 with Retry-After. 0 holds nothing: such a request gets 502 at once.")
	fs.IntVar(&o.maxHeldPerPool, "max-held-per-pool", gateway.DefaultMaxHeldPerPool, "Requests held at once for one pool at most; beyond it: 503 with Retry-After at once.")
	demandNS := fs.String("demand-namespace", "", "Namespace the demand Leases are written in (one per pool this replica sees demand for; see docs/pools.md, Autoscaling): the manager's --demand-namespace, where a Role grants the gateway access to Leases. Default: the pod's own (POD_NAMESPACE, else the service account's namespace file, else default).")
	watchNamespaces := fs.String("watch-namespaces", "", "Comma-separated namespaces whose Proxies, ProxyPools and credential Secrets the gateway watches; exits elsewhere are never chosen. Empty: every namespace (needs cluster-wide read access; with a list, Roles in those namespaces suffice).")
	if f := flag.CommandLine.Lookup("kubeconfig"); f != nil { // registered by controller-runtime
		fs.Var(f.Value, f.Name, f.Usage)
	}
	o.zap.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	ns, err := watchns.Parse(*watchNamespaces)
	if err != nil {
		return nil, err
	}
	o.watchNamespaces = ns
	if o.demandNamespace, o.demandNamespaceFrom, err = demand.FlagNamespace(*demandNS); err != nil {
		return nil, err
	}
	switch {
	case o.maxAttempts < 1 || o.maxAttempts > 10:
		return nil, fmt.Errorf("--max-attempts %d: give 1 to 10", o.maxAttempts)
	case o.headerTimeout <= 0:
		return nil, fmt.Errorf("--header-timeout %s: give a positive duration", o.headerTimeout)
	case o.activationTimeout < 0:
		return nil, fmt.Errorf("--activation-timeout %s: give 0 (no holding) or a positive duration", o.activationTimeout)
	case o.maxHeldPerPool < 1:
		return nil, fmt.Errorf("--max-held-per-pool %d: give 1 or more", o.maxHeldPerPool)
	case o.shutdownGrace < 0:
		return nil, fmt.Errorf("--shutdown-grace %s: give 0 or a positive duration", o.shutdownGrace)
	case o.tokenFile == "" && !o.kubeAuth:
		return nil, errors.New("the gateway needs a way to check proxy passwords: give --discovery-token-file or leave --discovery-kubernetes-auth on")
	case o.listen == "" || o.listen == "0":
		return nil, fmt.Errorf("--listen-address %q: give an address such as :8080", o.listen)
	}
	return o, nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run is the whole gateway; it returns the exit code.
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

	// The listeners open first, so that a taken port stops the gateway at once, naming it.
	httpLn, err := net.Listen("tcp", o.listen)
	if err != nil {
		fmt.Fprintf(stderr, "--listen-address %s: %v\n", o.listen, err)
		return 1
	}
	var socksLn net.Listener
	if o.socksListen != "" && o.socksListen != "0" {
		if socksLn, err = net.Listen("tcp", o.socksListen); err != nil {
			fmt.Fprintf(stderr, "--socks-listen-address %s: %v\n", o.socksListen, err)
			return 1
		}
	}
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		log.Error(err, "loading kubeconfig")
		return 1
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		log.Error(err, "building the scheme")
		return 1
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		log.Error(err, "building the scheme")
		return 1
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:  o.probeAddr,
		Cache:                   cache.Options{ByObject: kube.CacheByObject(), DefaultNamespaces: watchns.Cache(o.watchNamespaces)},
		GracefulShutdownTimeout: ptrTo(o.shutdownGrace + 10*time.Second),
	})
	if err != nil {
		log.Error(err, "creating the manager")
		return 1
	}
	ctx := ctrl.SetupSignalHandler()
	adapter, err := kube.Setup(ctx, mgr, kube.Options{TokenFile: o.tokenFile, KubernetesAuth: o.kubeAuth})
	if err != nil {
		log.Error(err, "setting up discovery's selection")
		return 1
	}
	// Each replica reports its own demand per pool: demand Leases of source kind gateway,
	// named after the pod, in the demand namespace.
	source := demand.PodName("gateway")
	reporter := demand.NewReporter(mgr.GetClient(), o.demandNamespace, demand.KindGateway, source)
	demandRec := kube.NewDemandReporter(reporter, ctrl.Log.WithName("demand"))
	g, err := gateway.New(gateway.Config{Chooser: adapter, Authenticator: adapter, Reporter: adapter,
		Registry: metrics.Registry, Log: ctrl.Log.WithName("gateway"),
		HeaderTimeout: o.headerTimeout, MaxAttempts: o.maxAttempts,
		ActivationTimeout: o.activationTimeout, MaxHeldPerPool: o.maxHeldPerPool, Demand: demandRec})
	if err != nil {
		log.Error(err, "creating the gateway")
		return 1
	}
	adapter.WakeOn(g.ExitsChanged)
	for _, r := range []manager.Runnable{demandRec, everyReplica(reporter.Start), everyReplica(func(ctx context.Context) error {
		g.RunDemand(ctx)
		return nil
	})} {
		if err := mgr.Add(r); err != nil {
			log.Error(err, "adding the demand reporter")
			return 1
		}
	}
	srv := &server{g: g, cache: mgr.GetCache(), httpLn: httpLn, socksLn: socksLn, grace: o.shutdownGrace}
	if err := mgr.Add(srv); err != nil {
		log.Error(err, "adding the gateway")
		return 1
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "adding the health check")
		return 1
	}
	if err := mgr.AddReadyzCheck("gateway", srv.readyCheck); err != nil {
		log.Error(err, "adding the readiness check")
		return 1
	}
	log.Info("starting gateway", "listen", httpLn.Addr().String(), "socks", o.socksListen,
		"tokenFile", o.tokenFile != "", "kubernetesAuth", o.kubeAuth, "maxAttempts", o.maxAttempts, "watchNamespaces", o.watchNamespaces,
		"activationTimeout", o.activationTimeout, "maxHeldPerPool", o.maxHeldPerPool, "demandSource", source,
		"demandNamespace", o.demandNamespace, "demandNamespaceFrom", o.demandNamespaceFrom)
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "gateway stopped")
		return 1
	}
	log.Info("gateway stopped")
	return 0
}

func ptrTo[T any](v T) *T { return &v }

// everyReplica is a Runnable that runs on every replica (no leader election).
type everyReplica func(ctx context.Context) error

func (f everyReplica) Start(ctx context.Context) error { return f(ctx) }
func (everyReplica) NeedLeaderElection() bool          { return false }

// server serves the gateway's listeners once the cache has synced, and drains them when
// the manager stops.
type server struct {
	g               *gateway.Gateway
	cache           cache.Cache
	httpLn, socksLn net.Listener
	grace           time.Duration
	ready           atomic.Bool
}

// NeedLeaderElection is false: every replica serves.
func (*server) NeedLeaderElection() bool { return false }

// readyCheck is /readyz: ready once the cache has synced and the listeners serve, not
// ready again from SIGTERM on.
func (s *server) readyCheck(*http.Request) error {
	if !s.ready.Load() {
		return errors.New("the gateway is not serving: its cache has not synced yet, or it is draining")
	}
	return nil
}

func (s *server) Start(ctx context.Context) error {
	log := ctrl.Log.WithName("gateway")
	if !s.cache.WaitForCacheSync(ctx) {
		_ = s.httpLn.Close()
		if s.socksLn != nil {
			_ = s.socksLn.Close()
		}
		return nil // stopped before the cache synced
	}
	errc := make(chan error, 2)
	go func() { errc <- s.g.Serve(s.httpLn) }()
	if s.socksLn != nil {
		go func() { errc <- s.g.ServeSOCKS(s.socksLn) }()
	}
	s.ready.Store(true)
	log.Info("gateway serving", "http", s.httpLn.Addr().String(), "socks", addrOf(s.socksLn))
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	s.ready.Store(false)
	sctx, cancel := context.WithTimeout(context.Background(), s.grace)
	defer cancel()
	if err := s.g.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Error(err, "draining the gateway")
	}
	if serveErr != nil && !errors.Is(serveErr, gateway.ErrShuttingDown) {
		return fmt.Errorf("gateway: %w", serveErr)
	}
	return nil
}

func addrOf(l net.Listener) string {
	if l == nil {
		return "off"
	}
	return l.Addr().String()
}
