package health

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// bootEntry is a Proxy that turned Running at target and has not answered a probe there
// yet: it is probed every BootProbeInterval until it does, or BootProbeWindow has passed.
type bootEntry struct {
	target target
	since  time.Time
}

// watchRunning has the engine hear of Proxies turning Running through the Proxy
// informer and starts the loop that probes them. The returned func undoes both.
func (e *Engine) watchRunning(ctx context.Context) (func(), error) {
	inf, err := e.opts.Informers.GetInformer(ctx, &v1alpha1.Proxy{})
	if err != nil {
		return nil, fmt.Errorf("health engine: getting the proxy informer: %w", err)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{UpdateFunc: e.proxyUpdated})
	if err != nil {
		return nil, fmt.Errorf("health engine: watching proxies: %w", err)
	}
	loopCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); e.bootLoop(loopCtx) }()
	return func() {
		if err := inf.RemoveEventHandler(reg); err != nil {
			e.log.V(1).Info("removing the proxy event handler", "error", err.Error())
		}
		cancel()
		<-done
	}, nil
}

// proxyUpdated takes note of a Proxy that has just become probeable (Running or Ready
// with an address, after neither) or whose instance or address changed while it was:
// its first probe is due now, not at the next round.
func (e *Engine) proxyUpdated(oldObj, newObj any) {
	old, ok := oldObj.(*v1alpha1.Proxy)
	cur, ok2 := newObj.(*v1alpha1.Proxy)
	if !ok || !ok2 || !eligible(cur) || (eligible(old) && probeTarget(old) == probeTarget(cur)) {
		return
	}
	e.mu.Lock()
	e.booting[client.ObjectKeyFromObject(cur)] = bootEntry{target: probeTarget(cur), since: e.now()}
	e.mu.Unlock()
	select {
	case e.bootWake <- struct{}{}:
	default: // the loop is already due to look
	}
}

// bootLoop probes the booting Proxies when one is added and every BootProbeInterval,
// until ctx ends; it waits for its probes before returning.
func (e *Engine) bootLoop(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	sem := make(chan struct{}, e.opts.Concurrency)
	t := time.NewTicker(e.opts.BootProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.bootWake:
		case <-t.C:
		}
		e.probeBooting(ctx, &wg, sem)
	}
}

// probeBooting starts a probe of each booting Proxy not being probed already, dropping
// the entries that no longer apply: the Proxy is gone, out of Running/Ready, on
// another target, or past the window.
func (e *Engine) probeBooting(ctx context.Context, wg *sync.WaitGroup, sem chan struct{}) {
	now := e.now()
	e.mu.Lock()
	due := make(map[types.NamespacedName]bootEntry, len(e.booting))
	for key, b := range e.booting {
		if now.Sub(b.since) > e.opts.BootProbeWindow {
			delete(e.booting, key)
			continue
		}
		due[key] = b
	}
	e.mu.Unlock()
	for key, b := range due {
		px := &v1alpha1.Proxy{}
		if err := e.client.Get(ctx, key, px); err != nil {
			if apierrors.IsNotFound(err) {
				e.doneBooting(key, b.target)
			}
			continue
		}
		if !eligible(px) || probeTarget(px) != b.target {
			e.doneBooting(key, b.target)
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			return // as many probes in flight as Concurrency allows; the next tick goes on
		}
		// When a round is probing it, that probe's result will do.
		e.goProbe(wg, sem, px.UID, func() {
			r := e.probeOne(ctx, px)
			if ctx.Err() != nil {
				return
			}
			if r.err == nil {
				e.doneBooting(key, b.target)
			}
			if _, _, err := e.record(ctx, px, r); err != nil {
				e.log.Error(err, "recording probe result", "proxy", key)
			}
		})
	}
}

// doneBooting drops key's entry, unless it has meanwhile been made anew for another target.
func (e *Engine) doneBooting(key types.NamespacedName, t target) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if b, ok := e.booting[key]; ok && b.target == t {
		delete(e.booting, key)
	}
}
