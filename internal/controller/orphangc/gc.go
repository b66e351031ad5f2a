package orphangc

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// Defaults of the orphan GC.
const (
	DefaultGCInterval = 10 * time.Minute
	DefaultGCGrace    = 10 * time.Minute
)

var gcDeletedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "proxy_operator_gc_deleted_total",
	Help: "Orphaned instances deleted by the garbage collector, by provider.",
}, []string{"provider"})

func init() { metrics.Registry.MustRegister(gcDeletedTotal) }

// OrphanGC deletes instances whose owning Proxy no longer exists. Every Interval it asks
// each provider for the instances carrying its ownership mark (ListByTag) and deletes
// those whose owner UID matches no Proxy and whose CreatedAt is older than Grace.
//
// What is never collected:
//   - anything ListByTag does not return: the GC deletes only what a provider lists as
//     its own, and never constructs a providerID itself;
//   - an instance younger than Grace, so a Create in flight (whose Proxy may not be in
//     the cache yet, or whose status has no providerID yet) is left alone;
//   - an instance with an empty owner UID: nothing proves it orphaned, it may be one a
//     Create has not finished labelling, and deleting on absence of evidence is the one
//     mistake GC cannot undo. It is logged once per sweep for a human to look at;
//   - an instance whose provider reports no creation time;
//   - an instance whose owner is a Proxy that still exists, whatever its status says
//     (the match is on metadata.uid, not on status.providerID).
//
// A provider whose listing fails is skipped for that sweep with one log line; the others
// continue. GC runs on the leader only.
//
// After deleting an instance, GC wakes (Wake) every Failed Proxy of the same provider
// whose instance name is the deleted one's: a Proxy deleted and applied again while its
// old instance stood has failed on that instance (OwnedByOther) and can now be created.
type OrphanGC struct {
	// Client lists Proxies (from the manager's cache).
	Client    client.Client
	Providers map[string]provider.Provider
	Interval  time.Duration
	Grace     time.Duration
	Log       logr.Logger
	// Wake, when set, has a Proxy reconciled at once (ProxyReconciler.Wake).
	Wake func(ctx context.Context, key client.ObjectKey)

	now func() time.Time
	// defaults fills the unset fields once (setDefaults).
	defaults sync.Once
}

// NeedLeaderElection is true: one replica collects.
func (g *OrphanGC) NeedLeaderElection() bool { return true }

// Start sweeps every Interval until ctx ends. The first sweep runs one interval after
// start, when the cache and the providers have settled; later ones keep to the interval
// from the start of the sweep before (a sweep longer than it is followed by the next at
// once), as a ticker would.
func (g *OrphanGC) Start(ctx context.Context) error {
	g.setDefaults()
	first := time.NewTimer(g.Interval)
	defer first.Stop()
	select {
	case <-ctx.Done():
		return nil
	case <-first.C:
	}
	wait.NonSlidingUntilWithContext(ctx, func(ctx context.Context) {
		if _, err := g.Sweep(ctx); err != nil && ctx.Err() == nil {
			g.Log.Error(err, "orphan gc sweep skipped")
		}
	}, g.Interval)
	return nil
}

// SweepResult says what one sweep did, per provider.
type SweepResult struct {
	Deleted map[string][]string // providerIDs deleted
	Skipped []string            // providers whose listing failed
}

// Sweep runs one collection over every provider, concurrently.
func (g *OrphanGC) Sweep(ctx context.Context) (SweepResult, error) {
	g.setDefaults()
	res := SweepResult{Deleted: map[string][]string{}}
	names := make([]string, 0, len(g.Providers))
	for n := range g.Providers {
		names = append(names, n)
	}
	sort.Strings(names)
	listings := make([][]provider.Instance, len(names))
	errs := make([]error, len(names))
	// Instances first, Proxies second: a Proxy created between the two reads is then
	// seen, and an instance created after the listing is not considered at all.
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			listings[i], errs[i] = g.Providers[n].ListByTag(ctx)
		}()
	}
	wg.Wait()
	owners, err := g.proxyUIDs(ctx)
	if err != nil {
		return res, err
	}
	var mu sync.Mutex
	for i, n := range names {
		if errs[i] != nil {
			g.Log.Error(errs[i], "orphan gc: listing instances failed, skipping provider this sweep", "provider", n)
			res.Skipped = append(res.Skipped, n)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			deleted := g.collect(ctx, n, g.Providers[n], listings[i], owners)
			mu.Lock()
			if len(deleted) > 0 {
				res.Deleted[n] = deleted
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return res, nil
}

// proxyOwners is what a sweep knows of the Proxies: their UIDs, and the Failed ones by
// provider and instance name (the Proxies an instance's deletion may unblock).
type proxyOwners struct {
	uids   map[string]bool
	failed map[[2]string][]client.ObjectKey
}

func (g *OrphanGC) proxyUIDs(ctx context.Context) (proxyOwners, error) {
	var list v1alpha1.ProxyList
	if err := g.Client.List(ctx, &list); err != nil {
		return proxyOwners{}, fmt.Errorf("orphan gc: listing proxies: %w", err)
	}
	o := proxyOwners{uids: make(map[string]bool, len(list.Items)), failed: map[[2]string][]client.ObjectKey{}}
	for i := range list.Items {
		px := &list.Items[i]
		o.uids[string(px.UID)] = true
		if px.Status.Phase == v1alpha1.PhaseFailed {
			k := [2]string{px.Spec.Provider, px.InstanceName()}
			o.failed[k] = append(o.failed[k], client.ObjectKeyFromObject(px))
		}
	}
	return o, nil
}

// collect deletes the orphans among one provider's instances and returns their IDs.
func (g *OrphanGC) collect(ctx context.Context, name string, p provider.Provider, insts []provider.Instance, owners proxyOwners) []string {
	grace := g.Grace
	now := g.now()
	var deleted []string
	for _, in := range insts {
		log := g.Log.WithValues("provider", name, "providerID", in.ProviderID, "instance", in.Name, "uid", in.UID)
		switch {
		case in.UID == "":
			log.Info("orphan gc: instance carries no owner uid, leaving it alone")
			continue
		case owners.uids[in.UID]:
			continue
		case in.CreatedAt.IsZero() || now.Sub(in.CreatedAt) < grace:
			// An unknown (zero) CreatedAt never ages: unknown age is no proof of age.
			log.V(1).Info("orphan gc: unowned instance within the grace period", "createdAt", in.CreatedAt)
			continue
		}
		if err := p.Delete(ctx, in.ProviderID); err != nil {
			log.Error(err, "orphan gc: deleting orphaned instance failed; retrying next sweep")
			continue
		}
		gcDeletedTotal.WithLabelValues(name).Inc()
		log.Info("orphan gc: deleted orphaned instance", "createdAt", in.CreatedAt, "age", now.Sub(in.CreatedAt).Round(time.Second))
		deleted = append(deleted, in.ProviderID)
		for _, key := range owners.failed[[2]string{name, in.Name}] {
			if g.Wake != nil {
				log.Info("orphan gc: waking the failed proxy the deleted instance blocked", "proxy", key)
				g.Wake(ctx, key)
			}
		}
	}
	return deleted
}

// setDefaults fills, once, what was left unset: Interval and Grace (their defaults) and
// the time (the real clock's). Start and Sweep call it.
func (g *OrphanGC) setDefaults() {
	g.defaults.Do(func() {
		if g.Interval <= 0 {
			g.Interval = DefaultGCInterval
		}
		if g.Grace <= 0 {
			g.Grace = DefaultGCGrace
		}
		if g.now == nil {
			g.now = time.Now
		}
	})
}
