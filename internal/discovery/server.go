// Package discovery serves the healthy proxies to crawlers over HTTP: a list (JSON or one
// URL per line), a sticky pick per session key by rendezvous hashing, and a "who am I"
// endpoint that the health engine can use as its probe target.
package discovery

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/access"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// Source yields the current snapshot of published proxies. Implementations serve it
// from memory (the manager's informer cache) and rebuild it only when something changed.
type Source interface {
	Snapshot(ctx context.Context) (*Snapshot, error)
}

// Options configure a Server.
type Options struct {
	// Addr is the listen address, for example ":8082"; empty for a server whose API is
	// not served, only called in process (the gateway's): it warns of nothing about HTTP.
	Addr string
	// TokenFile, when set, holds the static bearer token: the one cluster-wide crawler,
	// allowed every namespace, credentials and feedback.
	TokenFile string
	// Access, when set, turns on Kubernetes authentication: any other bearer token is
	// authenticated by TokenReview and each request authorized by SubjectAccessReview on
	// the proxies of the namespaces it touches (authz.go). With neither TokenFile nor
	// Access, listings are open, credentials and feedback refused.
	Access *access.Access
	// TokenReload is how often the token file is re-read (default 30s).
	TokenReload time.Duration
	// Credentials reads a Proxy's credentials for ?credentials=true, which is served only
	// to authenticated callers. Nil: a Proxy with spec.proxy.basicAuth cannot be served so.
	Credentials proxyconfig.CredentialsFunc
	// TLS, when set, makes the server speak HTTPS with it (its GetCertificate may hand out
	// a certificate reloaded from disk); nil: plain HTTP.
	TLS *tls.Config
	// Feedback takes the reports of POST /v1/feedback; nil: the endpoint answers 503.
	Feedback FeedbackSink
	// MaxCoolingPercent is the saturation threshold of ?domain= requests (default 50);
	// PoolBans, when set, looks up a pool's spec.bans, whose maxCoolingPercent applies to
	// requests naming that pool.
	MaxCoolingPercent int
	PoolBans          func(ctx context.Context, pool types.NamespacedName) *v1alpha1.PoolBans
	// Pools, when set, reads ProxyPools (the manager's cache): a pick naming a pool
	// (?pool=) that exists but has no serving proxy (a pool at zero, or whose children
	// are still starting) is answered 503 with Retry-After (ZeroPoolRetryAfter) and a
	// body naming the pool, and Demand hears of it as a wake. Nil: such a pick gets the
	// plain 503 of no proxy.
	Pools client.Reader
	// Demand, when set, hears of every pick that chose a pool's proxy, and of every wake.
	Demand PickRecorder
	// Clock is what ?domain= compares cooldowns with (default: the real clock).
	Clock clock.PassiveClock
	Log   logr.Logger
}

// Server is the discovery API. It is a manager Runnable that runs on every replica.
type Server struct {
	src  Source
	opts Options
	auth *tokenAuth
	mux  *http.ServeMux
	// scopes caches Kubernetes callers' namespace scopes (authz.go).
	scopes *cache.LRUExpireCache

	// fbMu is held for reading while a feedback request hands its reports to the sink;
	// Drain takes it for writing, so that no report is taken after Drain returns.
	fbMu     sync.RWMutex
	draining bool
}

// Drain makes the server refuse feedback from now on (503, Retry-After: 1), for the
// crawler to send it again to another replica, while it goes on answering reads. It
// returns once no request is still handing reports to the sink, so a sink that flushes
// after Drain loses none. It may be called more than once.
func (s *Server) Drain() {
	s.fbMu.Lock()
	s.draining = true
	s.fbMu.Unlock()
}

// New builds a server over src. It fails when a token file is configured but unreadable
// or empty, so a misconfigured deployment stops at start-up rather than serving openly; a
// token file that does not exist yet refuses every protected request until it appears.
func New(src Source, opts Options) (*Server, error) {
	if opts.TokenReload <= 0 {
		opts.TokenReload = 30 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	s := &Server{src: src, opts: opts, mux: http.NewServeMux(), scopes: newScopeCache(opts.Clock)}
	if opts.TokenFile != "" {
		a, err := newTokenAuth(opts.TokenFile)
		if err != nil {
			return nil, err
		}
		if a.digest.Load() == nil {
			opts.Log.Info("WARNING: the discovery token file does not exist; every listing is refused until it does", "path", opts.TokenFile)
		}
		s.auth = a
	}
	if opts.Addr != "" && (s.auth != nil || opts.Access != nil) && opts.TLS == nil && opts.Credentials != nil {
		opts.Log.Info("WARNING: the discovery API serves ?credentials=true, proxy passwords, and takes bearer tokens over plain HTTP: anyone on the path can read both; serve it over TLS (--discovery-cert-dir)")
	}
	s.mux.Handle("/v1/proxies", s.identify(onlyGet(s.list), false))
	s.mux.Handle("/v1/proxies/pick", s.identify(onlyGet(s.pick), false))
	s.mux.Handle("/v1/feedback", s.identify(s.feedback, true))
	// whoami reveals only the caller's own address, and the probe going through a proxy
	// carries no credentials, so it stays open.
	s.mux.HandleFunc("/v1/whoami", whoami)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{status: http.StatusNotFound, Message: fmt.Sprintf("no such endpoint %s; see /v1/proxies, /v1/proxies/pick, /v1/feedback and /v1/whoami", r.URL.Path)})
	})
	return s, nil
}

// Handler returns the API's HTTP handler.
func (s *Server) Handler() http.Handler { return s.mux }

// NeedLeaderElection is false: every replica answers from its own cache.
func (s *Server) NeedLeaderElection() bool { return false }

// Start serves on opts.Addr until ctx ends, then shuts down gracefully.
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("discovery api: listening on %s: %w", s.opts.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.auth != nil {
		wg.Add(1)
		go func() { defer wg.Done(); s.auth.reloadLoop(ctx, s.opts.TokenReload, s.opts.Log) }()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		_ = srv.Shutdown(sctx)
	}()
	if s.opts.TLS != nil {
		ln = tls.NewListener(ln, s.opts.TLS)
	}
	s.opts.Log.Info("discovery api listening", "address", ln.Addr().String(), "tokenAuth", s.auth != nil, "kubernetesAuth", s.opts.Access != nil, "tls", s.opts.TLS != nil)
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("discovery api on %s: %w", ln.Addr(), err)
	}
	return nil
}

func onlyGet(h callerHandler) callerHandler {
	return func(w http.ResponseWriter, r *http.Request, c *access.Caller) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, &apiError{status: http.StatusMethodNotAllowed, Message: fmt.Sprintf("method %s not allowed; use GET", r.Method)})
			return
		}
		h(w, r, c)
	}
}
