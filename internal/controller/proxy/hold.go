package proxy

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
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

// holdAddress reports whether the Proxy keeps its last address and phase while inst,
// its running instance, reports none, and for how much longer. It holds only an instance
// the Proxy has already seen at an address (Running or Ready), for AddressHold
// (DefaultAddressHold) from the first reconcile that saw the address missing.
func (r *ProxyReconciler) holdAddress(s *scope, inst provider.Instance) (time.Duration, bool) {
	px := s.px
	r.holds.mu.Lock()
	defer r.holds.mu.Unlock()
	lost := inst.State == provider.StateRunning && inst.IP == "" && px.Status.IP != "" &&
		inst.ProviderID == px.Status.ProviderID &&
		(px.Status.Phase == v1alpha1.PhaseRunning || px.Status.Phase == v1alpha1.PhaseReady)
	if !lost {
		delete(r.holds.since, px.UID)
		return 0, false
	}
	now := r.Clock.Now()
	since, ok := r.holds.since[px.UID]
	if !ok {
		if r.holds.since == nil {
			r.holds.since = map[types.UID]time.Time{}
		}
		since = now
		r.holds.since[px.UID] = now
		s.log.Info("running instance reports no address; keeping the last one for a while",
			"ip", px.Status.IP, "hold", r.AddressHold)
	}
	left := r.AddressHold - now.Sub(since)
	if left <= 0 {
		delete(r.holds.since, px.UID)
		return 0, false
	}
	return left, true
}

// forgetAddressHold drops what holdAddress remembers of a Proxy that goes away.
func (r *ProxyReconciler) forgetAddressHold(uid types.UID) {
	r.holds.mu.Lock()
	defer r.holds.mu.Unlock()
	delete(r.holds.since, uid)
}
