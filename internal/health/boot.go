package health

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
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
//
// A Proxy a crawler has just reported unreachable (a status.unreachable no probe has
// answered yet) is probed once at once too, so that it is handed out again, or taken out
// as unhealthy, within about a probe's time rather than at the next round.
func (e *Engine) proxyUpdated(oldObj, newObj any) {
	old, ok := oldObj.(*v1alpha1.Proxy)
	cur, ok2 := newObj.(*v1alpha1.Proxy)
	if !ok || !ok2 || !eligible(cur) {
		return
	}
	reported := bans.UnreachableOpen(&cur.Status) &&
		(!bans.UnreachableOpen(&old.Status) || !old.Status.Unreachable.ReportedAt.Equal(&cur.Status.Unreachable.ReportedAt))
	booting := !eligible(old) || probeTarget(old) != probeTarget(cur)
	if !reported && !booting {
		return
	}
	key := client.ObjectKeyFromObject(cur)
	e.mu.Lock()
	if booting {
		e.booting[key] = bootEntry{target: probeTarget(cur), since: e.now()}
	}
	if reported {
		e.reported[key] = cur.Status.Unreachable.ReportedAt
	}
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
		e.probeReported(ctx, &wg, sem)
		e.probeBooting(ctx, &wg, sem)
	}
}

// probeReported starts a probe of each Proxy reported unreachable, once: its result
// answers the report (record). An entry stays while the Proxy is being probed already
// (that probe may have started before the report), and goes when the report has been
// answered meanwhile or the Proxy is gone or no longer probed.
func (e *Engine) probeReported(ctx context.Context, wg *sync.WaitGroup, sem chan struct{}) {
	e.mu.Lock()
	due := maps.Clone(e.reported)
	e.mu.Unlock()
	for key, at := range due {
		px := &v1alpha1.Proxy{}
		err := e.client.Get(ctx, key, px)
		if err != nil && !apierrors.IsNotFound(err) {
			continue
		}
		if err != nil || !eligible(px) || !bans.UnreachableOpen(&px.Status) {
			e.doneReported(key, at)
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			return // as many probes in flight as Concurrency allows; the next tick goes on
		}
		if e.goProbe(wg, sem, px.UID, func() {
			r := e.probeOne(ctx, px)
			if ctx.Err() != nil || e.targetIsDown(ctx, px, r) {
				return // the report waits for a probe while the target answers
			}
			if _, _, err := e.record(ctx, px, r); err != nil {
				e.log.Error(err, "recording the probe of a proxy reported unreachable", "proxy", key)
			}
		}) {
			e.doneReported(key, at)
		}
	}
}

// doneReported drops key's entry, unless a later report has meanwhile replaced it.
func (e *Engine) doneReported(key types.NamespacedName, at metav1.MicroTime) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if cur, ok := e.reported[key]; ok && cur.Equal(&at) {
		delete(e.reported, key)
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
			if ctx.Err() != nil || e.targetIsDown(ctx, px, r) {
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
