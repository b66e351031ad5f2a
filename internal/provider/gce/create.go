package gce

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

// plan is a resolved placement.
type plan struct {
	zone, machineType, image string
}

// resolve checks placement against the catalogues; every miss is permanent.
func (p *Provider) resolve(req provider.CreateRequest) (plan, error) {
	if !slices.Contains(p.cfg.Zones, req.Placement.Zone) {
		return plan{}, provider.Errorf(provider.ErrPermanent, "placement.zone %q is not in gce.zones", req.Placement.Zone)
	}
	mt, ok := p.cfg.MachineTypes[req.Placement.MachineType]
	if !ok {
		return plan{}, provider.Errorf(provider.ErrPermanent, "placement.machineType %q is not in gce.machineTypes", req.Placement.MachineType)
	}
	img, ok := p.cfg.Images[req.Placement.Image]
	if !ok {
		return plan{}, provider.Errorf(provider.ErrPermanent, "placement.image %q is not in gce.images", req.Placement.Image)
	}
	if !nameRE.MatchString(req.Name) {
		return plan{}, provider.Errorf(provider.ErrPermanent,
			"instance name %q is not a GCE name (lowercase letters, digits and dashes, starting with a letter, at most 63)", req.Name)
	}
	return plan{zone: req.Placement.Zone, machineType: mt, image: img}, nil
}

// createRounds bounds the Get/act loop of Create: replace (delete), insert, adopt, with
// one more for an insert that met an instance made meanwhile and one for an insert whose
// requestId GCE answered with an operation finished before a restart.
const createRounds = 5

// Create makes sure instance req.Name runs in placement.zone. It reads the instance
// first: this provider's and install's instance of the same UID is adopted (started if
// it was stopped), or replaced when it was built from another spec hash; one of another
// UID is refused with ErrOwnedByOther, one of another install or not made by this
// provider with a plain permanent error. Otherwise it inserts the instance with a
// requestId derived from the UID and spec hash, waits for the zonal operation and reads
// its error list, then waits until the instance runs and has its address.
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	pl, err := p.resolve(req)
	if err != nil {
		return provider.Instance{}, err
	}
	c, err := p.client(ctx)
	if err != nil {
		return provider.Instance{}, err
	}
	for range createRounds {
		inst, err := p.getInstance(ctx, c, pl.zone, req.Name)
		switch {
		case isNotFound(err):
			// Inserted, or made meanwhile (409): read it again and judge it.
			if err := p.insert(ctx, c, pl, req); err != nil && !errors.Is(err, errAlreadyExists) {
				return provider.Instance{}, notNotFound(err)
			}
			continue
		case err != nil:
			return provider.Instance{}, notNotFound(err)
		}
		where := fmt.Sprintf("instance %s in zone %s", req.Name, pl.zone)
		switch p.owner(inst) {
		case notThisProviders:
			return provider.Instance{}, provider.Errorf(provider.ErrPermanent,
				"%s exists but is not labelled %s=%s: it was not made by gce provider %s", where, LabelProvider, ident.LabelValue(p.name), p.name)
		case otherInstall:
			return provider.Instance{}, provider.Errorf(provider.ErrPermanent,
				"%s belongs to install %q of the operator, not to this install %q", where, inst.GetLabels()[LabelInstall], ident.LabelValue(p.installID))
		}
		if owner := ownerUID(inst); owner != req.UID {
			return provider.Instance{}, provider.OwnedByOther(fmt.Errorf("%s belongs to Proxy UID %s, not %s", where, owner, req.UID))
		}
		if had := metadataValue(inst, MetadataSpecHash); had != "" && req.SpecHash != "" && had != req.SpecHash {
			tracing.Logger(ctx, p.log).V(1).Info("replacing instance built from another spec", "instance", req.Name, "zone", pl.zone, "specHash", had, "want", req.SpecHash)
			if err := p.deleteInstance(ctx, c, pl.zone, inst); err != nil {
				return provider.Instance{}, notNotFound(err)
			}
			continue
		}
		out, err := p.awaitRunning(ctx, c, pl.zone, inst)
		return out, notNotFound(err)
	}
	return provider.Instance{}, provider.Errorf(provider.ErrTransient, "instance %s in zone %s kept changing while it was being created", req.Name, pl.zone)
}

// notNotFound keeps ErrNotFound out of Create: the instance vanished under it (a Spot VM
// preempted, deleted by hand), which a retry mends.
func notNotFound(err error) error {
	if errors.Is(err, provider.ErrNotFound) {
		return provider.Transient(errors.New(err.Error()))
	}
	return err
}

