package gce

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/iterator"
	"google.golang.org/protobuf/proto"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
)

// firewallDescription marks a rule as this provider's and install's, made for the
// instance of Proxy uid in zone.
func (p *Provider) firewallDescription(zone, uid string) string {
	return fmt.Sprintf("%s provider=%s install=%s zone=%s uid=%s", firewallMark, ident.LabelValue(p.name), ident.LabelValue(p.installID), zone, uid)
}

// firewallMark starts the description of every rule the provider writes.
const firewallMark = "egress-proxies-operator"

// firewallFields reads a description firewallDescription wrote: its key=value fields, or
// nil when it is not one.
func firewallFields(desc string) map[string]string {
	words := strings.Fields(desc)
	if len(words) < 2 || words[0] != firewallMark {
		return nil
	}
	out := map[string]string{}
	for _, w := range words[1:] {
		if k, v, ok := strings.Cut(w, "="); ok {
			out[k] = v
		}
	}
	return out
}

func (p *Provider) ownsFirewall(fw *computepb.Firewall) bool {
	f := firewallFields(fw.GetDescription())
	return f != nil && f["provider"] == ident.LabelValue(p.name) && f["install"] == ident.LabelValue(p.installID)
}

// notOurRule is the permanent error of a rule of the instance's name that this provider
// and install did not make: it is never adopted, patched or deleted.
func (p *Provider) notOurRule(fw *computepb.Firewall) error {
	return provider.Errorf(provider.ErrPermanent,
		"firewall rule %s exists in project %s but is not this install's (description %q, want one starting %q): "+
			"it is left alone; remove or rename it, or set gce.firewall.manageRules: false",
		fw.GetName(), p.cfg.Project, fw.GetDescription(),
		fmt.Sprintf("%s provider=%s install=%s", firewallMark, ident.LabelValue(p.name), ident.LabelValue(p.installID)))
}

// leftoverRules lists this install's rules whose instance is not among have (an insert
// that failed after its rule was made, an instance deleted by hand), each as an Instance
// in state Unknown whose providerID names the rule's zone and the instance's name (an
// IPv6 rule's without ipv6RuleSuffix, one entry for both rules of an instance), so that
// Delete of it (by the deleting Proxy, or by orphan GC once no Proxy owns it) removes
// the rules. Any failed page fails the listing.
func (p *Provider) leftoverRules(ctx context.Context, c *clients, have map[string]bool) ([]provider.Instance, error) {
	var out []provider.Instance
	listed := map[string]bool{}
	err := p.call(ctx, "firewalls.list", target{}, func(ctx context.Context) error {
		out = nil
		clear(listed)
		it := c.firewalls.List(ctx, &computepb.ListFirewallsRequest{Project: p.cfg.Project})
		for {
			fw, err := it.Next()
			if errors.Is(err, iterator.Done) {
				return nil
			}
			if err != nil {
				return err
			}
			base := ruleBase(fw.GetName())
			if !p.ownsFirewall(fw) || have[base] || listed[base] || !nameRE.MatchString(base) {
				continue
			}
			listed[base] = true
			f := firewallFields(fw.GetDescription())
			zone := f["zone"]
			if zone == "" {
				zone = p.cfg.Zones[0]
			}
			inst := provider.Instance{
				ProviderID: ident.ProviderID(p.cfg.Project, zone, base), Name: base,
				UID: f["uid"], State: provider.StateUnknown,
			}
			if t, err := time.Parse(time.RFC3339Nano, fw.GetCreationTimestamp()); err == nil {
				inst.CreatedAt = t
			}
			out = append(out, inst)
		}
	})
	if err != nil {
		return nil, notNotFound(classify(err, "listing firewall rules of project "+p.cfg.Project))
	}
	return out, nil
}

