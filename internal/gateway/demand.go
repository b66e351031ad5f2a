package gateway

import (
	"context"
	"sync"
	"time"
)

// DefaultDemandInterval is how often RunDemand measures each pool's demand (Config.DemandInterval).
const DefaultDemandInterval = 15 * time.Second

// demand counts, per pool, what the gateway carries for it now: open tunnels, held
// requests, and the requests and tunnels taken since the last measurement.
type demand struct {
	mu    sync.Mutex
	pools map[poolKey]*poolCounts
	last  time.Time
}

type poolCounts struct {
	tunnels, held, requests int
	rps                     float64
	// reported: the last measurement of the pool was not all zero.
	reported bool
}

func newDemand() *demand { return &demand{pools: map[poolKey]*poolCounts{}, last: time.Now()} }

func (d *demand) counts(key poolKey) *poolCounts {
	c := d.pools[key]
	if c == nil {
		c = &poolCounts{}
		d.pools[key] = c
	}
	return c
}

// enter counts one more held request for key unless it holds max already.
func (d *demand) enter(key poolKey, max int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.counts(key)
	if c.held >= max {
		return false
	}
	c.held++
	return true
}

func (d *demand) leave(key poolKey) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.counts(key).held--
}

func (d *demand) tunnel(key poolKey, delta int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.counts(key).tunnels += delta
}

func (d *demand) request(key poolKey) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.counts(key).requests++
}

// countDemand counts rt once in its pool's requests per second.
func (g *Gateway) countDemand(rt *route) {
	if rt.counted || rt.demand.pool == "" {
		return
	}
	rt.counted = true
	g.demand.request(rt.demand)
}

// poolDemandNow is key's demand now, with the request rate of the last measurement.
func (g *Gateway) poolDemandNow(key poolKey) PoolDemand {
	live := g.sessions.perPool()[key]
	g.demand.mu.Lock()
	defer g.demand.mu.Unlock()
	c := g.demand.counts(key)
	if c.held > 0 {
		c.reported = true // its zero is measured later
	}
	return PoolDemand{Namespace: key.namespace, Pool: key.pool, Sessions: c.tunnels + live, Held: c.held, RequestsPerSecond: c.rps}
}

// MeasureDemand measures every pool's demand now: its open tunnels plus live sessions,
// held requests, and the requests and tunnels per second since the last measurement. A
// pool with none is in the answer once (all zero) after it had some, then no more. It
// sets the per-pool gauges.
func (g *Gateway) MeasureDemand() []PoolDemand {
	live := g.sessions.perPool()
	now := time.Now()
	g.demand.mu.Lock()
	defer g.demand.mu.Unlock()
	for key := range live {
		g.demand.counts(key)
	}
	elapsed := now.Sub(g.demand.last).Seconds()
	g.demand.last = now
	var out []PoolDemand
	for key, c := range g.demand.pools {
		c.rps = 0
		if elapsed > 0 {
			c.rps = float64(c.requests) / elapsed
		}
		c.requests = 0
		d := PoolDemand{Namespace: key.namespace, Pool: key.pool, Sessions: c.tunnels + live[key], Held: c.held, RequestsPerSecond: c.rps}
		zero := d.Sessions == 0 && d.Held == 0 && d.RequestsPerSecond == 0
		if zero {
			if c.reported {
				out = append(out, d)
			}
			delete(g.demand.pools, key)
			g.metrics.poolSessions.DeleteLabelValues(key.namespace, key.pool)
			g.metrics.poolRPS.DeleteLabelValues(key.namespace, key.pool)
			g.metrics.held.DeleteLabelValues(key.namespace, key.pool)
			continue
		}
		c.reported = true
		out = append(out, d)
		g.metrics.poolSessions.WithLabelValues(key.namespace, key.pool).Set(float64(d.Sessions))
		g.metrics.poolRPS.WithLabelValues(key.namespace, key.pool).Set(d.RequestsPerSecond)
	}
	return out
}

// RunDemand measures the demand every Config.DemandInterval until ctx ends and hands
// each pool's to Config.Demand.
func (g *Gateway) RunDemand(ctx context.Context) {
	t := time.NewTicker(g.cfg.DemandInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, d := range g.MeasureDemand() {
			if g.cfg.Demand != nil {
				g.cfg.Demand.Record(d)
			}
		}
	}
}
