package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// Holding. A request naming a pool that exists but has no eligible exit yet (the
// Chooser's *EmptyPoolError, before any exit was tried) is held: it counts as the pool's
// held demand (DemandRecorder hears of it at once, which wakes a pool at zero), and it
// waits up to Config.ActivationTimeout for an exit. It chooses again whenever
// ExitsChanged is called (the binary calls it from its informer's events), never on a
// timer of its own. It ends served through the first exit the Chooser offers, or on the
// timeout (503 with Retry-After), when the client goes away, when the pool stops being
// one (the Chooser's other answer), or when the gateway drains.

// Defaults of the holding fields of Config.
const (
	DefaultActivationTimeout = 3 * time.Minute
	DefaultMaxHeldPerPool    = 1000
	// HeldRetryAfter is the Retry-After of a held request's 503 (timed out, or beyond
	// Config.MaxHeldPerPool): by then the pool's first child is usually starting.
	HeldRetryAfter = 10 * time.Second
)

// The outcomes of a hold, the outcome label of proxy_operator_gateway_activation_wait_seconds.
const (
	holdServed     = "served"      // an exit became eligible and the request went on through it
	holdTimeout    = "timeout"     // ActivationTimeout passed: 503
	holdClientGone = "client_gone" // the client closed its connection while held
	holdFull       = "full"        // the pool already held MaxHeldPerPool requests: 503 at once
	holdShutdown   = "shutdown"    // the gateway began draining: 503
	holdRefused    = "refused"     // the Chooser answered otherwise (the pool was deleted, ...)
)

// poolKey is one pool: its namespace and name.
type poolKey struct{ namespace, pool string }

// heldError ends a hold without an exit.
type heldError struct {
	outcome string
	key     poolKey
	waited  time.Duration
	limit   int
	timeout time.Duration
}

func (e *heldError) Error() string {
	switch e.outcome {
	case holdTimeout:
		return fmt.Sprintf("pool %s/%s has no exit ready: waited %s for one to start; retry after %s", e.key.namespace, e.key.pool, e.timeout, HeldRetryAfter)
	case holdFull:
		return fmt.Sprintf("pool %s/%s has no exit ready and already holds %d requests waiting for one; retry after %s", e.key.namespace, e.key.pool, e.limit, HeldRetryAfter)
	case holdShutdown:
		return fmt.Sprintf("pool %s/%s has no exit ready and this gateway is shutting down; retry", e.key.namespace, e.key.pool)
	default:
		return fmt.Sprintf("the client went away while its request for pool %s/%s waited %s for an exit", e.key.namespace, e.key.pool, e.waited.Round(time.Millisecond))
	}
}

// Is makes errors.Is(err, ErrNoExit) true.
func (e *heldError) Is(target error) bool { return target == ErrNoExit }

// refusal is the answer to a hold that ended without an exit.
func (e *heldError) refusal() refusal {
	switch e.outcome {
	case holdClientGone:
		return refusal{status: http.StatusServiceUnavailable, outcome: outcomeClientGone, msg: e.Error(), socks: socksNotAllowed}
	case holdShutdown:
		return refusal{status: http.StatusServiceUnavailable, outcome: outcomeNoExit, retryAfter: time.Second, msg: e.Error(), socks: socksNotAllowed}
	default:
		return refusal{status: http.StatusServiceUnavailable, outcome: outcomeNoExit, retryAfter: HeldRetryAfter, msg: e.Error(), socks: socksNotAllowed}
	}
}

// activation is what holding shares: the signal that wakes held requests.
type activation struct {
	mu      sync.Mutex
	changed chan struct{}
	// drain is closed when Shutdown begins.
	drain     chan struct{}
	drainOnce sync.Once
}

func newActivation() *activation {
	return &activation{changed: make(chan struct{}), drain: make(chan struct{})}
}

// ExitsChanged wakes every held request to ask its Chooser again. Call it whenever the
// exits may have changed: the binary calls it from its Proxy and ProxyPool informers'
// events. It never blocks.
func (g *Gateway) ExitsChanged() {
	a := g.act
	a.mu.Lock()
	close(a.changed)
	a.changed = make(chan struct{})
	a.mu.Unlock()
}

