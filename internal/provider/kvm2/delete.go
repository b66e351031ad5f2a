package kvm2

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
)

// undefineFlags remove what libvirt keeps beside the definition: the UEFI NVRAM copy
// (without it undefine refuses a UEFI domain), a managed save image and snapshot and
// checkpoint metadata.
const undefineFlags = libvirt.DomainUndefineNvram | libvirt.DomainUndefineManagedSave |
	libvirt.DomainUndefineSnapshotsMetadata | libvirt.DomainUndefineCheckpointsMetadata

// Delete destroys and undefines the domain providerID names and removes its overlay and
// seed. The volumes are removed by name even when there is no domain, so volumes an
// interrupted Create left are not leaked. A domain of that name without this provider's
// mark, or marked by another install, is not ours and is left alone, volumes included. A
// providerID whose host is no longer configured cannot be reached: that is a permanent
// error wrapping provider.ErrLeftBehind, which tells the caller to let the Proxy go while
// saying that the domain may still be on that host.
func (p *Provider) Delete(ctx context.Context, id string) error {
	hostName, vm, err := ident.ParseProviderID(id)
	if err != nil {
		return err
	}
	h, ok := p.configuredHost(hostName)
	if !ok {
		p.instanceLog(ctx, hostName, vm).Info("kvm2 delete skipped: the host is not in the config, so its domain and volumes stay on it",
			"providerID", id, "block", p.typ+".hosts")
		return p.leftBehind(hostName, vm)
	}
	log := p.instanceLog(ctx, h.Name, vm)
	unlock, err := p.locks.lock(ctx, vm)
	if err != nil {
		return provider.Transient(fmt.Errorf("waiting for the lock on domain %s: %w", vm, err))
	}
	defer unlock()
	b, err := p.hosts.pooled(ctx, h.Name)
	if err == nil {
		if err = p.delete(log, b, h, vm); err == nil {
			return nil
		}
	}
	err = failed(log, "delete", err, classify)
	if errors.Is(err, provider.ErrNotFound) {
		// Something vanished underneath a step; the contract forbids NotFound from
		// Delete, and a retry finds it gone.
		return provider.Transient(fmt.Errorf("deleting domain %s on host %s: %s", vm, h.Name, err.Error()))
	}
	return err
}

// leftBehind is Delete's answer for domain vm on host, which the config no longer lists:
// permanent, wrapping provider.ErrLeftBehind, and naming the commands that remove the
// domain and its volumes on the host by hand.
func (p *Provider) leftBehind(host, vm string) error {
	return provider.Errorf(provider.ErrPermanent,
		"%w: domain %s is on host %s, which is not in %s.hosts, so it and its volumes may still be there; remove them on that host with "+
			"virsh -c qemu:///system undefine --nvram %s, "+
			"virsh -c qemu:///system vol-delete --pool <pool> %s and "+
			"virsh -c qemu:///system vol-delete --pool <pool> %s",
		provider.ErrLeftBehind, vm, host, p.typ, vm, overlayVolName(vm), seedVolName(vm))
}

func (p *Provider) delete(log logr.Logger, b backend, h provider.KVMHost, vm string) error {
	dom, err := b.DomainLookupByName(vm)
	switch {
	case err == nil:
		m, found, merr := p.readMark(b, h.Name, dom)
		if merr != nil && !found {
			return merr
		}
		if !found {
			// Same name, someone else's domain (the kvm provider's, or an admin's).
			log.Info("kvm2 delete leaves domain alone: it carries no mark of this provider", "mark", p.metaNS)
			return nil
		}
		if merr == nil && p.otherInstall(m) {
			// Same name, made by another install of the operator sharing the host.
			log.Info("kvm2 delete leaves domain alone: it belongs to another install", "install", m.Install)
			return nil
		}
		return p.remove(log, b, h, dom)
	case !isCode(err, libvirt.ErrNoDomain):
		return fmt.Errorf("looking up domain %s on host %s: %w", vm, h.Name, err)
	}
	if err := p.removeLeftOvers(log, b, h, vm); err != nil {
		return err
	}
	log.V(1).Info("kvm2 domain deleted")
	return nil
}

// remove destroys dom, whose mark the caller has checked, deletes its overlay and seed
// and then undefines it. The volumes go while the domain still holds the name: once it
// is undefined, another install may claim the name and create volumes of it, which must
// not be the ones this call deletes.
func (p *Provider) remove(log logr.Logger, b backend, h provider.KVMHost, dom libvirt.Domain) error {
	vm := dom.Name
	if err := b.DomainDestroyFlags(dom, 0); err != nil &&
		!isCode(err, libvirt.ErrOperationInvalid) && !isCode(err, libvirt.ErrNoDomain) {
		return fmt.Errorf("destroying domain %s on host %s: %w", vm, h.Name, err)
	}
	if err := p.removeVolumes(b, h, vm); err != nil {
		return err
	}
	if err := b.DomainUndefineFlags(dom, undefineFlags); err != nil && !isCode(err, libvirt.ErrNoDomain) {
		return fmt.Errorf("undefining domain %s on host %s: %w", vm, h.Name, err)
	}
	log.V(1).Info("kvm2 domain deleted")
	return nil
}

