package hcloud

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"

	hc "github.com/hetznercloud/hcloud-go/v2/hcloud"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// firewallRanges are the sources the Proxy's firewall admits: the request's, else the
// config's. None is permanent, naming both fields, and so is a mix of IPv4 and IPv6 on an
// entry without IPv6, whose servers have no IPv6 address to admit them to.
func (p *Provider) firewallRanges(req provider.CreateRequest) ([]net.IPNet, error) {
	ranges, from := req.SourceRanges, "spec.proxy.allowedSourceRanges"
	if len(ranges) == 0 {
		ranges, from = p.cfg.Firewall.SourceRanges, "hcloud.firewall.sourceRanges"
	}
	if len(ranges) == 0 {
		return nil, provider.Errorf(provider.ErrPermanent,
			"firewall %s: no source ranges (set spec.proxy.allowedSourceRanges or hcloud.firewall.sourceRanges)", req.Name)
	}
	if msg := provider.HCloudMixedFamilies(ranges); msg != "" && !p.cfg.HasIPv6() {
		return nil, provider.Errorf(provider.ErrPermanent, "firewall %s: %s %s", req.Name, from, msg)
	}
	out := make([]net.IPNet, 0, len(ranges))
	for i, r := range ranges {
		_, n, err := net.ParseCIDR(r)
		if err != nil {
			return nil, provider.Errorf(provider.ErrPermanent, "firewall %s: %s[%d] %q is not a CIDR", req.Name, from, i, r)
		}
		out = append(out, *n)
	}
	return out, nil
}

// firewallRules are the rules of the Proxy's firewall: TCP on the proxy port, in, from
// ranges. A server with a firewall applied takes no other inbound traffic.
func firewallRules(req provider.CreateRequest, ranges []net.IPNet) []hc.FirewallRule {
	return []hc.FirewallRule{{
		Direction: hc.FirewallRuleDirectionIn, Protocol: hc.FirewallRuleProtocolTCP,
		Port: hc.Ptr(strconv.Itoa(int(req.Port))), SourceIPs: ranges,
		Description: hc.Ptr("egress proxy " + req.Name),
	}}
}

// ensureFirewall makes the Proxy's firewall, named after its server, admitting the proxy
// port from its sources, and returns it. One of this install's made for other sources,
// another port or another Proxy has its labels and rules set anew; one that is not this
// install's is permanent and left alone.
func (p *Provider) ensureFirewall(ctx context.Context, c *hc.Client, req provider.CreateRequest) (*hc.Firewall, error) {
	ranges, err := p.firewallRanges(req)
	if err != nil {
		return nil, err
	}
	rules := firewallRules(req, ranges)
	labels := p.labels(req.UID, req.SpecHash)
	labels[LabelServer] = req.Name
	fw, err := p.getFirewall(ctx, c, req.Name)
	if err != nil {
		return nil, notNotFound(err)
	}
	if fw == nil {
		res, _, err := c.Firewall.Create(ctx, hc.FirewallCreateOpts{Name: req.Name, Labels: labels, Rules: rules})
		switch {
		case errors.Is(p.classify(err, ""), errAlreadyExists):
			// Made meanwhile (a concurrent Create): read it and judge it.
			if fw, err = p.getFirewall(ctx, c, req.Name); err != nil || fw == nil {
				return nil, provider.Errorf(provider.ErrTransient, "firewall %s: made meanwhile, then not readable: %v", req.Name, err)
			}
		case err != nil:
			return nil, referenceMissing(p.classify(err, "creating firewall "+req.Name))
		default:
			if err := c.Action.WaitFor(ctx, res.Actions...); err != nil {
				return nil, p.classify(err, "creating firewall "+req.Name)
			}
			return res.Firewall, nil
		}
	}
	if p.owner(fw.Labels) != ownedHere || fw.Labels[LabelServer] != req.Name {
		return nil, provider.Errorf(provider.ErrPermanent,
			"firewall %s exists but is not this install's (labels %s=%q, %s=%q, %s=%q): it is left alone; remove or rename it",
			fw.Name, LabelProvider, fw.Labels[LabelProvider], LabelInstall, fw.Labels[LabelInstall], LabelServer, fw.Labels[LabelServer])
	}
	if fw.Labels[LabelUID] != labels[LabelUID] {
		if _, _, err := c.Firewall.Update(ctx, fw, hc.FirewallUpdateOpts{Labels: labels}); err != nil {
			return nil, notNotFound(p.classify(err, "relabelling firewall "+fw.Name))
		}
	}
	if !rulesMatch(fw.Rules, rules) {
		acts, _, err := c.Firewall.SetRules(ctx, fw, hc.FirewallSetRulesOpts{Rules: rules})
		if err != nil {
			return nil, notNotFound(p.classify(err, "setting the rules of firewall "+fw.Name))
		}
		if err := c.Action.WaitFor(ctx, acts...); err != nil {
			return nil, p.classify(err, "setting the rules of firewall "+fw.Name)
		}
	}
	return fw, nil
}

