package discovery

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/access"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
)

// ZeroPoolRetryAfter is the Retry-After of pick's 503 for a pool with no serving proxy
// (Options.Pools): about the time a crawler can wait before asking again while the pool's
// first child starts.
const ZeroPoolRetryAfter = 10 * time.Second

// PickRecorder hears of picks per pool. Its methods must not block: pick calls them on
// the request's path.
type PickRecorder interface {
	// Picked: a pick chose a proxy of pool (woken false), or was refused because pool has
	// no serving proxy (woken true: a wake).
	Picked(pool types.NamespacedName, woken bool)
}

// zeroPool is the answer to a pick naming a pool that exists but has no serving proxy:
// the pool (in the pick's namespace, or the first by name of the namespaces c may read
// that hold a pool of that name) and true; false when there is none such (the pool does
// not exist, or has a serving proxy that the pick's other filters left out).
func (s *Server) zeroPool(ctx context.Context, c *access.Caller, snap *Snapshot, req *request) (types.NamespacedName, bool) {
	name, ns := req.filter.pool, req.filter.namespace
	var candidates []string
	if ns != "" {
		p := &v1alpha1.ProxyPool{}
		err := s.opts.Pools.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, p)
		if err != nil {
			if !apierrors.IsNotFound(err) {
				s.opts.Log.Error(err, "discovery api: reading a pool", "pool", ns+"/"+name)
			}
			return types.NamespacedName{}, false
		}
		if p.DeletionTimestamp == nil {
			candidates = []string{ns}
		}
	} else {
		var list v1alpha1.ProxyPoolList
		if err := s.opts.Pools.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
			s.opts.Log.Error(err, "discovery api: listing pools")
			return types.NamespacedName{}, false
		}
		for i := range list.Items {
			if p := &list.Items[i]; p.Name == name && p.DeletionTimestamp == nil {
				candidates = append(candidates, p.Namespace)
			}
		}
		slices.Sort(candidates)
	}
	for _, pns := range candidates {
		if snap.serves(name, pns) {
			continue
		}
		// A pick naming its namespace was authorized for it already; otherwise the caller
		// must be one that may list proxies in the pool's namespace.
		if ns == "" && c != nil && !c.AllNamespaces {
			if s.opts.Access == nil {
				continue
			}
			if d, err := s.opts.Access.Allowed(ctx, c, access.Attributes{Verb: attrList.Verb, Group: attrList.Group,
				Resource: attrList.Resource, Namespace: pns}); err != nil || !d.Allowed {
				continue
			}
		}
		return types.NamespacedName{Namespace: pns, Name: name}, true
	}
	return types.NamespacedName{}, false
}

// serves reports whether a published, healthy proxy of pool in ns is in the snapshot.
func (s *Snapshot) serves(pool, ns string) bool {
	for i := range s.items {
		if it := &s.items[i]; it.Pool == pool && it.Namespace == ns && it.Healthy {
			return true
		}
	}
	return false
}

// zeroPoolError is pick's answer for a pool with no serving proxy.
func zeroPoolError(pool types.NamespacedName) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, Parameter: paramPool, retryAfter: int(ZeroPoolRetryAfter / time.Second),
		Message: fmt.Sprintf("pool %s has no serving proxy yet; retry after %s", pool, ZeroPoolRetryAfter)}
}

// PickDemand is discovery's demand per pool, written through a demand.Reporter (source
// kind discovery): the picks per second that chose a pool's proxy as its requests per
// second, and the picks refused for the pool at zero (wakes) within the last interval as
// its held requests. A wake is handed to the Reporter at once (which writes it at once:
// held going from 0 to more); the rest every Interval. Picked only counts and never
// blocks; Start (a manager Runnable on every replica) does the reporting.
type PickDemand struct {
	Reporter *demand.Reporter
	// Interval is how often the counts are reported; 0: demand.DefaultReportInterval.
	Interval time.Duration
	Log      logr.Logger

	mu    sync.Mutex
	pools map[types.NamespacedName]*pickCounts
	last  time.Time
	kick  chan struct{}
	once  sync.Once
}

type pickCounts struct {
	picks, wakes int
	// woke: a wake not yet reported; reported: the last report was not all zero.
	woke, reported bool
}

var _ PickRecorder = (*PickDemand)(nil)

func (p *PickDemand) init() {
	p.once.Do(func() {
		p.pools = map[types.NamespacedName]*pickCounts{}
		p.kick = make(chan struct{}, 1)
		p.last = time.Now()
	})
}

// Picked counts one pick for pool; a wake also wakes Start.
func (p *PickDemand) Picked(pool types.NamespacedName, woken bool) {
	p.init()
	p.mu.Lock()
	c := p.pools[pool]
	if c == nil {
		c = &pickCounts{}
		p.pools[pool] = c
	}
	c.picks++
	if woken {
		c.wakes++
		c.woke = true
	}
	p.mu.Unlock()
	if woken {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// Start reports until ctx ends.
func (p *PickDemand) Start(ctx context.Context) error {
	p.init()
	interval := p.Interval
	if interval <= 0 {
		interval = demand.DefaultReportInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.kick:
			p.report(ctx, false)
		case <-t.C:
			p.report(ctx, true)
		}
	}
}

// NeedLeaderElection is false: every replica reports the picks it answered.
func (*PickDemand) NeedLeaderElection() bool { return false }

// report hands the Reporter the pools with a wake not yet reported, or with all of
// them and starts a new interval.
func (p *PickDemand) report(ctx context.Context, interval bool) {
	now := time.Now()
	type item struct {
		pool types.NamespacedName
		m    demand.Measure
	}
	var out []item
	p.mu.Lock()
	elapsed := now.Sub(p.last).Seconds()
	for pool, c := range p.pools {
		if !interval && !c.woke {
			continue
		}
		m := demand.Measure{Held: int32(c.wakes)}
		if elapsed > 0 {
			m.RequestsPerSecond = float64(c.picks) / elapsed
		}
		c.woke = false
		if !interval {
			out = append(out, item{pool, m})
			c.reported = true
			continue
		}
		if m.Zero() {
			if c.reported {
				out = append(out, item{pool, m})
			}
			delete(p.pools, pool)
			continue
		}
		out = append(out, item{pool, m})
		c.picks, c.wakes, c.reported = 0, 0, true
	}
	if interval {
		p.last = now
	}
	p.mu.Unlock()
	for _, it := range out {
		if _, err := p.Reporter.Report(ctx, it.pool, it.m); err != nil {
			p.Log.Error(err, "reporting the picks of a pool", "pool", it.pool.String())
		}
	}
}
