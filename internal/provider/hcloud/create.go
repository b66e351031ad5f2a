package hcloud

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	hc "github.com/hetznercloud/hcloud-go/v2/hcloud"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud/ident"
)

// plan is a resolved placement.
type plan struct {
	location, serverType, image string
}

// resolve checks the request against the catalogues of the entry; every miss is
// permanent and names the field. Whether Hetzner knows the values is Check's business
// (and the create's answer's, an invalid_input naming the field).
func (p *Provider) resolve(req provider.CreateRequest) (plan, error) {
	if !slices.Contains(p.cfg.Locations, req.Placement.Zone) {
		return plan{}, provider.Errorf(provider.ErrPermanent, "placement.zone %q is not in hcloud.locations %v", req.Placement.Zone, p.cfg.Locations)
	}
	if !slices.Contains(p.cfg.ServerTypes, req.Placement.MachineType) {
		return plan{}, provider.Errorf(provider.ErrPermanent, "placement.machineType %q is not in hcloud.serverTypes %v", req.Placement.MachineType, p.cfg.ServerTypes)
	}
	if !slices.Contains(p.cfg.Images, req.Placement.Image) {
		return plan{}, provider.Errorf(provider.ErrPermanent, "placement.image %q is not in hcloud.images %v", req.Placement.Image, p.cfg.Images)
	}
	if !ident.ValidName(req.Name) {
		return plan{}, provider.Errorf(provider.ErrPermanent, "instance name %q is not a server name (lowercase letters, digits and dashes, at most 63)", req.Name)
	}
	if n := len(req.CloudInit); n > provider.HCloudUserDataLimit {
		return plan{}, provider.Errorf(provider.ErrPermanent,
			"the cloud-init user-data of %s is %d bytes, over Hetzner Cloud's limit of %d bytes (32 KiB) for a server's user_data", req.Name, n, provider.HCloudUserDataLimit)
	}
	return plan{location: req.Placement.Zone, serverType: req.Placement.MachineType, image: req.Placement.Image}, nil
}

// createRounds bounds the read/act loop of Create: replace (delete), create, adopt, with
// one more for a create that met a server made meanwhile.
const createRounds = 5

// Create makes sure server req.Name runs. It reads the server first: this provider's and
// install's server of the same UID is adopted (powered on if it is off), or replaced when
// it was built from another spec hash; one of another UID is refused with
// ErrOwnedByOther, one of another install or not made by this provider with a plain
// permanent error. Otherwise it makes the Proxy's firewall (with a firewall block), then
// the server, waits for its actions, and waits until it runs with its address.
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	pl, err := p.resolve(req)
	if err != nil {
		return provider.Instance{}, err
	}
	c, err := p.client()
	if err != nil {
		return provider.Instance{}, err
	}
	for range createRounds {
		srv, err := p.getServer(ctx, c, req.Name)
		if err != nil {
			return provider.Instance{}, notNotFound(err)
		}
		if srv == nil {
			if err := p.createServer(ctx, c, pl, req); err != nil && !errors.Is(err, errAlreadyExists) {
				return provider.Instance{}, notNotFound(err)
			}
			continue
		}
		where := "server " + req.Name
		switch p.owner(srv.Labels) {
		case notThisProviders:
			return provider.Instance{}, provider.Errorf(provider.ErrPermanent,
				"%s exists but is not labelled %s=%s: it was not made by hcloud provider %s", where, LabelProvider, LabelValue(p.name), p.name)
		case otherInstall:
			return provider.Instance{}, provider.Errorf(provider.ErrPermanent,
				"%s belongs to install %q of the operator, not to this install %q", where, srv.Labels[LabelInstall], LabelValue(p.installID))
		}
		if owner := srv.Labels[LabelUID]; owner != LabelValue(req.UID) {
			return provider.Instance{}, provider.OwnedByOther(fmt.Errorf("%s belongs to Proxy UID %s, not %s", where, owner, req.UID))
		}
		if had := srv.Labels[LabelSpecHash]; had != "" && req.SpecHash != "" && had != LabelValue(req.SpecHash) {
			p.log.V(1).Info("replacing server built from another spec", "server", req.Name, "specHash", had, "want", req.SpecHash)
			if err := p.deleteServer(ctx, c, srv); err != nil {
				return provider.Instance{}, notNotFound(err)
			}
			continue
		}
		if err := p.refirewall(ctx, c, srv, req); err != nil {
			return provider.Instance{}, notNotFound(err)
		}
		out, err := p.awaitRunning(ctx, c, srv)
		return out, notNotFound(err)
	}
	return provider.Instance{}, provider.Errorf(provider.ErrTransient, "server %s kept changing while it was being created", req.Name)
}

