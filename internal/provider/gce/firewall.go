package gce

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/iterator"
	"google.golang.org/protobuf/proto"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// firewallDescription marks a rule as this provider's and install's, made for the
// instance of Proxy uid in zone.
func (p *Provider) firewallDescription(zone, uid string) string {
	return fmt.Sprintf("%s provider=%s install=%s zone=%s uid=%s", firewallMark, labelValue(p.name), labelValue(p.installID), zone, uid)
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
	return f != nil && f["provider"] == labelValue(p.name) && f["install"] == labelValue(p.installID)
}

// notOurRule is the permanent error of a rule of the instance's name that this provider
// and install did not make: it is never adopted, patched or deleted.
func (p *Provider) notOurRule(fw *computepb.Firewall) error {
	return provider.Errorf(provider.ErrPermanent,
		"firewall rule %s exists in project %s but is not this install's (description %q, want one starting %q): "+
			"it is left alone; remove or rename it, or set gce.firewall.manageRules: false",
		fw.GetName(), p.cfg.Project, fw.GetDescription(),
		fmt.Sprintf("%s provider=%s install=%s", firewallMark, labelValue(p.name), labelValue(p.installID)))
}

// leftoverRules lists this install's rules whose instance is not among have (an insert
// that failed after its rule was made, an instance deleted by hand), each as an Instance
// in state Unknown whose providerID names the rule's zone and name, so that Delete of it
// (by the deleting Proxy, or by orphan GC once no Proxy owns it) removes the rule. Any
// failed page fails the listing.
func (p *Provider) leftoverRules(ctx context.Context, c *clients, have map[string]bool) ([]provider.Instance, error) {
	var out []provider.Instance
	err := p.call(ctx, "firewalls.list", target{}, func(ctx context.Context) error {
		out = nil
		it := c.firewalls.List(ctx, &computepb.ListFirewallsRequest{Project: p.cfg.Project})
		for {
			fw, err := it.Next()
			if errors.Is(err, iterator.Done) {
				return nil
			}
			if err != nil {
				return err
			}
			if !p.ownsFirewall(fw) || have[fw.GetName()] || !nameRE.MatchString(fw.GetName()) {
				continue
			}
			f := firewallFields(fw.GetDescription())
			zone := f["zone"]
			if zone == "" {
				zone = p.cfg.Zones[0]
			}
			inst := provider.Instance{
				ProviderID: providerID(p.cfg.Project, zone, fw.GetName()), Name: fw.GetName(),
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

// firewallRanges are the sources the rule of req admits: the request's, else the
// config's; none, or a mix of IPv4 and IPv6, is permanent, naming the rule name.
func (p *Provider) firewallRanges(req provider.CreateRequest, name string) ([]string, error) {
	ranges := req.SourceRanges
	if len(ranges) == 0 {
		ranges = p.cfg.Firewall.SourceRanges
	}
	if len(ranges) == 0 {
		return nil, provider.Errorf(provider.ErrPermanent,
			"firewall rule %s: no source ranges (set spec.proxy.allowedSourceRanges or gce.firewall.sourceRanges)", name)
	}
	if msg := provider.MixedFamilies(ranges); msg != "" {
		from := "spec.proxy.allowedSourceRanges"
		if len(req.SourceRanges) == 0 {
			from = "gce.firewall.sourceRanges"
		}
		return nil, provider.Errorf(provider.ErrPermanent, "firewall rule %s: %s %s", name, from, msg)
	}
	return ranges, nil
}

// ensureFirewall makes the rule admitting the proxy port to the instance (target tag
// req.Name) from the request's allowed sources, or the config's.
func (p *Provider) ensureFirewall(ctx context.Context, c *clients, req provider.CreateRequest) error {
	name := req.Name
	ranges, err := p.firewallRanges(req, name)
	if err != nil {
		return err
	}
	var fw *computepb.Firewall
	err = p.call(ctx, "firewalls.get", target{firewall: name}, func(ctx context.Context) (err error) {
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
		Direction: proto.String("INGRESS"), SourceRanges: ranges, TargetTags: []string{name},
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
		len(allowed) == 1 && slices.Equal(allowed[0].GetPorts(), []string{fmt.Sprint(req.Port)})
}

// deleteFirewall removes the instance's rule when it is this install's; gone is success.
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