// refirewall puts the Proxy's firewall back on an adopted server that has none (removed in
// the Console, or deleted): it is made or brought up to date and applied. A server that
// has a firewall costs no call.
func (p *Provider) refirewall(ctx context.Context, c *hc.Client, srv *hc.Server, req provider.CreateRequest) error {
	if !p.cfg.ManagesFirewall() || len(srv.PublicNet.Firewalls) > 0 {
		return nil
	}
	fw, err := p.ensureFirewall(ctx, c, req)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("applying firewall %s to %s", fw.Name, describe(srv))
	acts, _, err := c.Firewall.ApplyResources(ctx, fw, []hc.FirewallResource{{
		Type: hc.FirewallResourceTypeServer, Server: &hc.FirewallResourceServer{ID: srv.ID},
	}})
	if hc.IsError(err, hc.ErrorCodeFirewallAlreadyApplied) {
		return nil
	}
	if err != nil {
		return p.classify(err, what)
	}
	p.log.Info("put the Proxy's firewall back on its server", "server", srv.Name, "firewall", fw.Name)
	return p.classify(c.Action.WaitFor(ctx, acts...), what)
}

// rulesMatch says whether have are want: same directions, protocols, ports and sources.
func rulesMatch(have, want []hc.FirewallRule) bool {
	return slices.EqualFunc(have, want, func(a, b hc.FirewallRule) bool {
		return a.Direction == b.Direction && a.Protocol == b.Protocol && deref(a.Port) == deref(b.Port) &&
			slices.EqualFunc(a.SourceIPs, b.SourceIPs, func(x, y net.IPNet) bool { return x.String() == y.String() })
	})
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// getFirewall reads the firewall of a name; nil when there is none.
func (p *Provider) getFirewall(ctx context.Context, c *hc.Client, name string) (*hc.Firewall, error) {
	fw, _, err := c.Firewall.GetByName(ctx, name)
	if err != nil {
		return nil, p.classify(err, "reading firewall "+name)
	}
	return fw, nil
}

// deleteFirewall removes the firewall of server name when it is this install's; gone is
// success. A firewall still applied (the server's deletion has not released it yet) is
// tried again while ctx and the running wait last.
func (p *Provider) deleteFirewall(ctx context.Context, c *hc.Client, name string) error {
	fw, err := p.getFirewall(ctx, c, name)
	if err != nil || fw == nil {
		return err
	}
	if p.owner(fw.Labels) != ownedHere || fw.Labels[LabelServer] != name {
		p.log.V(1).Info("leaving alone a firewall that is not this install's", "firewall", name)
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.runningWait)
	defer cancel()
	poll := p.pollBackoff()
	for {
		_, err := c.Firewall.Delete(ctx, fw)
		if err == nil || isNotFound(err) {
			return nil
		}
		err = p.classify(err, "deleting firewall "+name)
		if !errors.Is(err, errInUse) {
			return err
		}
		if serr := sleep(ctx, poll.Step()); serr != nil {
			return provider.Transient(fmt.Errorf("%w (still applied when the wait ended: %v)", err, serr))
		}
	}
}