// createServer makes the Proxy's firewall (with a firewall block) and the server, and
// waits for the server's actions. A server whose create action failed is deleted again,
// so that the next Create builds it afresh instead of adopting a broken one.
func (p *Provider) createServer(ctx context.Context, c *hc.Client, pl plan, req provider.CreateRequest) error {
	opts := hc.ServerCreateOpts{
		Name:             req.Name,
		ServerType:       &hc.ServerType{Name: pl.serverType},
		Image:            imageRef(pl.image),
		Location:         &hc.Location{Name: pl.location},
		UserData:         string(req.CloudInit),
		StartAfterCreate: hc.Ptr(true),
		Labels:           p.labels(req.UID, req.SpecHash),
		PublicNet:        &hc.ServerCreatePublicNet{EnableIPv4: true, EnableIPv6: p.cfg.HasIPv6()},
	}
	if p.cfg.ManagesFirewall() {
		fw, err := p.ensureFirewall(ctx, c, req)
		if err != nil {
			return err
		}
		opts.Firewalls = []*hc.ServerCreateFirewall{{Firewall: hc.Firewall{ID: fw.ID}}}
	}
	what := fmt.Sprintf("creating server %s in location %s", req.Name, pl.location)
	res, _, err := c.Server.Create(ctx, opts)
	if err != nil {
		return referenceMissing(p.classify(err, what))
	}
	actions := append([]*hc.Action{res.Action}, res.NextActions...)
	actions = slices.DeleteFunc(actions, func(a *hc.Action) bool { return a == nil })
	if err := c.Action.WaitFor(ctx, actions...); err != nil {
		err = p.classify(err, what)
		var acte hc.ActionError
		if errors.As(err, &acte) && res.Server != nil {
			// The create was accepted and then failed: the server (if any is left) goes.
			if derr := p.deleteServer(ctx, c, res.Server); derr != nil && !errors.Is(derr, provider.ErrNotFound) {
				p.log.Info("could not delete a server whose create failed", "server", req.Name, "error", derr.Error())
			}
		}
		return err
	}
	return nil
}

// imageRef is an image by ID when ref is a number, else by name.
func imageRef(ref string) *hc.Image {
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil {
		return &hc.Image{ID: id}
	}
	return &hc.Image{Name: ref}
}

// awaitRunning returns the server once it runs with its address, powering it on when it
// was off, polling while it starts. A server stopping or being deleted is transient.
func (p *Provider) awaitRunning(ctx context.Context, c *hc.Client, srv *hc.Server) (provider.Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, p.runningWait)
	defer cancel()
	started := false
	poll := p.pollBackoff()
	for {
		out := p.instance(srv)
		switch srv.Status {
		case hc.ServerStatusRunning:
			if out.IP != "" {
				return out, nil
			}
		case hc.ServerStatusOff:
			if !started {
				if err := p.serverAction(ctx, c, srv, "powering on", c.Server.Poweron); err != nil {
					return provider.Instance{}, err
				}
				started = true
			}
		case hc.ServerStatusStopping, hc.ServerStatusDeleting:
			return provider.Instance{}, provider.Errorf(provider.ErrTransient, "server %s is %s", srv.Name, srv.Status)
		}
		if err := sleep(ctx, poll.Step()); err != nil {
			return provider.Instance{}, provider.Transient(fmt.Errorf("waiting for server %s to run (status %s): %w", srv.Name, srv.Status, err))
		}
		next, err := p.getServer(ctx, c, srv.Name)
		if err != nil {
			return provider.Instance{}, err
		}
		if next == nil || next.ID != srv.ID {
			return provider.Instance{}, provider.Errorf(provider.ErrTransient, "server %s (ID %d) went away while it was starting", srv.Name, srv.ID)
		}
		srv = next
	}
}

// serverAction runs one action call (power on, reset) on srv and waits for the action.
func (p *Provider) serverAction(ctx context.Context, c *hc.Client, srv *hc.Server, verb string,
	call func(context.Context, *hc.Server) (*hc.Action, *hc.Response, error)) error {
	what := fmt.Sprintf("%s server %s", verb, srv.Name)
	a, _, err := call(ctx, srv)
	if err != nil {
		return p.classify(err, what)
	}
	return p.classify(c.Action.WaitFor(ctx, a), what)
}

// getServer reads the server of a name; nil when there is none.
func (p *Provider) getServer(ctx context.Context, c *hc.Client, name string) (*hc.Server, error) {
	srv, _, err := c.Server.GetByName(ctx, name)
	if err != nil {
		return nil, p.classify(err, "reading server "+name)
	}
	return srv, nil
}