// firewallRanges are the sources the rules of req admit: the request's, else the
// config's; none is permanent, naming the rule name, and so is a mix of IPv4 and IPv6
// on an IPv4-only provider, whose VMs have no IPv6 address to admit them to.
func (p *Provider) firewallRanges(req provider.CreateRequest, name string) ([]string, error) {
	ranges := req.SourceRanges
	if len(ranges) == 0 {
		ranges = p.cfg.Firewall.SourceRanges
	}
	if len(ranges) == 0 {
		return nil, provider.Errorf(provider.ErrPermanent,
			"firewall rule %s: no source ranges (set spec.proxy.allowedSourceRanges or gce.firewall.sourceRanges)", name)
	}
	if msg := provider.MixedFamilies(ranges); msg != "" && !p.cfg.DualStack() {
		from := "spec.proxy.allowedSourceRanges"
		if len(req.SourceRanges) == 0 {
			from = "gce.firewall.sourceRanges"
		}
		return nil, provider.Errorf(provider.ErrPermanent, "firewall rule %s: %s %s", name, from, msg)
	}
	return ranges, nil
}

// ipv6RuleSuffix ends the name of the rule that admits a dual-stack instance's IPv6
// sources; the rule of the name without it admits the IPv4 ones. GCE refuses a rule
// holding both families, so a dual-stack instance (or a pool's children) has two.
const ipv6RuleSuffix = "-v6"

// ruleBase is the name of the instance, or of the shared rule, that the rule name
// belongs to: the name without ipv6RuleSuffix.
func ruleBase(name string) string { return strings.TrimSuffix(name, ipv6RuleSuffix) }

// familyRule is one rule of an instance or of a pool's children: its name and the
// ranges it admits; none means that the rule must not exist.
type familyRule struct {
	name   string
	ranges []string
}

// familyRules are the rules named after base that admit ranges. On a dual-stack
// provider the IPv4 ranges go to base and the IPv6 ones to base+ipv6RuleSuffix, either
// of them empty when the ranges hold none of its family; otherwise all go to base.
func (p *Provider) familyRules(base string, ranges []string) []familyRule {
	if !p.cfg.DualStack() {
		return []familyRule{{name: base, ranges: ranges}}
	}
	var v4, v6 []string
	for _, r := range ranges {
		if pfx, err := netip.ParsePrefix(r); err == nil && pfx.Addr().Is6() {
			v6 = append(v6, r)
		} else {
			v4 = append(v4, r)
		}
	}
	return []familyRule{{name: base, ranges: v4}, {name: base + ipv6RuleSuffix, ranges: v6}}
}

