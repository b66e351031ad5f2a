package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

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
// when the port is bound; its check passes from then until the server stops.
type listeningServer struct {
	addr      string
	srv       *discovery.Server
	listening atomic.Bool
}

// NeedLeaderElection is false: every replica serves discovery.
func (l *listeningServer) NeedLeaderElection() bool { return false }

func (l *listeningServer) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		return fmt.Errorf("discovery api: listening on %s: %w", l.addr, err)
	}
	l.listening.Store(true)
	defer l.listening.Store(false)
	return l.srv.Serve(ctx, ln)
}

func (l *listeningServer) check(*http.Request) error {
	if !l.listening.Load() {
		return fmt.Errorf("the discovery api is not listening on %s", l.addr)
	}
	return nil
}

// addDiscovery adds srv to mgr on addr, with its readiness check.
func addDiscovery(mgr ctrl.Manager, srv *discovery.Server, addr string) error {
	l := &listeningServer{addr: addr, srv: srv}
	if err := mgr.Add(l); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("discovery", l.check)
}