func (a *activation) changes() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.changed
}

// client is the side of a held request the gateway watches for going away.
type client struct {
	c  *net.TCPConn
	br *bufio.Reader
}

// chooseFor is choose, holding the request while its pool has no eligible exit yet.
func (g *Gateway) chooseFor(ctx context.Context, rt *route, cl client) (Exit, error) {
	exit, err := g.choose(ctx, rt)
	var empty *EmptyPoolError
	if err == nil || rt.tried > 0 || g.cfg.ActivationTimeout <= 0 || !errors.As(err, &empty) {
		return exit, err
	}
	return g.hold(ctx, rt, poolKey{empty.Namespace, empty.Pool}, cl)
}

// hold waits for an exit of the pool key, as the package comment of Holding says.
func (g *Gateway) hold(ctx context.Context, rt *route, key poolKey, cl client) (exit Exit, err error) {
	rt.namespace, rt.demand = key.namespace, key
	g.countDemand(rt)
	start := time.Now()
	outcome := holdServed
	defer func() {
		waited := time.Since(start)
		g.metrics.wait.WithLabelValues(key.namespace, key.pool, outcome).Observe(waited.Seconds())
		kv := []any{"namespace", key.namespace, "pool", key.pool, "outcome", outcome, "waited", waited.Round(time.Millisecond).String(), "site", rt.site}
		if err == nil {
			kv = append(kv, "exit", exit.ID())
		}
		g.log.Info("held request ended", kv...)
	}()
	if !g.demand.enter(key, g.cfg.MaxHeldPerPool) {
		outcome = holdFull
		return Exit{}, &heldError{outcome: holdFull, key: key, limit: g.cfg.MaxHeldPerPool}
	}
	g.heldChanged(key)
	defer func() {
		g.demand.leave(key)
		g.heldChanged(key)
	}()
	gone, stopWatching := watchGone(cl)
	defer stopWatching()
	timer := time.NewTimer(g.cfg.ActivationTimeout)
	defer timer.Stop()
	for {
		// Taken before choosing: a change during the choice wakes the next wait.
		changed := g.act.changes()
		exit, err := g.choose(ctx, rt)
		var empty *EmptyPoolError
		switch {
		case err == nil:
			return exit, nil
		case !errors.As(err, &empty):
			outcome = holdRefused
			return Exit{}, err
		}
		select {
		case <-changed:
		case <-timer.C:
			outcome = holdTimeout
			return Exit{}, &heldError{outcome: holdTimeout, key: key, timeout: g.cfg.ActivationTimeout}
		case <-gone:
			outcome = holdClientGone
			return Exit{}, &heldError{outcome: holdClientGone, key: key, waited: time.Since(start)}
		case <-g.act.drain:
			outcome = holdShutdown
			return Exit{}, &heldError{outcome: holdShutdown, key: key}
		}
	}
}

// heldChanged tells the held gauge and the DemandRecorder of key's held requests now.
func (g *Gateway) heldChanged(key poolKey) {
	d := g.poolDemandNow(key)
	g.metrics.held.WithLabelValues(key.namespace, key.pool).Set(float64(d.Held))
	if g.cfg.Demand != nil {
		g.cfg.Demand.Record(d)
	}
}

// watchGone watches a held client's connection: the channel is closed when the client
// closes it (or it breaks). Nothing the client sends meanwhile is lost: it stays in br
// for the tunnel or the request body, and the watch ends there (a client that sends is
// not gone). stop ends the watch and leaves the connection and br as they were, with no
// deadline.
func watchGone(cl client) (gone <-chan struct{}, stop func()) {
	g := make(chan struct{})
	if cl.c == nil {
		return g, func() {}
	}
	done := make(chan struct{})
	cl.c.SetDeadline(time.Time{})
	go func() {
		defer close(done)
		if _, err := cl.br.Peek(1); err != nil && !isTimeout(err) {
			close(g)
		}
	}()
	return g, func() {
		cl.c.SetReadDeadline(time.Unix(1, 0))
		<-done
		cl.c.SetReadDeadline(time.Time{})
	}
}
