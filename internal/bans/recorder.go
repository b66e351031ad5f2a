package bans

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
)

// FieldManager owns status.cooldowns and status.unreachable of every Proxy, and nothing
// else (statusapply.ProxyFeedback).
const FieldManager = statusapply.ProxyFeedback

// DefaultWriteInterval is the least time between two status writes of one Proxy.
const DefaultWriteInterval = time.Second

// conflictRetries bounds the writes of one flush of one Proxy that another replica's
// write (or any other status write) beat.
const conflictRetries = 5

// Recorder takes crawler reports on every replica and writes them into the Proxies'
// status.cooldowns (and status.unreachable, UnreachableAfter), at most once per Proxy per WriteInterval: the reports that arrive
// meanwhile are applied together in the next write, those of one (proxy, site) pair
// folded into one (pendingPair), and at most MaxPendingPairsPerProxy and MaxPendingPairs
// pairs wait; a report for a new pair past either bound is dropped and counted in
// proxy_operator_feedback_dropped_total. A write the API server refuses as invalid is
// dropped the same way; any other failed write is tried again. Each write applies only
// status.cooldowns, by server-side apply under FieldManager, and carries the
// resourceVersion it read, so two replicas writing the same Proxy never lose each
// other's entries: the later one is refused, reads again and applies again.
type Recorder struct {
	// Client writes; Reader reads Proxies and ProxyPools (the manager's cache); APIReader
	// reads a Proxy afresh after a conflict.
	Client    client.Client
	Reader    client.Reader
	APIReader client.Reader
	// Policy is the cooldown policy of standalone Proxies and the default of pools'.
	Policy Policy
	// WriteInterval defaults to DefaultWriteInterval.
	WriteInterval time.Duration
	// MaxPendingPairsPerProxy and MaxPendingPairs bound the (proxy, site) pairs waiting
	// for a write; they default to DefaultMaxPendingPairsPerProxy and
	// DefaultMaxPendingPairs.
	MaxPendingPairsPerProxy, MaxPendingPairs int
	// UnreachableHoldoff is how long after a passing probe answered an unreachable report
	// the proxy's further unreachable reports are ignored (DefaultUnreachableHoldoff).
	UnreachableHoldoff time.Duration
	Clock              clock.Clock // default: the real clock
	Log                logr.Logger
	// BeforeFinalFlush, when set, is called once the recorder is told to stop and before
	// its last flush: the discovery server's Drain, so that no report it takes is left
	// unwritten.
	BeforeFinalFlush func()

	mu      sync.Mutex
	pending map[types.NamespacedName]pendingProxy
	pairs   int                                // in pending
	last    map[types.NamespacedName]time.Time // last write
	wake    chan struct{}
	writes  int64
}

type timedReport struct {
	Report
	at time.Time
	n  int32 // how many unreachable reports it stands for (0 for the other outcomes)
}

