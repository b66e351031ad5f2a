package gce

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/iterator"
	"google.golang.org/protobuf/proto"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

// nameRE is GCE's resource name rule (RFC 1035).
var nameRE = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

// instance describes inst for the contract.
func (p *Provider) instance(zone string, inst *computepb.Instance) provider.Instance {
	out := provider.Instance{
		ProviderID: providerID(p.cfg.Project, zone, inst.GetName()),
		Name:       inst.GetName(),
		UID:        ownerUID(inst),
		State:      state(inst.GetStatus()),
	}
	if t, err := time.Parse(time.RFC3339Nano, inst.GetCreationTimestamp()); err == nil {
		out.CreatedAt = t
	}
	if out.State == provider.StateRunning || out.State == provider.StatePending {
		out.IP = address(inst, p.cfg.HasExternalIP())
	}
	return out
}

// address is the external NAT IP of the first interface, or its internal IP when the
// provider gives no external IP.
func address(inst *computepb.Instance, external bool) string {
	for _, ni := range inst.GetNetworkInterfaces() {
		if !external {
			return ni.GetNetworkIP()
		}
		for _, ac := range ni.GetAccessConfigs() {
			if ip := ac.GetNatIP(); ip != "" {
				return ip
			}
		}
	}
	return ""
}

// state maps a GCE instance status to the contract's states, by what it means for a
// proxy: PENDING_STOP and DEPROVISIONING (about to stop, resources being released) do not
// serve and are on their way out, so Terminating; REPAIRING (GCE moving the VM off a
// failed host, after which it runs again) is being brought back, so Pending.
func state(status string) string {
	switch status {
	case "RUNNING":
		return provider.StateRunning
	case "PROVISIONING", "STAGING", "REPAIRING":
		return provider.StatePending
	case "STOPPING", "SUSPENDING", "PENDING_STOP", "DEPROVISIONING":
		return provider.StateTerminating
	case "TERMINATED", "STOPPED", "SUSPENDED":
		return provider.StateStopped
	}
	return provider.StateUnknown
}

// Get describes the instance providerID names. An instance that is gone, or that is not
// this provider's and install's, is ErrNotFound.
func (p *Provider) Get(ctx context.Context, id string) (provider.Instance, error) {
	zone, name, err := p.parseProviderID(id)
	if err != nil {
		return provider.Instance{}, err
	}
	c, err := p.client(ctx)
	if err != nil {
		return provider.Instance{}, err
	}
	inst, err := p.getInstance(ctx, c, zone, name)
	if isNotFound(err) && p.cfg.Spot {
		if at, ok := p.preemptedAt(ctx, c, zone, name); ok {
			return provider.Instance{}, provider.Preempted(fmt.Errorf(
				"spot VM %s in zone %s was preempted by GCE at %s (it is gone: instanceTerminationAction DELETE)", name, zone, at.Format(time.RFC3339)))
		}
	}
	if err != nil {
		return provider.Instance{}, err
	}
	if p.owner(inst) != ownedHere {
		return provider.Instance{}, provider.Errorf(provider.ErrNotFound,
			"instance %s in zone %s is not this install's (labels %s=%q, %s=%q)", name, zone,
			LabelProvider, inst.GetLabels()[LabelProvider], LabelInstall, inst.GetLabels()[LabelInstall])
	}
	return p.instance(zone, inst), nil
}

// preemptionWindow bounds how old a preemption of the instance's name may be to explain
// its absence: an older one was of an earlier VM of that name.
const preemptionWindow = time.Hour

