package gateway

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Config's zero fields.
const (
	DefaultRealm                 = "egress-proxies"
	DefaultHeaderTimeout         = 10 * time.Second
	DefaultMaxHeaderBytes        = 32 << 10
	DefaultIdleTimeout           = 2 * time.Minute
	DefaultExitTimeout           = 10 * time.Second
	DefaultResponseHeaderTimeout = 2 * time.Minute
	// DefaultMaxAttempts: the first exit and up to two others.
	DefaultMaxAttempts = 3
)

// DefaultBanStatuses are the site answers to plain HTTP that Reporter.Banned hears of: 403
// always, 429 only with a Retry-After.
var DefaultBanStatuses = []int{http.StatusForbidden, http.StatusTooManyRequests}

// Config is a Gateway's collaborators and limits. Chooser and Authenticator are required.
type Config struct {
	Chooser       Chooser
	Authenticator Authenticator
	// Reporter hears of failed exits and bans; nil: nobody.
	Reporter Reporter
	// Registry gets the gateway's metrics; nil: they are not registered.
	Registry prometheus.Registerer
	Log      logr.Logger

	// Realm is the realm of the 407's Proxy-Authenticate.
	Realm string
	// HeaderTimeout bounds reading a request's header (HTTP) or a SOCKS5 handshake, from
	// its first byte (a new connection: from the accept) to its end; past it: 408.
	HeaderTimeout time.Duration
	// MaxHeaderBytes bounds a request's header; past it: 431.
	MaxHeaderBytes int
	// IdleTimeout closes a keep-alive connection that sends no new request for this long.
	IdleTimeout time.Duration
	// ExitTimeout bounds connecting to an exit and, for a tunnel, its answer to CONNECT.
	ExitTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for a plain-HTTP response's header through the
	// exit.
	ResponseHeaderTimeout time.Duration
	// MaxAttempts is how many exits one request or tunnel tries at most.
	MaxAttempts int
	// BanStatuses are the site statuses that Reporter.Banned hears of (429 only with a
	// Retry-After); nil: DefaultBanStatuses.
	BanStatuses []int

	// ActivationTimeout is how long a request for a pool with no eligible exit yet (the
	// Chooser's *EmptyPoolError) is held waiting for one; 0 holds nothing (the request
	// gets its 502 at once), as does a Config left zero: the binary sets
	// DefaultActivationTimeout.
	ActivationTimeout time.Duration
	// MaxHeldPerPool bounds the requests held for one pool; beyond it: 503 at once.
	// 0: DefaultMaxHeldPerPool.
	MaxHeldPerPool int
	// Demand hears of each pool's demand (DemandRecorder); nil: nobody.
	Demand DemandRecorder
	// DemandInterval is how often RunDemand measures; 0: DefaultDemandInterval.
	DemandInterval time.Duration
}