// ensureFirewall makes the rules admitting the proxy port to the instance (target tag
// req.Name) from the request's allowed sources, or the config's: one per address family
// that has ranges; a rule of a family without ranges (left from an earlier spec) is
// deleted.
func (p *Provider) ensureFirewall(ctx context.Context, c *clients, req provider.CreateRequest) error {
	ranges, err := p.firewallRanges(req, req.Name)
	if err != nil {
		return err
	}
	for _, r := range p.familyRules(req.Name, ranges) {
		if len(r.ranges) == 0 {
			err = p.deleteFirewall(ctx, c, r.name)
		} else {
			err = p.ensureRule(ctx, c, req, r.name, r.ranges)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ensureRule makes rule name admit the proxy port to the instance from ranges.
func (p *Provider) ensureRule(ctx context.Context, c *clients, req provider.CreateRequest, name string, ranges []string) error {
	var fw *computepb.Firewall
	err := p.call(ctx, "firewalls.get", target{firewall: name}, func(ctx context.Context) (err error) {
		fw, err = c.firewalls.Get(ctx, &computepb.GetFirewallRequest{Project: p.cfg.Project, Firewall: name})
		return err
	})
	switch {
	case err == nil && !p.ownsFirewall(fw):
		return p.notOurRule(fw)
	case err == nil && firewallMatches(fw, ranges, req):
		return nil
	case err == nil:
		// Ours but made for other sources, another port or another Proxy (an instance
		// replaced for a changed spec keeps its name): made anew with what is asked now.
		if err := p.deleteFirewall(ctx, c, name); err != nil {
			return err
		}
	case !isNotFound(err):
		return notNotFound(classify(err, "reading firewall rule "+name))
	}
	key := "firewall/" + name
	rid := requestID(p.failures(key), "firewall", p.cfg.Project, name, req.UID, req.SpecHash)
	err = p.insertRule(ctx, c, key, rid, &computepb.Firewall{
		Name: proto.String(name), Network: proto.String(p.cfg.Network), Description: proto.String(p.firewallDescription(req.Placement.Zone, req.UID)),
		Direction: proto.String("INGRESS"), SourceRanges: ranges, TargetTags: []string{req.Name},
		Allowed: []*computepb.Allowed{{IPProtocol: proto.String("tcp"), Ports: []string{fmt.Sprint(req.Port)}}},
	})
	if errors.Is(err, errAlreadyExists) {
		return nil
	}
	return err
}

// insertRule inserts fw with requestId rid and waits for the operation; the operation
// reaching DONE counts for key. A rule of that name made meanwhile is errAlreadyExists.
func (p *Provider) insertRule(ctx context.Context, c *clients, key, rid string, fw *computepb.Firewall) error {
	name := fw.GetName()
	what := "inserting firewall rule " + name
	var op *compute.Operation
	err := p.call(ctx, "firewalls.insert", target{firewall: name}, func(ctx context.Context) (err error) {
		op, err = c.firewalls.Insert(ctx, &computepb.InsertFirewallRequest{Project: p.cfg.Project, RequestId: proto.String(rid), FirewallResource: fw})
		return err
	})
	if err != nil {
		if err := classify(err, what); !errors.Is(err, errAlreadyExists) {
			return referenceMissing(err)
		}
		return errAlreadyExists
	}
	err = p.wait(ctx, op, "globalOperations.get", target{firewall: name}, what)
	if err == nil || errors.Is(err, errOperationFailed) {
		p.opFinished(key)
	}
	if errors.Is(err, errAlreadyExists) {
		return errAlreadyExists
	}
	return notNotFound(err)
}

// firewallMatches says whether fw admits exactly the port of req from ranges, for req's Proxy.
func firewallMatches(fw *computepb.Firewall, ranges []string, req provider.CreateRequest) bool {
	have, want := slices.Clone(fw.GetSourceRanges()), slices.Clone(ranges)
	slices.Sort(have)
	slices.Sort(want)
	allowed := fw.GetAllowed()
	return slices.Equal(have, want) && firewallFields(fw.GetDescription())["uid"] == req.UID &&
		slices.Equal(fw.GetTargetTags(), []string{req.Name}) && len(allowed) == 1 && slices.Equal(allowed[0].GetPorts(), []string{fmt.Sprint(req.Port)})
}

// deleteRules removes the rules named after base (the instance's, or a pool's shared
// one): base and its IPv6 rule, each when it is this install's. Both are tried whatever
// the stack type, so that rules left by an earlier dual-stack config go too.
func (p *Provider) deleteRules(ctx context.Context, c *clients, base string) error {
	if err := p.deleteFirewall(ctx, c, base); err != nil {
		return err
	}
	return p.deleteFirewall(ctx, c, base+ipv6RuleSuffix)
}

// deleteFirewall removes the rule name when it is this install's; gone is success.
func (p *Provider) deleteFirewall(ctx context.Context, c *clients, name string) error {
	var fw *computepb.Firewall
	err := p.call(ctx, "firewalls.get", target{firewall: name}, func(ctx context.Context) (err error) {
		fw, err = c.firewalls.Get(ctx, &computepb.GetFirewallRequest{Project: p.cfg.Project, Firewall: name})
		return err
	})
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return notNotFound(classify(err, "reading firewall rule "+name))
	}
	if !p.ownsFirewall(fw) {
		return nil
	}
	what := "deleting firewall rule " + name
	var op *compute.Operation
	err = p.call(ctx, "firewalls.delete", target{firewall: name}, func(ctx context.Context) (err error) {
		op, err = c.firewalls.Delete(ctx, &computepb.DeleteFirewallRequest{Project: p.cfg.Project, Firewall: name})
		return err
	})
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return notNotFound(classify(err, what))
	}
	return notNotFound(p.wait(ctx, op, "globalOperations.get", target{firewall: name}, what))
}