// preemptedAt finds the system operation compute.instances.preempted of the instance in
// zone, ended within preemptionWindow, and returns when it ended. A listing that fails
// says nothing: the VM is then reported gone as any other.
func (p *Provider) preemptedAt(ctx context.Context, c *clients, zone, name string) (time.Time, bool) {
	suffix := "/projects/" + p.cfg.Project + "/zones/" + zone + "/instances/" + name
	var at time.Time
	err := p.call(ctx, "zoneOperations.list", target{zone: zone, instance: name}, func(ctx context.Context) error {
		it := c.zoneOps.List(ctx, &computepb.ListZoneOperationsRequest{Project: p.cfg.Project, Zone: zone,
			Filter: proto.String(`operationType = "compute.instances.preempted"`)})
		for {
			op, err := it.Next()
			if errors.Is(err, iterator.Done) {
				return nil
			}
			if err != nil {
				return err
			}
			end, err := time.Parse(time.RFC3339Nano, op.GetEndTime())
			if err != nil || !strings.HasSuffix(op.GetTargetLink(), suffix) || time.Since(end) > preemptionWindow {
				continue
			}
			if end.After(at) {
				at = end
			}
		}
	})
	if err != nil {
		tracing.Logger(ctx, p.log).V(1).Info("could not read whether the instance was preempted", "instance", name, "zone", zone, "error", err.Error())
		return time.Time{}, false
	}
	return at, !at.IsZero()
}

// Delete removes the instance providerID names (its boot disk goes with it) and, when
// the provider manages firewalls, its rule. Gone, or not this install's, is success.
func (p *Provider) Delete(ctx context.Context, id string) error {
	zone, name, err := p.parseProviderID(id)
	if project, ok := otherProject(id, p.cfg.Project); ok {
		// The config moved to another project: the instance may still run in the old one.
		return provider.Errorf(provider.ErrPermanent,
			"%w: instance %s is in zone %s of project %s, which is not gce.project %s, so it may still be there; remove it with "+
				"gcloud compute instances delete %s --zone %s --project %s (and gcloud compute firewall-rules delete %s --project %s if the provider made a rule)",
			provider.ErrLeftBehind, name, zone, project, p.cfg.Project, name, zone, project, name, project)
	}
	if err != nil {
		return err
	}
	c, err := p.client(ctx)
	if err != nil {
		return err
	}
	inst, err := p.getInstance(ctx, c, zone, name)
	switch {
	case isNotFound(err):
	case err != nil:
		return err
	case p.owner(inst) != ownedHere:
		tracing.Logger(ctx, p.log).V(1).Info("leaving alone an instance that is not this install's", "instance", name, "zone", zone)
		return nil
	default:
		if err := p.deleteInstance(ctx, c, zone, inst); err != nil {
			return err
		}
	}
	if p.cfg.ManagesFirewallRules() {
		return p.deleteFirewall(ctx, c, name)
	}
	return nil
}

// deleteInstance deletes inst and waits for the operation; gone meanwhile is success.
func (p *Provider) deleteInstance(ctx context.Context, c *clients, zone string, inst *computepb.Instance) error {
	name := inst.GetName()
	key := "delete/" + zone + "/" + name
	rid := requestID(p.failures(key), "delete", p.cfg.Project, zone, name, fmt.Sprint(inst.GetId()))
	what := fmt.Sprintf("deleting instance %s in zone %s", name, zone)
	var op *compute.Operation
	err := p.call(ctx, "instances.delete", target{zone: zone, instance: name}, func(ctx context.Context) (err error) {
		op, err = c.instances.Delete(ctx, &computepb.DeleteInstanceRequest{Project: p.cfg.Project, Zone: zone, Instance: name, RequestId: proto.String(rid)})
		return err
	})
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return notNotFound(classify(err, what))
	}
	err = p.wait(ctx, op, "zoneOperations.get", target{zone: zone, instance: name}, what)
	if err == nil || errors.Is(err, errOperationFailed) {
		p.opFinished(key)
	}
	return notNotFound(err)
}

// listFilter selects this provider entry's and install's instances.
func (p *Provider) listFilter() string {
	f := fmt.Sprintf(`(labels.%s = "%s")`, LabelProvider, labelValue(p.name))
	if p.installID != "" {
		f += fmt.Sprintf(` AND (labels.%s = "%s")`, LabelInstall, labelValue(p.installID))
	}
	return f
}

