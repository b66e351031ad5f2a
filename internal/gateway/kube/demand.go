package kube

import (
	"context"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gateway"
)

// DemandReporter is the gateway's DemandRecorder writing the demand Leases through a
// demand.Reporter (source kind gateway). Record only keeps the newest numbers of each
// pool and wakes one goroutine (Start), which hands them to the Reporter; so the
// gateway's request path never waits for the API server, and a burst of held requests
// makes one report per pool, not one per request. The Reporter's own bound decides what
// is written: a wake (held going from 0 to more) at once, the rest at most every 15 s.
type DemandReporter struct {
	Reporter *demand.Reporter
	Log      logr.Logger

	mu     sync.Mutex
	latest map[types.NamespacedName]demand.Measure
	kick   chan struct{}
}

var _ gateway.DemandRecorder = (*DemandReporter)(nil)

// NewDemandReporter reports through r.
func NewDemandReporter(r *demand.Reporter, log logr.Logger) *DemandReporter {
	return &DemandReporter{Reporter: r, Log: log, latest: map[types.NamespacedName]demand.Measure{}, kick: make(chan struct{}, 1)}
}

// Record keeps d as its pool's newest demand and wakes Start. It never blocks.
func (d *DemandReporter) Record(p gateway.PoolDemand) {
	d.mu.Lock()
	d.latest[types.NamespacedName{Namespace: p.Namespace, Name: p.Pool}] = demand.Measure{
		Sessions: float64(p.Sessions), Held: int32(p.Held), RequestsPerSecond: p.RequestsPerSecond}
	d.mu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// Start reports what Record kept until ctx ends (a manager Runnable).
func (d *DemandReporter) Start(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.kick:
		}
		d.mu.Lock()
		batch := d.latest
		d.latest = map[types.NamespacedName]demand.Measure{}
		d.mu.Unlock()
		for pool, m := range batch {
			if wrote, err := d.Reporter.Report(ctx, pool, m); err != nil {
				d.Log.Error(err, "reporting the demand of a pool", "pool", pool.String())
			} else if wrote {
				d.Log.V(1).Info("demand reported", "pool", pool.String(), "sessions", m.Sessions, "held", m.Held, "requestsPerSecond", m.RequestsPerSecond)
			}
		}
	}
}

// NeedLeaderElection is false: every replica reports its own demand.
func (*DemandReporter) NeedLeaderElection() bool { return false }