// insert creates the instance (and its firewall rule first, when the provider manages
// rules) and waits for the operation.
func (p *Provider) insert(ctx context.Context, c *clients, pl plan, req provider.CreateRequest) error {
	shared := ""
	switch {
	case p.cfg.ManagesFirewallRules() && req.Pool.UID != "":
		ranges, err := p.firewallRanges(req, req.Name)
		if err != nil {
			return err
		}
		shared = p.poolRule(req, ranges)
		// Held from the rule's check to the insert's end: the rule is not deleted under
		// the child that is about to need it.
		l := p.poolRuleLock(shared)
		l.RLock()
		defer l.RUnlock()
		for _, r := range p.familyRules(shared, ranges) {
			// A family without ranges needs no rule; one left from other ranges
			// cannot be, since the shared rule's name is a digest of them all.
			if len(r.ranges) == 0 {
				continue
			}
			if err := p.ensurePoolRule(ctx, c, req, r.name, shared, r.ranges); err != nil {
				return err
			}
		}
	case p.cfg.ManagesFirewallRules():
		if err := p.ensureFirewall(ctx, c, req); err != nil {
			return err
		}
	}
	key := "insert/" + pl.zone + "/" + req.Name
	rid := requestID(p.failures(key), "insert", p.cfg.Project, pl.zone, req.Name, req.UID, req.SpecHash)
	what := fmt.Sprintf("inserting instance %s in zone %s", req.Name, pl.zone)
	var op *compute.Operation
	err := p.call(ctx, "instances.insert", target{zone: pl.zone, instance: req.Name}, func(ctx context.Context) (err error) {
		op, err = c.instances.Insert(ctx, &computepb.InsertInstanceRequest{
			Project: p.cfg.Project, Zone: pl.zone, RequestId: proto.String(rid),
			InstanceResource: p.instanceResource(pl, req, shared),
		})
		return err
	})
	if err != nil {
		return p.dualStackHint(referenceMissing(classify(err, what)))
	}
	err = p.wait(ctx, op, "zoneOperations.get", target{zone: pl.zone, instance: req.Name}, what)
	if err == nil || errors.Is(err, errOperationFailed) {
		p.opFinished(key)
	}
	return err
}

// dualStackHint adds, to a refusal that names IPv6 or the stack type while the provider
// asks for IPV4_IPV6, that the subnetwork must be dual-stack: the API's own words name
// only the field.
func (p *Provider) dualStackHint(err error) error {
	if err == nil || !p.cfg.DualStack() || !errors.Is(err, provider.ErrPermanent) {
		return err
	}
	if msg := strings.ToLower(err.Error()); !strings.Contains(msg, "ipv6") && !strings.Contains(msg, "stacktype") {
		return err
	}
	return fmt.Errorf("%w; with gce.stackType IPV4_IPV6 the subnetwork %s must be dual-stack (stack type IPV4_IPV6 with an external IPv6 range: "+
		"gcloud compute networks subnets update --stack-type=IPV4_IPV6 --ipv6-access-type=EXTERNAL)", err, p.cfg.Subnetwork)
}

// instanceResource is the instance Create inserts; shared is the pool's shared firewall
// rule admitting it, if any, whose tag and label it carries instead of its own name's tag.
func (p *Provider) instanceResource(pl plan, req provider.CreateRequest, shared string) *computepb.Instance {
	nic := &computepb.NetworkInterface{Network: proto.String(p.cfg.Network)}
	if p.cfg.Subnetwork != "" {
		nic.Subnetwork = proto.String(p.cfg.Subnetwork)
	}
	if p.cfg.HasExternalIP() {
		nic.AccessConfigs = []*computepb.AccessConfig{{
			Name: proto.String("External NAT"), Type: proto.String("ONE_TO_ONE_NAT"), NetworkTier: proto.String(p.cfg.NetworkTier),
		}}
	}
	if p.cfg.DualStack() {
		nic.StackType = proto.String(provider.GCEStackDualIPv6)
		nic.Ipv6AccessConfigs = []*computepb.AccessConfig{{
			Name: proto.String("External IPv6"), Type: proto.String("DIRECT_IPV6"), NetworkTier: proto.String("PREMIUM"),
		}}
	}
	items := []*computepb.Items{
		{Key: proto.String(MetadataUserData), Value: proto.String(string(req.CloudInit))},
		{Key: proto.String(MetadataUID), Value: proto.String(req.UID)},
	}
	if req.SpecHash != "" {
		items = append(items, &computepb.Items{Key: proto.String(MetadataSpecHash), Value: proto.String(req.SpecHash)})
	}
	inst := &computepb.Instance{
		Name:        proto.String(req.Name),
		Description: proto.String("egress proxy " + req.Name + " (port " + strconv.Itoa(int(req.Port)) + ")"),
		MachineType: proto.String("zones/" + pl.zone + "/machineTypes/" + pl.machineType),
		Labels:      p.labels(req.UID),
		Metadata:    &computepb.Metadata{Items: items},
		Disks: []*computepb.AttachedDisk{{
			Boot: proto.Bool(true), AutoDelete: proto.Bool(true), Type: proto.String("PERSISTENT"),
			InitializeParams: &computepb.AttachedDiskInitializeParams{
				SourceImage: proto.String(pl.image), DiskSizeGb: proto.Int64(int64(p.cfg.DiskSizeGb)),
			},
		}},
		NetworkInterfaces: []*computepb.NetworkInterface{nic},
	}
	switch {
	case shared != "":
		inst.Tags = &computepb.Tags{Items: []string{p.cfg.Firewall.TargetTag, shared}}
		inst.Labels[LabelPoolRule] = shared
	case p.cfg.Firewall != nil:
		inst.Tags = &computepb.Tags{Items: []string{p.cfg.Firewall.TargetTag, req.Name}}
	}
	if p.cfg.Spot {
		inst.Scheduling = &computepb.Scheduling{
			ProvisioningModel: proto.String("SPOT"), InstanceTerminationAction: proto.String("DELETE"),
			AutomaticRestart: proto.Bool(false), OnHostMaintenance: proto.String("TERMINATE"),
		}
	}
	return inst
}

