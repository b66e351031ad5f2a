package kvm2

import (
	"context"
	"fmt"
	"sync"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

// ListByTag returns every domain on every configured host that carries this provider's
// mark written by this install (or by none, before installs had identities), and
// nothing else: orphan GC deletes from this list. Hosts are listed concurrently;
// when any host fails the whole listing fails, with no partial result.
func (p *Provider) ListByTag(ctx context.Context) ([]provider.Instance, error) {
	log := tracing.Logger(ctx, p.log)
	type result struct {
		insts []provider.Instance
		err   error
	}
	results := make([]result, len(p.cfg.Hosts))
	var wg sync.WaitGroup
	for i, h := range p.cfg.Hosts {
		wg.Go(func() {
			hlog := log.WithValues("host", h.Name)
			b, err := p.hosts.pooled(ctx, h.Name)
			if err == nil {
				results[i].insts, err = p.listHost(hlog, b, h)
			}
			if err != nil {
				results[i].err = failed(hlog, "list", err, classify)
			}
		})
	}
	wg.Wait()
	var all []provider.Instance
	for _, r := range results {
		if r.err != nil {
			return nil, r.err
		}
		all = append(all, r.insts...)
	}
	log.V(1).Info("kvm2 domains listed", "hosts", len(p.cfg.Hosts), "managed", len(all))
	return all, nil
}

// listHost lists the marked domains of one host. A domain without the mark, with a mark
// that does not parse or that names another install, or that vanished while being read
// is skipped with a line.
func (p *Provider) listHost(log logr.Logger, b backend, h provider.KVMHost) ([]provider.Instance, error) {
	doms, _, err := b.ConnectListAllDomains(1, 0)
	if err != nil {
		return nil, fmt.Errorf("listing domains on host %s: %w", h.Name, err)
	}
	var out []provider.Instance
	for _, dom := range doms {
		dlog := log.WithValues("name", dom.Name)
		m, found, err := p.readMark(b, h.Name, dom)
		switch {
		case isCode(err, libvirt.ErrNoDomain):
			dlog.V(1).Info("kvm2 list skips domain", "reason", "it went away while being listed")
			continue
		case found && err != nil:
			dlog.V(1).Info("kvm2 list skips domain", "reason", "its mark does not parse", "error", err.Error())
			continue
		case err != nil:
			return nil, fmt.Errorf("reading the metadata of domain %s on host %s: %w", dom.Name, h.Name, err)
		case !found:
			dlog.V(1).Info("kvm2 list skips domain", "reason", "it carries no "+p.typ+" mark")
			continue
		case p.otherInstall(m):
			dlog.V(1).Info("kvm2 list skips domain", "reason", "it belongs to another install", "install", m.Install)
			continue
		}
		inst := provider.Instance{
			ProviderID: ident.ProviderID(h.Name, dom.Name),
			Name:       dom.Name,
			UID:        m.UID,
			State:      listedState(dom),
			CreatedAt:  m.CreatedAt,
		}
		dlog.V(2).Info("kvm2 listed instance", "uid", inst.UID, "state", inst.State, "createdAt", inst.CreatedAt)
		out = append(out, inst)
	}
	return out, nil
}

// listedState is the state a listing can tell without a call per domain: libvirt gives
// active domains an id and inactive ones -1. A listing carries no address.
func listedState(dom libvirt.Domain) string {
	if dom.ID > 0 {
		return provider.StateRunning
	}
	return provider.StateStopped
}
