package health

import (
	"context"
	"fmt"
	"net/netip"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// expectedEgress is the exit address px's WireGuard Secret states (its key egressIP), or
// the zero Addr when px has no WireGuard egress, the Secret states none, or the engine has
// no Options.WireGuard. A Secret that cannot be read fails the probe, as a credentials
// Secret does: what the proxy must leave from is not known.
func (e *Engine) expectedEgress(ctx context.Context, px *v1alpha1.Proxy) (netip.Addr, error) {
	if e.opts.WireGuard == nil {
		return netip.Addr{}, nil
	}
	if name, _ := px.WireGuardRef(); name == "" {
		return netip.Addr{}, nil
	}
	wg, err := e.opts.WireGuard(ctx, px)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("egress check of the probe of %s: %w", client.ObjectKeyFromObject(px), err)
	}
	if wg == nil {
		return netip.Addr{}, nil
	}
	return wg.EgressIP, nil
}

// verifyEgress turns a successful probe r through the proxy at host into an EgressMismatch
// failure when want is set and the probe target saw another address. A target that
// reports no address cannot be checked: the probe stands as it is.
func verifyEgress(r result, want netip.Addr, host string) result {
	if r.err != nil || !want.IsValid() || r.egressIP == "" {
		return r
	}
	if got, err := netip.ParseAddr(r.egressIP); err == nil && got.Unmap() == want {
		r.verified = true
		return r
	}
	r.err = fmt.Errorf("probe through %s: the probe target saw the proxy leave from %s, but its WireGuard Secret states egressIP %s: "+
		"its traffic does not go through that exit", host, r.egressIP, want)
	r.reason = v1alpha1.ReasonEgressMismatch
	return r
}