// awaitRunning returns the instance once it runs with its address, starting it when it
// was stopped, polling while it provisions or is repaired. An instance stopping (being
// deleted or stopped by someone, PENDING_STOP, DEPROVISIONING) is transient.
func (p *Provider) awaitRunning(ctx context.Context, c *clients, zone string, inst *computepb.Instance) (provider.Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, p.runningWait)
	defer cancel()
	name := inst.GetName()
	started := false
	poll := p.pollBackoff()
	for {
		out := p.instance(zone, inst)
		switch inst.GetStatus() {
		case "RUNNING":
			if out.IP != "" {
				return out, nil
			}
		case "TERMINATED", "STOPPED", "SUSPENDED":
			if started {
				break
			}
			if err := p.start(ctx, c, zone, name); err != nil {
				return provider.Instance{}, err
			}
			started = true
		case "STOPPING", "SUSPENDING", "PENDING_STOP", "DEPROVISIONING":
			return provider.Instance{}, provider.Errorf(provider.ErrTransient, "instance %s in zone %s is %s", name, zone, inst.GetStatus())
		}
		if err := sleep(ctx, poll.Step()); err != nil {
			return provider.Instance{}, provider.Transient(fmt.Errorf("waiting for instance %s in zone %s to run (status %s): %w", name, zone, inst.GetStatus(), err))
		}
		var err error
		if inst, err = p.getInstance(ctx, c, zone, name); err != nil {
			return provider.Instance{}, err
		}
	}
}

// start starts a stopped instance of this provider and waits for the operation.
func (p *Provider) start(ctx context.Context, c *clients, zone, name string) error {
	return p.instanceOp(ctx, "instances.start", fmt.Sprintf("starting instance %s in zone %s", name, zone), zone, name,
		func(ctx context.Context) (*compute.Operation, error) {
			return c.instances.Start(ctx, &computepb.StartInstanceRequest{Project: p.cfg.Project, Zone: zone, Instance: name})
		})
}

// instanceOp makes one call (method) on instance name in zone that answers with a zone
// operation, and waits for the operation; what names the call in errors.
func (p *Provider) instanceOp(ctx context.Context, method, what, zone, name string, fn func(context.Context) (*compute.Operation, error)) error {
	var op *compute.Operation
	err := p.call(ctx, method, target{zone: zone, instance: name}, func(ctx context.Context) (err error) {
		op, err = fn(ctx)
		return err
	})
	if err != nil {
		return classify(err, what)
	}
	return p.wait(ctx, op, "zoneOperations.get", target{zone: zone, instance: name}, what)
}

// errOperationFailed marks an error that an operation reported (not a failed poll).
var errOperationFailed = errors.New("operation failed")

// wait polls op until it is DONE and returns its error list's verdict (opError). The
// client's own Wait is not used: it returns nil for a failed operation that carries no
// httpErrorStatusCode, and its back-off starts at a second.
func (p *Provider) wait(ctx context.Context, op *compute.Operation, method string, t target, what string) error {
	t.operation = op.Name()
	for poll := p.pollBackoff(); !op.Done(); {
		if err := sleep(ctx, poll.Step()); err != nil {
			return provider.Transient(fmt.Errorf("%s: waiting for operation %s: %w", what, op.Name(), err))
		}
		err := p.call(ctx, method, t, func(ctx context.Context) error { return op.Poll(ctx) })
		if err != nil && !op.Done() {
			return classify(err, fmt.Sprintf("%s: polling operation %s", what, op.Name()))
		}
	}
	if pb := op.Proto(); pb.GetError() != nil || pb.HttpErrorStatusCode != nil && (pb.GetHttpErrorStatusCode() < 200 || pb.GetHttpErrorStatusCode() > 299) {
		return &markedError{mark: errOperationFailed, err: opError(pb, what)}
	}
	return nil
}

// getInstance reads one instance; a 404 is ErrNotFound.
func (p *Provider) getInstance(ctx context.Context, c *clients, zone, name string) (*computepb.Instance, error) {
	var inst *computepb.Instance
	err := p.call(ctx, "instances.get", target{zone: zone, instance: name}, func(ctx context.Context) (err error) {
		inst, err = c.instances.Get(ctx, &computepb.GetInstanceRequest{Project: p.cfg.Project, Zone: zone, Instance: name})
		return err
	})
	if err != nil {
		return nil, classify(err, fmt.Sprintf("reading instance %s in zone %s", name, zone))
	}
	return inst, nil
}