// removeLeftOvers deletes the overlay and seed of vm, which has no domain: volumes an
// interrupted Create of an earlier release left (this one claims the name before it
// creates any). When there are any, it claims the name first, with a mark saying it
// is removing, so that it never deletes the volumes of a Create that claimed the name
// after the lookup; such a Create wins the claim and this Delete answers transient, and
// its retry finds that domain and goes by its mark.
func (p *Provider) removeLeftOvers(log logr.Logger, b backend, h provider.KVMHost, vm string) error {
	pool, err := b.StoragePoolLookupByName(h.Pool)
	if err != nil {
		return fmt.Errorf("looking up pool %s on host %s: %w", h.Pool, h.Name, err)
	}
	left := false
	for _, name := range []string{overlayVolName(vm), seedVolName(vm)} {
		_, err := b.StorageVolLookupByName(pool, name)
		if err == nil {
			left = true
			break
		}
		if !isCode(err, libvirt.ErrNoStorageVol) {
			return fmt.Errorf("looking up volume %s in pool %s on host %s: %w", name, h.Pool, h.Name, err)
		}
	}
	if !left {
		return nil
	}
	claim, err := p.claim(b, h, vm, ident.Mark{CreatedAt: p.now().UTC().Truncate(time.Second), Install: p.installID, Removing: true})
	if isCode(err, libvirt.ErrOperationFailed) {
		return provider.Errorf(provider.ErrTransient,
			"domain %s on host %s was defined while its left-over volumes were to be removed; trying again", vm, h.Name)
	}
	if err != nil {
		return err
	}
	log.V(1).Info("kvm2 delete removes volumes left without a domain", "volumes", []string{overlayVolName(vm), seedVolName(vm)})
	if err := p.removeVolumes(b, h, vm); err != nil {
		return err
	}
	if err := b.DomainUndefineFlags(claim, undefineFlags); err != nil && !isCode(err, libvirt.ErrNoDomain) {
		return fmt.Errorf("undefining the claim of domain %s on host %s: %w", vm, h.Name, err)
	}
	return nil
}

// removeVolumes deletes the overlay and the seed of domain vm; missing ones are fine.
func (p *Provider) removeVolumes(b backend, h provider.KVMHost, vm string) error {
	pool, err := b.StoragePoolLookupByName(h.Pool)
	if err != nil {
		return fmt.Errorf("looking up pool %s on host %s: %w", h.Pool, h.Name, err)
	}
	for _, name := range []string{overlayVolName(vm), seedVolName(vm)} {
		if err := deleteVolume(b, h, pool, name); err != nil {
			return err
		}
	}
	return nil
}

// removeElsewhere deletes the domains this install has for plan's UID on the provider's
// other hosts. A Create calls it only when the target host has no domain of the name,
// which is when a Proxy that never got a providerID recorded may have moved: an earlier
// attempt on its old host defined a domain (maybe running) that orphan GC would never
// collect while the Proxy exists. It costs one listing per other host, and nothing with
// a single host. A host that cannot be listed is skipped with a line rather than failing
// the Create, so one host down does not stop new Proxies on the others.
func (p *Provider) removeElsewhere(ctx context.Context, log logr.Logger, plan createPlan) error {
	uid := plan.req.UID
	if uid == "" || len(p.cfg.Hosts) < 2 {
		return nil
	}
	for _, h := range p.cfg.Hosts {
		if h.Name == plan.host.Name {
			continue
		}
		hlog := log.WithValues("otherHost", h.Name)
		b, err := p.hosts.pooled(ctx, h.Name)
		var insts []provider.Instance
		if err == nil {
			insts, err = p.listHost(hlog, b, h)
		}
		if err != nil {
			hlog.Info("kvm2 create could not look for domains of this UID on another host; any stays there",
				"uid", uid, "error", err.Error())
			continue
		}
		for _, inst := range insts {
			if inst.UID != uid {
				continue
			}
			if err := p.deleteOther(ctx, hlog, b, h, plan.req.Name, inst.Name); err != nil {
				return fmt.Errorf("removing domain %s of UID %s from host %s, which placement no longer selects: %w",
					inst.Name, uid, h.Name, err)
			}
			hlog.Info("kvm2 domain removed from another host: placement moved it", "otherName", inst.Name, "uid", uid)
		}
	}
	return nil
}

// deleteOther deletes domain vm on host h for a Create of name, which holds name's lock
// (the names match unless the naming scheme changed in between).
func (p *Provider) deleteOther(ctx context.Context, log logr.Logger, b backend, h provider.KVMHost, name, vm string) error {
	if vm != name {
		unlock, err := p.locks.lock(ctx, vm)
		if err != nil {
			return provider.Transient(fmt.Errorf("waiting for the lock on domain %s: %w", vm, err))
		}
		defer unlock()
	}
	return p.delete(log, b, h, vm)
}

// deleteVolume removes volume name from pool; a volume that is not there is fine.
func deleteVolume(b backend, h provider.KVMHost, pool libvirt.StoragePool, name string) error {
	vol, err := b.StorageVolLookupByName(pool, name)
	if err == nil {
		err = b.StorageVolDelete(vol, 0)
	}
	if err != nil && !isCode(err, libvirt.ErrNoStorageVol) {
		return fmt.Errorf("deleting volume %s from pool %s on host %s: %w", name, h.Pool, h.Name, err)
	}
	return nil
}