// ListByTag lists this provider's and install's instances in every zone of the project
// with one aggregated list, filtered by label and checked again here and, when the
// provider manages firewall rules, the rules of this install left without their instance
// (leftoverRules). Any failed page of either fails the whole listing.
func (p *Provider) ListByTag(ctx context.Context) ([]provider.Instance, error) {
	c, err := p.client(ctx)
	if err != nil {
		return nil, err
	}
	var out []provider.Instance
	err = p.call(ctx, "instances.aggregatedList", target{}, func(ctx context.Context) error {
		out = nil
		it := c.instances.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{
			Project: p.cfg.Project, Filter: proto.String(p.listFilter()),
		})
		for {
			pair, err := it.Next()
			if errors.Is(err, iterator.Done) {
				return nil
			}
			if err != nil {
				return err
			}
			zone := strings.TrimPrefix(pair.Key, "zones/")
			for _, inst := range pair.Value.GetInstances() {
				if p.owner(inst) == ownedHere {
					out = append(out, p.instance(zone, inst))
				}
			}
		}
	})
	if err != nil {
		return nil, notNotFound(classify(err, "listing instances of project "+p.cfg.Project))
	}
	if !p.cfg.ManagesFirewallRules() {
		return out, nil
	}
	have := make(map[string]bool, len(out))
	for _, in := range out {
		have[in.Name] = true
	}
	rules, err := p.leftoverRules(ctx, c, have)
	if err != nil {
		return nil, err
	}
	return append(out, rules...), nil
}

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

// ensureFirewall makes the rule admitting the proxy port to the instance (target tag
// req.Name) from the request's allowed sources, or the config's.
func (p *Provider) ensureFirewall(ctx context.Context, c *clients, req provider.CreateRequest) error {
	name := req.Name
	ranges := req.SourceRanges
	if len(ranges) == 0 {
		ranges = p.cfg.Firewall.SourceRanges
	}
	if len(ranges) == 0 {
		return provider.Errorf(provider.ErrPermanent,
			"firewall rule %s: no source ranges (set spec.proxy.allowedSourceRanges or gce.firewall.sourceRanges)", name)
	}
	if msg := provider.MixedFamilies(ranges); msg != "" {
		from := "spec.proxy.allowedSourceRanges"
		if len(req.SourceRanges) == 0 {
			from = "gce.firewall.sourceRanges"
		}
		return provider.Errorf(provider.ErrPermanent, "firewall rule %s: %s %s", name, from, msg)
	}
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
	what := "inserting firewall rule " + name
	var op *compute.Operation
	err = p.call(ctx, "firewalls.insert", target{firewall: name}, func(ctx context.Context) (err error) {
		op, err = c.firewalls.Insert(ctx, &computepb.InsertFirewallRequest{Project: p.cfg.Project, RequestId: proto.String(rid),
			FirewallResource: &computepb.Firewall{
				Name: proto.String(name), Network: proto.String(p.cfg.Network), Description: proto.String(p.firewallDescription(req.Placement.Zone, req.UID)),
				Direction: proto.String("INGRESS"), SourceRanges: ranges, TargetTags: []string{name},
				Allowed: []*computepb.Allowed{{IPProtocol: proto.String("tcp"), Ports: []string{fmt.Sprint(req.Port)}}},
			}})
		return err
	})
	if err != nil {
		if err := classify(err, what); !errors.Is(err, errAlreadyExists) {
			return referenceMissing(err)
		}
		return nil
	}
	err = p.wait(ctx, op, "globalOperations.get", target{firewall: name}, what)
	if err == nil || errors.Is(err, errOperationFailed) {
		p.opFinished(key)
	}
	if errors.Is(err, errAlreadyExists) {
		return nil
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
