package hcloud

import (
	"context"
	"fmt"
	"net"

	hc "github.com/hetznercloud/hcloud-go/v2/hcloud"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud/ident"
)

// instance describes srv for the contract.
func (p *Provider) instance(srv *hc.Server) provider.Instance {
	out := provider.Instance{
		ProviderID: ProviderID(srv.Name),
		Name:       srv.Name,
		UID:        srv.Labels[LabelUID],
		State:      state(srv.Status),
		CreatedAt:  srv.Created,
	}
	if out.State == provider.StateRunning || out.State == provider.StatePending {
		if ip := srv.PublicNet.IPv4; !ip.IsUnspecified() {
			out.IP = ip.IP.String()
		}
		out.IPv6 = addressIPv6(srv.PublicNet.IPv6)
	}
	return out
}

// addressIPv6 is the address a server answers on in its IPv6 /64: the network's ::1,
// which Hetzner's images configure from the metadata service.
func addressIPv6(v6 hc.ServerPublicNetIPv6) string {
	if v6.Network == nil || v6.IsUnspecified() {
		return ""
	}
	ip := v6.Network.IP.To16()
	if ip == nil {
		return ""
	}
	addr := make(net.IP, net.IPv6len)
	copy(addr, ip)
	addr[15] |= 1
	return addr.String()
}

// state maps a server status to the contract's states.
func state(s hc.ServerStatus) string {
	switch s {
	case hc.ServerStatusRunning:
		return provider.StateRunning
	case hc.ServerStatusInitializing, hc.ServerStatusStarting, hc.ServerStatusMigrating, hc.ServerStatusRebuilding:
		return provider.StatePending
	case hc.ServerStatusStopping, hc.ServerStatusDeleting:
		return provider.StateTerminating
	case hc.ServerStatusOff:
		return provider.StateStopped
	}
	return provider.StateUnknown
}

// Get describes the server providerID names. A server that is gone, or that is not this
// provider's and install's, is ErrNotFound.
func (p *Provider) Get(ctx context.Context, id string) (provider.Instance, error) {
	name, err := parseProviderID(id)
	if err != nil {
		return provider.Instance{}, err
	}
	c, err := p.client()
	if err != nil {
		return provider.Instance{}, err
	}
	srv, err := p.getServer(ctx, c, name)
	switch {
	case err != nil:
		return provider.Instance{}, err
	case srv == nil:
		return provider.Instance{}, provider.Errorf(provider.ErrNotFound, "server %s does not exist", name)
	case p.owner(srv.Labels) != ownedHere:
		return provider.Instance{}, provider.Errorf(provider.ErrNotFound, "server %s is not this install's (labels %s=%q, %s=%q)",
			name, LabelProvider, srv.Labels[LabelProvider], LabelInstall, srv.Labels[LabelInstall])
	}
	return p.instance(srv), nil
}

// Delete removes the server providerID names and the Proxy's firewall (whether or not a
// server was found, when the firewall is this install's). Gone, or not this install's,
// is success. A refused token is transient here, never permanent.
func (p *Provider) Delete(ctx context.Context, id string) error {
	return credentialsRetried(p.delete(ctx, id))
}

func (p *Provider) delete(ctx context.Context, id string) error {
	name, err := parseProviderID(id)
	if err != nil {
		return err
	}
	c, err := p.client()
	if err != nil {
		return err
	}
	srv, err := p.getServer(ctx, c, name)
	switch {
	case err != nil:
		return notNotFound(err)
	case srv != nil && p.owner(srv.Labels) != ownedHere:
		p.log.V(1).Info("leaving alone a server that is not this install's", "server", name)
	case srv != nil:
		if err := p.deleteServer(ctx, c, srv); err != nil {
			return notNotFound(err)
		}
	}
	return notNotFound(p.deleteFirewall(ctx, c, name))
}

// deleteServer deletes srv and waits for the action; gone meanwhile is success.
func (p *Provider) deleteServer(ctx context.Context, c *hc.Client, srv *hc.Server) error {
	what := "deleting server " + srv.Name
	res, _, err := c.Server.DeleteWithResult(ctx, srv)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return p.classify(err, what)
	}
	if res == nil || res.Action == nil {
		return nil
	}
	return p.classify(c.Action.WaitFor(ctx, res.Action), what)
}

// ListByTag lists this provider's and install's servers (one label-selected listing,
// checked again here) and the firewalls of this install whose server is not there, each
// as an instance in state Unknown, so that Delete of it (by the deleting Proxy, or by
// orphan GC) removes the firewall. Any failed page fails the whole listing.
func (p *Provider) ListByTag(ctx context.Context) ([]provider.Instance, error) {
	c, err := p.client()
	if err != nil {
		return nil, err
	}
	servers, err := c.Server.AllWithOpts(ctx, hc.ServerListOpts{ListOpts: hc.ListOpts{LabelSelector: p.selector(), PerPage: 50}})
	if err != nil {
		return nil, notNotFound(p.classify(err, "listing servers"))
	}
	var out []provider.Instance
	have := map[string]bool{}
	for _, srv := range servers {
		if p.owner(srv.Labels) == ownedHere {
			out = append(out, p.instance(srv))
			have[srv.Name] = true
		}
	}
	fws, err := c.Firewall.AllWithOpts(ctx, hc.FirewallListOpts{ListOpts: hc.ListOpts{LabelSelector: p.selector(), PerPage: 50}})
	if err != nil {
		return nil, notNotFound(p.classify(err, "listing firewalls"))
	}
	for _, fw := range fws {
		server := fw.Labels[LabelServer]
		if p.owner(fw.Labels) != ownedHere || have[server] || !ident.ValidName(server) {
			continue
		}
		have[server] = true
		out = append(out, provider.Instance{
			ProviderID: ProviderID(server), Name: server, UID: fw.Labels[LabelUID],
			State: provider.StateUnknown, CreatedAt: fw.Created,
		})
	}
	return out, nil
}

// describe names a server for messages: its name and ID.
func describe(srv *hc.Server) string { return fmt.Sprintf("server %s (ID %d)", srv.Name, srv.ID) }
