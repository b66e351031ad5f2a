package hcloud

import (
	"context"

	hc "github.com/hetznercloud/hcloud-go/v2/hcloud"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// Reboot restarts the server providerID names in place with the reset action (`hcloud
// server reset`: a hard reset, without asking the guest), and waits for the action. The
// server keeps its name, ID, disk and addresses (its primary IPv4 and its IPv6 /64), so
// the guest boots again from its disk and cloud-init runs only its per-boot parts. A
// server that is off is powered on instead (poweron). The labels are checked first: a
// server that is not this provider entry's and install's is never touched (ErrPermanent).
// A server starting, stopping, migrating, rebuilding or being deleted is ErrTransient;
// one that is gone ErrNotFound. The call is bounded like Create's wait for running.
func (p *Provider) Reboot(ctx context.Context, id string) error {
	name, err := parseProviderID(id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.runningWait)
	defer cancel()
	c, err := p.client()
	if err != nil {
		return err
	}
	srv, err := p.getServer(ctx, c, name)
	if err != nil {
		return err
	}
	if srv == nil {
		return provider.Errorf(provider.ErrNotFound, "server %s does not exist", name)
	}
	log := p.log.WithValues("server", name)
	switch p.owner(srv.Labels) {
	case notThisProviders:
		log.Info("reboot leaves alone a server that is not this provider's", "labels", srv.Labels)
		return provider.Errorf(provider.ErrPermanent,
			"%s is not labelled %s=%s: it was not made by hcloud provider %s and is not rebooted", describe(srv), LabelProvider, LabelValue(p.name), p.name)
	case otherInstall:
		log.Info("reboot leaves alone a server of another install", "install", srv.Labels[LabelInstall])
		return provider.Errorf(provider.ErrPermanent,
			"%s belongs to install %q of the operator, not to this install %q, and is not rebooted", describe(srv), srv.Labels[LabelInstall], LabelValue(p.installID))
	}
	switch srv.Status {
	case hc.ServerStatusRunning:
		if err := p.serverAction(ctx, c, srv, "resetting", c.Server.Reset); err != nil {
			return err
		}
		log.V(1).Info("server rebooted", "how", "reset")
		return nil
	case hc.ServerStatusOff:
		if err := p.serverAction(ctx, c, srv, "powering on", c.Server.Poweron); err != nil {
			return err
		}
		log.V(1).Info("server rebooted", "how", "poweron")
		return nil
	}
	return provider.Errorf(provider.ErrTransient, "%s is %s; rebooting it once it settles", describe(srv), srv.Status)
}
