package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// /readyz answers 200 only when the manager can do its work: its informer caches have
// synced (so the reconciler and discovery read the cluster as it is), the discovery API
// listens (when it is enabled; registered by setupHealth), and the providers config is
// loaded. Each is a check of its own, so a failing /readyz names the one that is not met
// ("[-]caches failed"). /healthz stays a plain ping: not being ready yet is no reason to
// restart the pod.

// cacheSyncWait bounds how long one /readyz request waits for the caches: a probe gets a
// prompt "not yet" rather than hanging until the kubelet's timeout.
const cacheSyncWait = 200 * time.Millisecond

// addReadyChecks registers the caches and providers checks on mgr.
func addReadyChecks(mgr ctrl.Manager, providers map[string]provider.Provider) error {
	if err := mgr.AddReadyzCheck("caches", cachesSynced(mgr.GetCache())); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("providers", providersLoaded(providers))
}

// cachesSynced passes once the cache has started and every informer registered in it by
// then has synced, and from then on: an informer added later (a controller's, when this
// replica becomes leader; a type a component first reads after start) syncs on its own
// while the replica keeps serving discovery from the caches that have synced, so it is
// no reason to take the replica out of its Service. Before the first sync every request
// asks again.
func cachesSynced(c cache.Cache) healthz.Checker {
	var synced atomic.Bool
	return func(req *http.Request) error {
		if synced.Load() {
			return nil
		}
		ctx, cancel := context.WithTimeout(req.Context(), cacheSyncWait)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("the informer caches have not synced yet")
		}
		synced.Store(true)
		return nil
	}
}

// providersLoaded passes when the providers config has been read, validated and every
// entry built. run does that before the manager exists, and exits on failure, so in the
// binary it passes from the first request on; it is listed so that readiness says so.
func providersLoaded(providers map[string]provider.Provider) healthz.Checker {
	return func(*http.Request) error {
		if providers == nil {
			return errors.New("the providers config is not loaded")
		}
		return nil
	}
}

// listeningServer runs the discovery API on a listener it opens itself, so that it knows
// when the port is bound; its check passes from then until the manager stops.
//
// When the manager stops (SIGTERM), the server goes on answering for drain
// (--discovery-drain-delay) while Start returns at once: the manager then stops the
// leader's work and releases the lease without waiting, and the Service's endpoints have
// time to drop the terminating pod before its listener closes, so that no crawler is
// refused a connection during an upgrade or a failover. run waits for the drain
// (waitServed) before the process exits.
type listeningServer struct {
	addr      string
	srv       *discovery.Server
	drain     time.Duration
	log       logr.Logger
	listening atomic.Bool
	started   atomic.Bool
	served    chan struct{} // closed once the server has stopped, after Start
}

// NeedLeaderElection is false: every replica serves discovery.
func (l *listeningServer) NeedLeaderElection() bool { return false }

func (l *listeningServer) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		return fmt.Errorf("discovery api: listening on %s: %w", l.addr, err)
	}
	if l.served == nil {
		l.served = make(chan struct{})
	}
	l.started.Store(true)
	l.listening.Store(true)
	serveCtx, stopServing := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		defer close(l.served)
		errc <- l.srv.Serve(serveCtx, ln)
	}()
	select {
	case err := <-errc:
		l.listening.Store(false)
		stopServing()
		return err
	case <-ctx.Done():
	}
	l.listening.Store(false)
	l.srv.Drain() // reads go on; feedback goes to another replica
	if l.drain <= 0 {
		stopServing()
		return <-errc
	}
	l.log.Info("discovery api draining: answering until the Service drops this replica", "drain", l.drain)
	go func() {
		t := time.NewTimer(l.drain)
		defer t.Stop()
		select {
		case <-t.C:
		case err := <-errc: // it stopped on its own
			errc <- err
		}
		stopServing()
		if err := <-errc; err != nil {
			l.log.Error(err, "discovery api stopped while draining")
		}
		l.log.Info("discovery api stopped")
	}()
	return nil
}

// waitServed waits, up to limit, for a started server to stop (the end of its drain).
func (l *listeningServer) waitServed(limit time.Duration) error {
	if l == nil || !l.started.Load() {
		return nil
	}
	select {
	case <-l.served:
		return nil
	case <-time.After(limit):
		return fmt.Errorf("the discovery api on %s still serving %s after the manager stopped", l.addr, limit)
	}
}

func (l *listeningServer) check(*http.Request) error {
	if !l.listening.Load() {
		return fmt.Errorf("the discovery api is not listening on %s", l.addr)
	}
	return nil
}

// addDiscovery adds srv to mgr on addr, with its readiness check.
func addDiscovery(mgr ctrl.Manager, srv *discovery.Server, addr string, drain time.Duration) (*listeningServer, error) {
	l := &listeningServer{addr: addr, srv: srv, drain: drain, log: ctrl.Log.WithName("discovery"), served: make(chan struct{})}
	if err := mgr.Add(l); err != nil {
		return nil, err
	}
	return l, mgr.AddReadyzCheck("discovery", l.check)
}