func (r *Recorder) init() {
	if r.pending == nil {
		r.pending = map[types.NamespacedName]pendingProxy{}
		r.last = map[types.NamespacedName]time.Time{}
		r.wake = make(chan struct{}, 1)
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.WriteInterval <= 0 {
		r.WriteInterval = DefaultWriteInterval
	}
	if r.MaxPendingPairsPerProxy <= 0 {
		r.MaxPendingPairsPerProxy = DefaultMaxPendingPairsPerProxy
	}
	if r.MaxPendingPairs <= 0 {
		r.MaxPendingPairs = DefaultMaxPendingPairs
	}
	if r.UnreachableHoldoff <= 0 {
		r.UnreachableHoldoff = DefaultUnreachableHoldoff
	}
}

// Add queues a report about the Proxy key, taken now; the next flush writes it. A
// report for a pair that is not waiting yet, past the bounds, is dropped and counted.
func (r *Recorder) Add(key types.NamespacedName, rep Report) {
	r.mu.Lock()
	r.init()
	p, reason := r.pairLocked(key, rep.Site)
	if p != nil {
		p.add(rep, r.Clock.Now())
	}
	r.mu.Unlock()
	if p == nil {
		droppedReports.WithLabelValues(reason).Inc()
		return
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// pairLocked is the pending pair (key, site), added when there is room; nil and the
// reason it is dropped when there is none.
func (r *Recorder) pairLocked(key types.NamespacedName, site string) (*pendingPair, string) {
	pp := r.pending[key]
	if p := pp[site]; p != nil {
		return p, ""
	}
	switch {
	case len(pp) >= r.MaxPendingPairsPerProxy:
		return nil, DropProxyFull
	case r.pairs >= r.MaxPendingPairs:
		return nil, DropFull
	}
	if pp == nil {
		pp = pendingProxy{}
		r.pending[key] = pp
	}
	p := &pendingPair{}
	pp[site] = p
	r.pairs++
	return p, ""
}

// requeueLocked puts back the pairs of a write that failed, ahead of those taken since.
func (r *Recorder) requeueLocked(key types.NamespacedName, failed pendingProxy) {
	for site, old := range failed {
		p, reason := r.pairLocked(key, site)
		if p == nil {
			droppedReports.WithLabelValues(reason).Add(float64(old.reports))
			continue
		}
		old.then(p, site)
		*p = *old
	}
}

// Pending is how many (proxy, site) pairs wait for a write.
func (r *Recorder) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pairs
}

// Writes is how many status writes the recorder made.
func (r *Recorder) Writes() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writes
}

// NeedLeaderElection is false: every replica takes reports.
func (r *Recorder) NeedLeaderElection() bool { return false }

// Start flushes until ctx ends, then once more so that what was accepted is written.
func (r *Recorder) Start(ctx context.Context) error {
	r.mu.Lock()
	r.init()
	r.mu.Unlock()
	for {
		next := r.Flush(ctx)
		var timer <-chan time.Time
		if !next.IsZero() {
			timer = r.Clock.After(next.Sub(r.Clock.Now()))
		}
		select {
		case <-ctx.Done():
			if r.BeforeFinalFlush != nil {
				r.BeforeFinalFlush()
			}
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			r.Flush(fctx)
			cancel()
			return nil
		case <-r.wake:
		case <-timer:
		}
	}
}

// Flush writes every Proxy with pending reports whose last write is at least
// WriteInterval old, and returns when the next one is due (zero: nothing pending).
// A write that fails keeps its reports for the next flush, unless the API server
// refused it as invalid: then they are dropped, since they would be refused again and
// hold back every later report of the Proxy.
func (r *Recorder) Flush(ctx context.Context) time.Time {
	r.mu.Lock()
	r.init()
	now := r.Clock.Now()
	due := map[types.NamespacedName]pendingProxy{}
	var next time.Time
	for k, reps := range r.pending {
		if at := r.last[k].Add(r.WriteInterval); at.After(now) {
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		due[k] = reps
		delete(r.pending, k)
		r.pairs -= len(reps)
	}
	for k, t := range r.last { // forget write times that no longer hold anything back
		if now.Sub(t) >= r.WriteInterval {
			if _, ok := r.pending[k]; !ok {
				delete(r.last, k)
			}
		}
	}
	r.mu.Unlock()
	for k, reps := range due {
		wrote, err := r.write(ctx, k, reps)
		r.mu.Lock()
		if wrote {
			r.last[k] = r.Clock.Now()
			r.writes++
		}
		switch {
		case err != nil && (apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)):
			r.Log.Error(err, "writing the cooldowns of a proxy; the API server refused them as invalid, dropping its reports", "proxy", k, "reports", reps.count())
			droppedReports.WithLabelValues(DropInvalid).Add(float64(reps.count()))
			r.last[k] = r.Clock.Now()
		case err != nil:
			r.Log.Error(err, "writing the cooldowns of a proxy; keeping its reports for the next try", "proxy", k, "reports", reps.count())
			r.requeueLocked(k, reps)
			r.last[k] = r.Clock.Now() // try again after the interval, not in a busy loop
		}
		if _, ok := r.pending[k]; ok {
			if at := r.last[k].Add(r.WriteInterval); next.IsZero() || at.Before(next) {
				next = at
			}
		}
		r.mu.Unlock()
	}
	return next
}

// write applies pending to the Proxy key's cooldowns and writes them when they changed.
func (r *Recorder) write(ctx context.Context, key types.NamespacedName, pending pendingProxy) (bool, error) {
	reps := pending.reports()
	px := &v1alpha1.Proxy{}
	if err := r.Reader.Get(ctx, key, px); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil // gone: nothing to cool
		}
		return false, fmt.Errorf("reading proxy %s: %w", key, err)
	}
	policy, err := PolicyFor(ctx, r.Reader, px, r.Policy)
	if err != nil {
		return false, err
	}
	for attempt := 1; ; attempt++ {
		cds, changed := px.Status.Cooldowns, false
		unreach, results := px.Status.Unreachable, map[string]int32{}
		for _, rep := range reps {
			if rep.Outcome == Unreachable {
				st := px.Status.DeepCopy()
				st.Unreachable = unreach
				var res string
				unreach, res = UnreachableAfter(st, rep.at, rep.n, r.UnreachableHoldoff)
				n := max(rep.n, 1)
				if res == UnreachableMarked { // the first opens the mark, the others count on it
					results[res]++
					res, n = UnreachableCounted, n-1
				}
				results[res] += n
				changed = changed || res != UnreachableIgnored
				continue
			}
			var c bool
			cds, c = CooldownsAfter(cds, rep.Report, rep.at, policy)
			changed = changed || c
		}
		cds, pruned := Prune(cds, r.Clock.Now(), policy)
		if !changed && !pruned {
			countUnreachable(results)
			return false, nil
		}
		err := r.applyStatus(ctx, px, cds, unreach)
		if err == nil {
			countUnreachable(results)
			return true, nil
		}
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if !apierrors.IsConflict(err) || attempt == conflictRetries {
			return false, fmt.Errorf("applying the cooldowns of proxy %s: %w", key, err)
		}
		px = &v1alpha1.Proxy{}
		if err := r.APIReader.Get(ctx, key, px); err != nil {
			return false, fmt.Errorf("re-reading proxy %s after a conflict: %w", key, err)
		}
	}
}

