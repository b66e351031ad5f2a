package proxy

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// DefaultAddressHold is how long a running instance that stops reporting its address
// keeps the last one (and its phase) before the Proxy goes back to Provisioning: a guest
// agent that misses a poll or two does not make the Proxy flap.
const DefaultAddressHold = 15 * time.Second

// addressHolds remembers since when each Proxy's running instance has reported no
// address. It lives in memory: after a restart a hold starts afresh.
type addressHolds struct {
	mu    sync.Mutex
	since map[types.UID]time.Time
}

// holdFacts are what the address hold of the Proxy uid is judged from (judgeHold): the
// clock's now and since when its running instance has reported no address.
func (r *ProxyReconciler) holdFacts(uid types.UID) holdFacts {
	r.holds.mu.Lock()
	defer r.holds.mu.Unlock()
	return holdFacts{since: r.holds.since[uid], now: r.Clock.Now()}
}

// keepHold carries out a verdict's start or end of the Proxy uid's address hold.
func (r *ProxyReconciler) keepHold(uid types.UID, v phaseVerdict) {
	r.holds.mu.Lock()
	defer r.holds.mu.Unlock()
	switch {
	case !v.holdFrom.IsZero():
		if r.holds.since == nil {
			r.holds.since = map[types.UID]time.Time{}
		}
		r.holds.since[uid] = v.holdFrom
	case v.dropHold:
		delete(r.holds.since, uid)
	}
}

// forgetAddressHold drops what the address hold remembers of a Proxy that goes away.
func (r *ProxyReconciler) forgetAddressHold(uid types.UID) {
	r.holds.mu.Lock()
	defer r.holds.mu.Unlock()
	delete(r.holds.since, uid)
}
