package gce

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/iterator"
	"google.golang.org/protobuf/proto"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

// nameRE is GCE's resource name rule (RFC 1035).
var nameRE = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

// instance describes inst for the contract.
func (p *Provider) instance(zone string, inst *computepb.Instance) provider.Instance {
	out := provider.Instance{
		ProviderID: ident.ProviderID(p.cfg.Project, zone, inst.GetName()),
		Name:       inst.GetName(),
		UID:        ownerUID(inst),
		State:      state(inst.GetStatus()),
	}
	if t, err := time.Parse(time.RFC3339Nano, inst.GetCreationTimestamp()); err == nil {
		out.CreatedAt = t
	}
	if out.State == provider.StateRunning || out.State == provider.StatePending {
		out.IP = address(inst, p.cfg.HasExternalIP())
		out.IPv6 = addressIPv6(inst)
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

// addressIPv6 is the external IPv6 address of the first interface that has one.
func addressIPv6(inst *computepb.Instance) string {
	for _, ni := range inst.GetNetworkInterfaces() {
		for _, ac := range ni.GetIpv6AccessConfigs() {
			if ip := ac.GetExternalIpv6(); ip != "" {
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
	zone, name, err := ident.ParseProviderID(id, p.cfg.Project)
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
// the provider manages firewalls, its rules (IPv4 and IPv6), or for a pool child the
// pool's shared rules when no other instance is admitted by them. Gone, or not this
// install's, is success.
func (p *Provider) Delete(ctx context.Context, id string) error {
	zone, name, err := ident.ParseProviderID(id, p.cfg.Project)
	if project, _, _, ok := ident.SplitProviderID(id); ok && project != p.cfg.Project {
		// The config moved to another project: the instance may still run in the old one.
		rules := name
		if p.cfg.DualStack() {
			rules += " " + name + ipv6RuleSuffix
		}
		return provider.Errorf(provider.ErrPermanent,
			"%w: instance %s is in zone %s of project %s, which is not gce.project %s, so it may still be there; remove it with "+
				"gcloud compute instances delete %s --zone %s --project %s (and gcloud compute firewall-rules delete %s --project %s if the provider made rules)",
			provider.ErrLeftBehind, name, zone, project, p.cfg.Project, name, zone, project, rules, project)
	}
	if err != nil {
		return err
	}
	c, err := p.client(ctx)
	if err != nil {
		return err
	}
	if isPoolRule(name) {
		// A shared rule listed as left over (orphan GC): deleted only if still unused.
		if !p.cfg.ManagesFirewallRules() {
			return nil
		}
		return p.releasePoolRule(ctx, c, name, "", func(users []string) error {
			return provider.Errorf(provider.ErrTransient, "firewall rule %s is in use again (by instance %s): left in place", name, strings.Join(users, ", "))
		})
	}
	inst, err := p.getInstance(ctx, c, zone, name)
	var shared string
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
		shared = inst.GetLabels()[LabelPoolRule]
	}
	if !p.cfg.ManagesFirewallRules() {
		return nil
	}
	if err := p.deleteRules(ctx, c, name); err != nil {
		return err
	}
	if shared != "" && isPoolRule(shared) {
		// The last child of its pool admitted by the rule takes it along.
		return p.releasePoolRule(ctx, c, shared, name, func([]string) error { return nil })
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
	f := fmt.Sprintf(`(labels.%s = "%s")`, LabelProvider, ident.LabelValue(p.name))
	if p.installID != "" {
		f += fmt.Sprintf(` AND (labels.%s = "%s")`, LabelInstall, ident.LabelValue(p.installID))
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
	// The shared rules some listed instance is admitted by: in use, not left over.
	inUse := map[string]bool{}
	err = p.call(ctx, "instances.aggregatedList", target{}, func(ctx context.Context) error {
		out = nil
		clear(inUse)
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
					if rule := inst.GetLabels()[LabelPoolRule]; rule != "" {
						inUse[rule] = true
					}
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
	have := inUse
	for _, in := range out {
		have[in.Name] = true
	}
	rules, err := p.leftoverRules(ctx, c, have)
	if err != nil {
		return nil, err
	}
	return append(out, rules...), nil
}
