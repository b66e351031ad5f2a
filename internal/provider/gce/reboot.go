package gce

import (
	"context"
	"fmt"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

var _ provider.Rebooter = (*Provider)(nil)

// Reboot restarts the instance providerID names in place with the Compute API's
// instances.reset (the hard reset of the VM, without a guest shutdown; `gcloud compute
// instances reset`), and waits for its zone operation. The instance keeps its name, ID,
// boot disk, internal and external addresses (an ephemeral external IP survives a reset)
// and metadata, so the guest boots again from its disk and cloud-init runs only its
// per-boot parts. A TERMINATED (or STOPPED) instance is started instead with
// instances.start. The labels are checked first: an instance that is not this provider
// entry's and install's is never touched (ErrPermanent). A SUSPENDED instance is left for
// a person to resume (ErrPermanent); one that is provisioning, being repaired or
// stopping is ErrTransient; one that is gone ErrNotFound. The wait for the operation is
// bounded like Create's wait for running (5 minutes), every API call by the per-call
// timeout (2 minutes). No requestId is sent: a retry is meant to reset again.
func (p *Provider) Reboot(ctx context.Context, id string) error {
	zone, name, err := ident.ParseProviderID(id, p.cfg.Project)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.runningWait)
	defer cancel()
	c, err := p.client(ctx)
	if err != nil {
		return err
	}
	inst, err := p.getInstance(ctx, c, zone, name)
	if err != nil {
		return err
	}
	where := fmt.Sprintf("instance %s in zone %s", name, zone)
	log := tracing.Logger(ctx, p.log).WithValues("instance", name, "zone", zone)
	switch p.owner(inst) {
	case notThisProviders:
		log.Info("reboot leaves alone an instance that is not this provider's", "labels", inst.GetLabels())
		return provider.Errorf(provider.ErrPermanent,
			"%s is not labelled %s=%s: it was not made by gce provider %s and is not rebooted", where, LabelProvider, ident.LabelValue(p.name), p.name)
	case otherInstall:
		log.Info("reboot leaves alone an instance of another install", "install", inst.GetLabels()[LabelInstall])
		return provider.Errorf(provider.ErrPermanent,
			"%s belongs to install %q of the operator, not to this install %q, and is not rebooted", where, inst.GetLabels()[LabelInstall], ident.LabelValue(p.installID))
	}
	switch status := inst.GetStatus(); status {
	case "RUNNING":
		if err := p.reset(ctx, c, zone, name); err != nil {
			return err
		}
		log.V(1).Info("instance rebooted", "how", "reset")
		return nil
	case "TERMINATED", "STOPPED":
		if err := p.start(ctx, c, zone, name); err != nil {
			return err
		}
		log.V(1).Info("instance rebooted", "how", "started")
		return nil
	case "SUSPENDED":
		return provider.Errorf(provider.ErrPermanent,
			"%s is SUSPENDED and is not rebooted by the operator; resume or delete it (gcloud compute instances resume %s --zone %s)", where, name, zone)
	default:
		return provider.Errorf(provider.ErrTransient, "%s is %s; rebooting it once it settles", where, status)
	}
}

// reset resets a running instance of this provider and waits for the operation.
func (p *Provider) reset(ctx context.Context, c *clients, zone, name string) error {
	return p.instanceOp(ctx, "instances.reset", fmt.Sprintf("resetting instance %s in zone %s", name, zone), zone, name,
		func(ctx context.Context) (*compute.Operation, error) {
			return c.instances.Reset(ctx, &computepb.ResetInstanceRequest{Project: p.cfg.Project, Zone: zone, Instance: name})
		})
}
