package kvm2

import (
	"context"
	"errors"
	"fmt"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// undefineFlags remove what libvirt keeps beside the definition: the UEFI NVRAM copy
// (without it undefine refuses a UEFI domain), a managed save image and snapshot and
// checkpoint metadata.
const undefineFlags = libvirt.DomainUndefineNvram | libvirt.DomainUndefineManagedSave |
	libvirt.DomainUndefineSnapshotsMetadata | libvirt.DomainUndefineCheckpointsMetadata

// Delete destroys and undefines the domain providerID names and removes its overlay and
// seed. The volumes are removed by name even when there is no domain, so volumes an
// interrupted Create left are not leaked. A domain of that name without this provider's
// mark is not ours and is left alone. A providerID whose host is no longer configured is
// a logged no-op: nothing can be reached, and the Proxy must still be able to go.
func (p *Provider) Delete(ctx context.Context, id string) error {
	hostName, vm, err := parseProviderID(id)
	if err != nil {
		return err
	}
	h, ok := p.configuredHost(hostName)
	if !ok {
		p.instanceLog(ctx, hostName, vm).Info("kvm2 delete skipped: the host is not in the config, so its domain and volumes stay on it",
			"providerID", id, "block", p.typ+".hosts")
		return nil
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

func (p *Provider) delete(log logr.Logger, b backend, h provider.KVMHost, vm string) error {
	dom, err := b.DomainLookupByName(vm)
	switch {
	case err == nil:
		_, found, merr := p.readMark(b, h.Name, dom)
		if merr != nil && !found {
			return merr
		}
		if !found {
			// Same name, someone else's domain (the kvm provider's, or an admin's).
			log.Info("kvm2 delete leaves domain alone: it carries no mark of this provider", "mark", p.metaNS)
			return nil
		}
		if err := b.DomainDestroyFlags(dom, 0); err != nil &&
			!isCode(err, libvirt.ErrOperationInvalid) && !isCode(err, libvirt.ErrNoDomain) {
			return fmt.Errorf("destroying domain %s on host %s: %w", vm, h.Name, err)
		}
		if err := b.DomainUndefineFlags(dom, undefineFlags); err != nil && !isCode(err, libvirt.ErrNoDomain) {
			return fmt.Errorf("undefining domain %s on host %s: %w", vm, h.Name, err)
		}
	case !isCode(err, libvirt.ErrNoDomain):
		return fmt.Errorf("looking up domain %s on host %s: %w", vm, h.Name, err)
	}
	pool, err := b.StoragePoolLookupByName(h.Pool)
	if err != nil {
		return fmt.Errorf("looking up pool %s on host %s: %w", h.Pool, h.Name, err)
	}
	for _, name := range []string{overlayVolName(vm), seedVolName(vm)} {
		if err := deleteVolume(b, h, pool, name); err != nil {
			return err
		}
	}
	log.V(1).Info("kvm2 domain deleted")
	return nil
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
