package demand

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationv1ac "k8s.io/client-go/applyconfigurations/coordination/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/autoscale"
)

// The Reporter's defaults.
const (
	// DefaultReportInterval is the least time between two writes of changed numbers for
	// one pool.
	DefaultReportInterval = 15 * time.Second
	// DefaultRefresh is the age at which unchanged numbers are written again: half of
	// the age at which the autoscaler stops counting them.
	DefaultRefresh = autoscale.DefaultStaleAfter / 2
	// DefaultWakeInterval is the least time between two writes for one pool when held
	// requests appear (a wake).
	DefaultWakeInterval = time.Second
	// FieldManager is the field manager of the Reporter's writes.
	FieldManager = "egress-proxies-demand"
)

// Reporter writes one measurer's demand Leases, within the write bound (see the package
// doc). Report it the numbers as they change (or on a tick), and run Start (or call Flush
// on a tick) so that numbers held back by the bound are written when due. It is safe for
// concurrent use.
type Reporter struct {
	// Client writes the Leases.
	Client client.Client
	// Namespace is the demand namespace, where every Lease is written (see the package
	// doc); the pool's own namespace is in the Lease's labels.
	Namespace string
	// Source is the measurer's id (made DNS-safe with SourceID), Kind its kind
	// (KindGateway or KindDiscovery).
	Source, Kind string
	// Clock: nil is the real clock.
	Clock clock.WithTicker
	// ReportInterval, Refresh and WakeInterval: 0 is the default.
	ReportInterval, Refresh, WakeInterval time.Duration

	mu    sync.Mutex
	pools map[types.NamespacedName]*poolReport
}

type poolReport struct {
	current, written Measure
	// wroteAt is when written was written (zero: never).
	wroteAt time.Time
}

// NewReporter is a Reporter for source of kind writing through c into the demand
// namespace namespace, with the defaults.
func NewReporter(c client.Client, namespace, kind, source string) *Reporter {
	return &Reporter{Client: c, Namespace: namespace, Kind: kind, Source: source}
}

func (r *Reporter) clock() clock.WithTicker {
	if r.Clock != nil {
		return r.Clock
	}
	return clock.RealClock{}
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Report records m as the measurer's numbers for pool now, and writes them if they are
// due. It says whether it wrote.
func (r *Reporter) Report(ctx context.Context, pool types.NamespacedName, m Measure) (bool, error) {
	r.mu.Lock()
	if r.pools == nil {
		r.pools = map[types.NamespacedName]*poolReport{}
	}
	p := r.pools[pool]
	if p == nil {
		p = &poolReport{}
		r.pools[pool] = p
	}
	p.current = m.rounded()
	w, ok := r.take(pool, p, r.clock().Now())
	r.mu.Unlock()
	if !ok {
		return false, nil
	}
	return true, r.write(ctx, w)
}

// Forget stops reporting pool (deleted, or no longer measured here). Its Lease stays, and
// goes stale.
func (r *Reporter) Forget(pool types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pools, pool)
}

// Flush writes the numbers of every pool that are due, and returns the errors of the
// writes that failed (those pools are tried again on the next Flush or Report).
func (r *Reporter) Flush(ctx context.Context) error {
	now := r.clock().Now()
	var due []pending
	r.mu.Lock()
	for pool, p := range r.pools {
		if w, ok := r.take(pool, p, now); ok {
			due = append(due, w)
		}
	}
	r.mu.Unlock()
	var errs []error
	for _, w := range due {
		errs = append(errs, r.write(ctx, w))
	}
	return errors.Join(errs...)
}

// Start flushes once a second until ctx ends (a manager.Runnable).
func (r *Reporter) Start(ctx context.Context) error {
	t := r.clock().NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			_ = r.Flush(ctx) // failed writes are tried again on the next tick
		}
	}
}

// pending is one write taken under the lock.
type pending struct {
	pool     types.NamespacedName
	m        Measure
	at, prev time.Time
	prevM    Measure
}

// take decides whether p's numbers are due at now and, when they are, marks them written
// (undone by write if the write fails). Called with r.mu held.
func (r *Reporter) take(pool types.NamespacedName, p *poolReport, now time.Time) (pending, bool) {
	if !r.due(p, now) {
		return pending{}, false
	}
	w := pending{pool: pool, m: p.current, at: now, prev: p.wroteAt, prevM: p.written}
	p.written, p.wroteAt = p.current, now
	return w, true
}

// due is the write bound.
func (r *Reporter) due(p *poolReport, now time.Time) bool {
	never := p.wroteAt.IsZero()
	since := now.Sub(p.wroteAt)
	switch {
	case never && p.current.Zero():
		return false
	case p.current.Held > 0 && p.written.Held == 0:
		return never || since >= orDefault(r.WakeInterval, DefaultWakeInterval)
	case p.current != p.written:
		return never || since >= orDefault(r.ReportInterval, DefaultReportInterval)
	default:
		return since >= orDefault(r.Refresh, DefaultRefresh)
	}
}

// write applies the Lease of w; on failure it marks w's numbers unwritten again.
func (r *Reporter) write(ctx context.Context, w pending) error {
	if r.Namespace == "" {
		return fmt.Errorf("writing the demand of pool %s: the Reporter has no demand namespace", w.pool)
	}
	err := r.Client.Apply(ctx, Lease(r.Namespace, w.pool, r.Kind, r.Source, w.m, w.at), client.FieldOwner(FieldManager), client.ForceOwnership)
	if err == nil {
		return nil
	}
	r.mu.Lock()
	if p := r.pools[w.pool]; p != nil && p.wroteAt.Equal(w.at) {
		p.written, p.wroteAt = w.prevM, w.prev
	}
	r.mu.Unlock()
	return fmt.Errorf("writing the demand of pool %s (Lease %s/%s): %w", w.pool, r.Namespace, LeaseName(w.pool, r.Source), err)
}

// Lease is the apply configuration of source's demand Lease for pool, in the demand
// namespace namespace: m measured at at.
func Lease(namespace string, pool types.NamespacedName, kind, source string, m Measure, at time.Time) *coordinationv1ac.LeaseApplyConfiguration {
	m = m.rounded()
	return coordinationv1ac.Lease(LeaseName(pool, source), namespace).
		WithLabels(map[string]string{LabelFor: pool.Name, LabelNamespace: pool.Namespace, LabelSource: kind}).
		WithAnnotations(map[string]string{
			AnnotationSessions:          formatDecimal(m.Sessions),
			AnnotationHeld:              fmt.Sprint(m.Held),
			AnnotationRequestsPerSecond: formatDecimal(m.RequestsPerSecond),
		}).
		WithSpec(coordinationv1ac.LeaseSpec().
			WithHolderIdentity(SourceID(source)).
			WithRenewTime(metav1.NewMicroTime(at)))
}
