package kvm2

import (
	"context"
	"fmt"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
)

var _ provider.Rebooter = (*Provider)(nil)

// Reboot restarts the domain providerID names in place, the hard way: libvirt's
// virDomainReset (virsh reset), QEMU's system_reset, which is the reset button. The QEMU
// process, the domain's definition, UUID, disks, MAC address and so its DHCP lease all
// stay; the guest boots again from its overlay, with the same seed, so cloud-init runs
// only its per-boot parts. A reset rather than destroy and start: one RPC, no new QEMU
// process, nothing for libvirt to set up again (and nothing that can fail half way
// between a destroy and a start). A domain that is shut off is started; one that is
// crashed or still shutting down is destroyed and started; and when the hypervisor
// answers that it cannot reset (ErrNoSupport) the domain is destroyed and started too.
//
// The mark is checked first: a domain without this provider's mark, or marked by
// another install, is never touched (ErrPermanent). Nor is a domain paused or
// pmsuspended by someone on the host (ErrPermanent, as for Create). A domain that is
// gone is ErrNotFound; a host no longer in the config, or a malformed providerID,
// ErrPermanent. Reboot holds the per-name lock Create and Delete take, so it never
// interleaves with their steps.
func (p *Provider) Reboot(ctx context.Context, id string) error {
	hostName, vm, err := ident.ParseProviderID(id)
	if err != nil {
		return err
	}
	h, ok := p.configuredHost(hostName)
	if !ok {
		return provider.Errorf(provider.ErrPermanent,
			"providerID %q names host %q, which is not in %s.hosts", id, hostName, p.typ)
	}
	log := p.instanceLog(ctx, h.Name, vm)
	unlock, err := p.locks.lock(ctx, vm)
	if err != nil {
		return provider.Transient(fmt.Errorf("waiting for the lock on domain %s: %w", vm, err))
	}
	defer unlock()
	b, err := p.hosts.pooled(ctx, h.Name)
	if err == nil {
		if err = p.reboot(ctx, log, b, h, vm); err == nil {
			return nil
		}
	}
	return failed(log, "reboot", err, classify)
}

func (p *Provider) reboot(ctx context.Context, log logr.Logger, b backend, h provider.KVMHost, vm string) error {
	dom, err := b.DomainLookupByName(vm)
	if err != nil {
		if isCode(err, libvirt.ErrNoDomain) {
			log.V(1).Info("kvm2 domain not found")
			return provider.NotFound(fmt.Errorf("domain %s not found on host %s: %w", vm, h.Name, err))
		}
		return fmt.Errorf("looking up domain %s on host %s: %w", vm, h.Name, err)
	}
	m, found, err := p.readMark(b, h.Name, dom)
	if err != nil {
		return err
	}
	switch {
	case !found:
		log.Info("kvm2 reboot leaves domain alone: it carries no mark of this provider", "mark", p.metaNS)
		return provider.Errorf(provider.ErrPermanent,
			"domain %s on host %s carries no %s mark; it was not created by this provider and is not rebooted", vm, h.Name, p.typ)
	case p.otherInstall(m):
		log.Info("kvm2 reboot leaves domain alone: it belongs to another install", "install", m.Install)
		return otherInstallError(provider.ErrPermanent, h.Name, vm, m)
	case m.Removing:
		return provider.Errorf(provider.ErrTransient,
			"domain %s on host %s is a claim held while volumes of that name are removed; trying again", vm, h.Name)
	}
	state, reason, err := b.DomainGetState(dom, 0)
	if err != nil {
		return fmt.Errorf("reading the state of domain %s on host %s: %w", vm, h.Name, err)
	}
	switch s := libvirt.DomainState(state); s {
	case libvirt.DomainRunning, libvirt.DomainBlocked:
		err := b.DomainReset(dom, 0)
		if err == nil {
			log.V(1).Info("kvm2 domain rebooted", "how", "reset", "id", domainID(dom))
			return nil
		}
		if !isCode(err, libvirt.ErrNoSupport) {
			return fmt.Errorf("resetting domain %s on host %s: %w", vm, h.Name, err)
		}
		log.V(1).Info("kvm2 reboot: the hypervisor cannot reset the domain; destroying and starting it", "error", err.Error())
		return p.destroyAndStart(ctx, log, b, h, dom)
	case libvirt.DomainShutdown, libvirt.DomainCrashed:
		return p.destroyAndStart(ctx, log, b, h, dom)
	case libvirt.DomainShutoff:
		if err := p.start(ctx, log, b, h, dom); err != nil {
			return err
		}
		log.V(1).Info("kvm2 domain rebooted", "how", "started", "id", domainID(dom))
		return nil
	case libvirt.DomainPaused:
		if libvirt.DomainPausedReason(reason) == libvirt.DomainPausedStartingUp {
			return provider.Errorf(provider.ErrTransient,
				"domain %s on host %s is starting up; waiting for it to settle", vm, h.Name)
		}
		fallthrough
	case libvirt.DomainPmsuspended:
		return provider.Errorf(provider.ErrPermanent,
			"domain %s on host %s is %s and is not rebooted by the operator; resume or destroy it on the host", vm, h.Name, s)
	default:
		return provider.Errorf(provider.ErrTransient,
			"domain %s on host %s is %s; waiting for it to settle", vm, h.Name, s)
	}
}

// destroyAndStart powers dom off and boots it again: the reboot of a domain that cannot be
// reset, is crashed (kept for inspection, it starts only after a destroy) or is stuck
// shutting down.
func (p *Provider) destroyAndStart(ctx context.Context, log logr.Logger, b backend, h provider.KVMHost, dom libvirt.Domain) error {
	if err := b.DomainDestroyFlags(dom, 0); err != nil && !isCode(err, libvirt.ErrOperationInvalid) {
		return fmt.Errorf("destroying domain %s on host %s: %w", dom.Name, h.Name, err)
	}
	if err := p.start(ctx, log, b, h, dom); err != nil {
		return err
	}
	log.V(1).Info("kvm2 domain rebooted", "how", "destroyed and started", "id", domainID(dom))
	return nil
}
