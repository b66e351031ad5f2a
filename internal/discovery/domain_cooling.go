package discovery

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
)

// The ?domain= cooling index: which proxies of a snapshot cool for a site, cached per
// snapshot and site until the soonest of their cooldowns ends, and the saturation check
// of a request with ?domain= built on it. POST /v1/feedback, whose reports become those
// cooldowns, is in feedback_handler.go.

// coolingFor reports whether the item is cooling for site at now.
func (it *item) coolingFor(site string, now time.Time) bool {
	_, cooling := bans.CoolingUntil(it.cooldowns, site, now)
	return cooling
}

// saturation counts, for a request filtered by f with a ?domain=, the proxies it
// matches whatever their cooldowns and those of them cooling for its site, with the
// soonest end of those cooldowns. It also gives f the site's candidates (the proxies not
// cooling for it), which every scan of the request then goes over instead of all items.
func (s *Snapshot) saturation(f *filter) (matched, cooling int, soonest time.Time) {
	g := *f
	g.site = ""
	sc := s.siteCooling(f.site, f.now)
	f.cands, f.candsSet = sc.cands, true
	if g.empty() {
		return s.healthy, sc.healthy, sc.healthySoonest
	}
	for _, it := range s.all {
		if g.match(it) {
			matched++
		}
	}
	for _, c := range sc.items {
		if !g.match(c.it) {
			continue
		}
		cooling++
		if soonest.IsZero() || c.until.Before(soonest) {
			soonest = c.until
		}
	}
	return matched, cooling, soonest
}

// siteCool is which proxies of a snapshot cool for one site, worked out at from and
// true until validUntil, the soonest end among their cooldowns: a snapshot's cooldowns
// only end (a new one comes with a new snapshot), so in between the set stays as it is.
// A zero validUntil holds for good: nothing cools, and nothing can start to.
type siteCool struct {
	// cands is the snapshot's items not cooling for the site, in snapshot order: what
	// a request for the site scans, so that it does a plain request's work over fewer
	// items. With nothing cooling, it is Snapshot.all itself.
	cands          []*item
	items          []coolingItem // the cooling ones
	healthy        int           // how many of them are healthy
	healthySoonest time.Time     // the soonest end among the healthy ones
	from           time.Time
	validUntil     time.Time
}

type coolingItem struct {
	it    *item
	until time.Time
}

// holds reports whether sc is still the answer at now.
func (sc *siteCool) holds(now time.Time) bool {
	return !now.Before(sc.from) && (sc.validUntil.IsZero() || now.Before(sc.validUntil))
}

// siteCooling is the site's siteCool at now, from the snapshot's cache while it holds.
func (s *Snapshot) siteCooling(site string, now time.Time) *siteCool {
	held := s.bySite[site]
	if len(held) == 0 {
		return s.noneCooling // no proxy has a cooldown for the site, whatever the time
	}
	if v, ok := s.cooling.Load(site); ok {
		if sc := v.(*siteCool); sc.holds(now) {
			return sc
		}
	}
	sc := &siteCool{from: now, items: make([]coolingItem, 0, len(held))}
	for _, it := range held {
		until, cool := bans.CoolingUntil(it.cooldowns, site, now)
		if !cool {
			continue
		}
		sc.items = append(sc.items, coolingItem{it, until})
		if sc.validUntil.IsZero() || until.Before(sc.validUntil) {
			sc.validUntil = until
		}
		if it.Healthy {
			sc.healthy++
			if sc.healthySoonest.IsZero() || until.Before(sc.healthySoonest) {
				sc.healthySoonest = until
			}
		}
	}
	if len(sc.items) == 0 {
		sc.cands = s.all
	} else {
		out := make([]uint64, (len(s.items)+63)/64) // by item index; only while building
		for _, c := range sc.items {
			out[c.it.idx>>6] |= 1 << (uint(c.it.idx) & 63)
		}
		sc.cands = make([]*item, 0, len(s.items)-len(sc.items))
		for _, it := range s.all {
			if out[it.idx>>6]&(1<<(uint(it.idx)&63)) == 0 {
				sc.cands = append(sc.cands, it)
			}
		}
	}
	s.cooling.Store(site, sc)
	return sc
}

// saturated stamps a ?domain= request's filter with the time its cooldowns are judged
// at, and returns the 503 with Retry-After when more than the allowed share of the
// proxies matching the request are cooling for its site: handing the crawl to the last
// few would only get them banned too. nil: not saturated.
func (s *Server) saturated(ctx context.Context, snap *Snapshot, f *filter, endpoint string) *apiError {
	if f.site == "" {
		return nil
	}
	f.now = s.opts.Clock.Now()
	matched, cooling, soonest := snap.saturation(f)
	if cooling == 0 {
		return nil
	}
	pct := s.maxCoolingPercent(ctx, snap, f)
	if !bans.Saturated(cooling, matched, pct) {
		return nil
	}
	saturatedAnswers.WithLabelValues(endpoint).Inc()
	retry := max(1, int(math.Ceil(soonest.Sub(f.now).Seconds())))
	return &apiError{status: http.StatusServiceUnavailable, Parameter: paramDomain, retryAfter: retry, site: f.site,
		Message: fmt.Sprintf("site %s is saturated: %d of the %d proxies matching the request are cooling for it, more than %d%%; retry in %ds, when the first cooldown ends",
			f.site, cooling, matched, pct, retry)}
}

// maxCoolingPercent is the saturation threshold of a request: that of the pool it names
// with ?pool= (looked up in ?namespace=, or the namespace of the first proxy it matches),
// else the server's.
func (s *Server) maxCoolingPercent(ctx context.Context, snap *Snapshot, f *filter) int {
	pct := s.opts.MaxCoolingPercent
	if pct <= 0 {
		pct = bans.DefaultMaxCoolingPercent
	}
	if f.pool == "" || s.opts.PoolBans == nil {
		return pct
	}
	ns := f.namespace
	if ns == "" {
		g := *f
		g.site = ""
		for i := range snap.items {
			if g.match(&snap.items[i]) {
				ns = snap.items[i].Namespace
				break
			}
		}
	}
	if b := s.opts.PoolBans(ctx, types.NamespacedName{Namespace: ns, Name: f.pool}); b != nil && b.MaxCoolingPercent != nil {
		return int(*b.MaxCoolingPercent)
	}
	return pct
}

// cooldownsOf is what discovery keeps of a Proxy's cooldowns.
func cooldownsOf(px *v1alpha1.Proxy) []v1alpha1.ProxyCooldown {
	if len(px.Status.Cooldowns) == 0 {
		return nil
	}
	return append([]v1alpha1.ProxyCooldown(nil), px.Status.Cooldowns...)
}