// fillDefaults sets the fields left zero to their defaults.
func (c *Config) fillDefaults() {
	if c.Realm == "" {
		c.Realm = DefaultRealm
	}
	if c.HeaderTimeout <= 0 {
		c.HeaderTimeout = DefaultHeaderTimeout
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.ExitTimeout <= 0 {
		c.ExitTimeout = DefaultExitTimeout
	}
	if c.ResponseHeaderTimeout <= 0 {
		c.ResponseHeaderTimeout = DefaultResponseHeaderTimeout
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.BanStatuses == nil {
		c.BanStatuses = DefaultBanStatuses
	}
	if c.Reporter == nil {
		c.Reporter = nopReporter{}
	}
	if c.MaxHeldPerPool <= 0 {
		c.MaxHeldPerPool = DefaultMaxHeldPerPool
	}
	if c.DemandInterval <= 0 {
		c.DemandInterval = DefaultDemandInterval
	}
}

type nopReporter struct{}

func (nopReporter) Unreachable(Exit, error)                 {}
func (nopReporter) Banned(Exit, string, int, time.Duration) {}

// Gateway serves HTTP forward proxying with CONNECT on one listener and SOCKS5 on another,
// sending each request or tunnel through an exit its Chooser chooses.
type Gateway struct {
	cfg       Config
	log       logr.Logger
	metrics   *metrics
	sessions  *sessions
	transport *exitTransport
	rotation  atomic.Uint64
	act       *activation
	demand    *demand

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*clientConn]struct{}
	tunnels   map[*tunnel]struct{}
	draining  atomic.Bool
	wg        sync.WaitGroup
}

// ErrMissingCollaborator: New was given no Chooser or no Authenticator.
var ErrMissingCollaborator = errors.New("gateway config needs a Chooser and an Authenticator")

// ErrShuttingDown is what Serve returns once Shutdown has begun.
var ErrShuttingDown = errors.New("gateway is shutting down")

// New builds a Gateway and registers its metrics on cfg.Registry.
func New(cfg Config) (*Gateway, error) {
	if cfg.Chooser == nil || cfg.Authenticator == nil {
		return nil, ErrMissingCollaborator
	}
	cfg.fillDefaults()
	g := &Gateway{
		cfg:       cfg,
		log:       cfg.Log,
		listeners: map[net.Listener]struct{}{},
		conns:     map[*clientConn]struct{}{},
		tunnels:   map[*tunnel]struct{}{},
		act:       newActivation(),
		demand:    newDemand(),
	}
	g.sessions = newSessions()
	m, err := newMetrics(cfg.Registry, g)
	if err != nil {
		return nil, err
	}
	g.metrics = m
	g.transport = g.newTransport()
	return g, nil
}

// Serve accepts HTTP proxy connections (forward requests and CONNECT) on l until
// Shutdown; it then returns ErrShuttingDown.
func (g *Gateway) Serve(l net.Listener) error { return g.serve(l, g.serveHTTPConn) }

// ServeSOCKS accepts SOCKS5 connections on l until Shutdown; it then returns
// ErrShuttingDown.
func (g *Gateway) ServeSOCKS(l net.Listener) error { return g.serve(l, g.serveSOCKSConn) }

func (g *Gateway) serve(l net.Listener, handle func(*clientConn)) error {
	if !g.track(l) {
		l.Close()
		return ErrShuttingDown
	}
	var delay time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if g.draining.Load() {
				return ErrShuttingDown
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Out of descriptors and the like: back off as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				g.log.Error(err, "accepting a connection; retrying", "in", delay)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			continue
		}
		cc := &clientConn{c: tc}
		if !g.addConn(cc) {
			tc.Close()
			continue
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			defer g.removeConn(cc)
			handle(cc)
		}()
	}
}

func (g *Gateway) track(l net.Listener) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.draining.Load() {
		return false
	}
	g.listeners[l] = struct{}{}
	return true
}

func (g *Gateway) addConn(cc *clientConn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.draining.Load() {
		return false
	}
	g.conns[cc] = struct{}{}
	return true
}

// removeConn forgets a connection whose handler returned; a connection that became a
// tunnel is closed by the tunnel.
func (g *Gateway) removeConn(cc *clientConn) {
	g.mu.Lock()
	delete(g.conns, cc)
	g.mu.Unlock()
	if !cc.tunneled {
		cc.c.Close()
	}
}

// Shutdown stops accepting, closes idle keep-alive connections, and waits for requests
// in flight and open tunnels to finish until ctx is done; it then closes what is still
// open and returns ctx's error. Each step is logged.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.mu.Lock()
	g.draining.Store(true)
	for l := range g.listeners {
		l.Close()
	}
	for cc := range g.conns {
		if cc.idle.Load() {
			cc.c.SetReadDeadline(time.Unix(1, 0))
		}
	}
	openTunnels, openConns := len(g.tunnels), len(g.conns)
	g.mu.Unlock()
	g.act.drainOnce.Do(func() { close(g.act.drain) }) // held requests end: 503, retry elsewhere
	g.log.Info("gateway draining: no new connections; waiting for open tunnels and requests", "tunnels", openTunnels, "connections", openConns)
	start := time.Now()
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	select {
	case <-done:
		g.log.Info("gateway drained", "after", time.Since(start).Round(time.Millisecond))
		g.transport.CloseIdleConnections(true)
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	left := len(g.tunnels)
	for t := range g.tunnels {
		t.close()
	}
	for cc := range g.conns {
		cc.c.Close()
	}
	g.mu.Unlock()
	g.log.Info("gateway grace period over; closed what was still open", "tunnels", left, "after", time.Since(start).Round(time.Millisecond))
	<-done
	g.transport.CloseIdleConnections(true)
	return ctx.Err()
}

// clientConn is one accepted connection.
type clientConn struct {
	c *net.TCPConn
	// idle: the handler waits for a request's first byte; Shutdown wakes it.
	idle atomic.Bool
	// tunneled: the connection now belongs to a tunnel, which closes it.
	tunneled bool
}