// countUnreachable adds a write's unreachable reports to the metric, by result.
func countUnreachable(results map[string]int32) {
	for res, n := range results {
		unreachableReports.WithLabelValues(res).Add(float64(n))
	}
}

// feedbackStatus is the part of a Proxy's status FieldManager owns.
type feedbackStatus struct {
	Cooldowns   []v1alpha1.ProxyCooldown   `json:"cooldowns,omitempty"`
	Unreachable *v1alpha1.ProxyUnreachable `json:"unreachable,omitempty"`
}

// applyStatus writes cds as the Proxy's status.cooldowns and mark as its
// status.unreachable, the only fields FieldManager applies, if px's resourceVersion is
// still current (through statusapply, like every status writer).
func (r *Recorder) applyStatus(ctx context.Context, px *v1alpha1.Proxy, cds []v1alpha1.ProxyCooldown, mark *v1alpha1.ProxyUnreachable) error {
	return statusapply.Status(ctx, r.Client, px, &feedbackStatus{Cooldowns: cds, Unreachable: mark}, FieldManager,
		statusapply.IfVersion(px.ResourceVersion))
}

// PolicyFor is the cooldown policy of px (read through c): its pool's spec.bans over def.
func PolicyFor(ctx context.Context, c client.Reader, px *v1alpha1.Proxy, def Policy) (Policy, error) {
	p := def
	ref, ok := v1alpha1.ControllingPool(px)
	if !ok {
		return p, nil
	}
	pool := &v1alpha1.ProxyPool{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: px.Namespace, Name: ref.Name}, pool); err != nil {
		if apierrors.IsNotFound(err) {
			return p, nil
		}
		return p, fmt.Errorf("reading proxypool %s/%s of proxy %s: %w", px.Namespace, ref.Name, px.Name, err)
	}
	return PoolPolicy(pool.Spec.Bans, p), nil
}

// PoolPolicy is def with the durations b sets.
func PoolPolicy(b *v1alpha1.PoolBans, def Policy) Policy {
	if b == nil {
		return def
	}
	if b.CooldownSeconds != nil {
		def.Cooldown = time.Duration(*b.CooldownSeconds) * time.Second
	}
	if b.MaxCooldownSeconds != nil {
		def.MaxCooldown = time.Duration(*b.MaxCooldownSeconds) * time.Second
	}
	if b.RetireAfterSites != nil {
		def.RetireAfterSites = int(*b.RetireAfterSites)
	}
	if b.RetireWindowSeconds != nil {
		def.RetireWindow = time.Duration(*b.RetireWindowSeconds) * time.Second
	}
	return def
}
