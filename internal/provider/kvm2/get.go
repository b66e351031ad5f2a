package kvm2

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
)

// Get reports the domain providerID names: its state, its address (from the guest
// agent, else the host's ARP table) and the owner UID from its mark.
func (p *Provider) Get(ctx context.Context, id string) (provider.Instance, error) {
	hostName, vm, err := ident.ParseProviderID(id)
	if err != nil {
		return provider.Instance{}, err
	}
	h, ok := p.configuredHost(hostName)
	if !ok {
		// Never NotFound: a typo in hosts must not look like a vanished VM and trigger a
		// rebuild elsewhere.
		return provider.Instance{}, provider.Errorf(provider.ErrPermanent,
			"providerID %q names host %q, which is not in %s.hosts", id, hostName, p.typ)
	}
	log := p.instanceLog(ctx, h.Name, vm)
	b, err := p.hosts.pooled(ctx, h.Name)
	if err == nil {
		var inst provider.Instance
		if inst, err = p.get(log, b, h, vm); err == nil {
			return inst, nil
		}
		if errors.Is(err, provider.ErrNotFound) {
			return provider.Instance{}, err
		}
	}
	return provider.Instance{}, failed(log, "get", err, classify)
}

func (p *Provider) get(log logr.Logger, b backend, h provider.KVMHost, vm string) (provider.Instance, error) {
	dom, err := b.DomainLookupByName(vm)
	if err != nil {
		if isCode(err, libvirt.ErrNoDomain) {
			log.V(1).Info("kvm2 domain not found")
			return provider.Instance{}, provider.NotFound(fmt.Errorf("domain %s not found on host %s: %w", vm, h.Name, err))
		}
		return provider.Instance{}, fmt.Errorf("looking up domain %s on host %s: %w", vm, h.Name, err)
	}
	m, found, err := p.readMark(b, h.Name, dom)
	if err != nil {
		return provider.Instance{}, err
	}
	if !found {
		log.V(1).Info("kvm2 domain not found", "reason", "domain carries no "+p.typ+" mark")
		return provider.Instance{}, provider.Errorf(provider.ErrNotFound,
			"domain %s on host %s carries no %s mark; it was not created by this provider", vm, h.Name, p.typ)
	}
	if p.otherInstall(m) {
		// Not this install's VM, whatever its name: report it gone, so the caller
		// creates its own and meets the permanent error there.
		log.V(1).Info("kvm2 domain not found", "reason", "domain belongs to another install", "install", m.Install)
		return provider.Instance{}, otherInstallError(provider.ErrNotFound, h.Name, vm, m)
	}
	// libvirt gives an inactive domain id -1: it is shut off, and asking is a round trip
	// saved. An active one may be running, paused or suspended.
	state := libvirt.DomainShutoff
	if dom.ID != -1 {
		raw, _, err := b.DomainGetState(dom, 0)
		if err != nil {
			return provider.Instance{}, fmt.Errorf("reading the state of domain %s on host %s: %w", vm, h.Name, err)
		}
		state = libvirt.DomainState(raw)
	}
	inst := provider.Instance{
		ProviderID: ident.ProviderID(h.Name, vm), Name: vm, UID: m.UID, State: instanceState(state), CreatedAt: m.CreatedAt,
	}
	if inst.State == provider.StateRunning {
		if inst.IP, err = p.address(log, b, h, dom); err != nil {
			return provider.Instance{}, err
		}
	}
	log.V(1).Info("kvm2 domain fetched", "state", inst.State, "domainState", state.String(), "ip", inst.IP, "uid", inst.UID)
	return inst, nil
}

// instanceState maps a libvirt domain state onto the provider's states.
func instanceState(s libvirt.DomainState) string {
	switch s {
	case libvirt.DomainRunning, libvirt.DomainBlocked:
		return provider.StateRunning
	case libvirt.DomainShutdown:
		return provider.StateTerminating
	case libvirt.DomainShutoff, libvirt.DomainCrashed, libvirt.DomainPaused, libvirt.DomainPmsuspended:
		return provider.StateStopped
	}
	return provider.StateUnknown
}

// addressSources are asked in order: the guest agent knows the VM's own view; the
// host's ARP table only sees guests that have talked to the host.
var addressSources = []struct {
	name string
	src  libvirt.DomainInterfaceAddressesSource
}{
	{"agent", libvirt.DomainInterfaceAddressesSrcAgent},
	{"arp", libvirt.DomainInterfaceAddressesSrcArp},
}

// address returns the first IPv4 address of a running domain, or "" while no source
// knows one yet. Only when every source fails is it an error (transient). A guest agent
// that is not connected yet has not failed: it is what every guest shows while it boots,
// and counting it as a failure would turn each boot on a host whose ARP table libvirt
// cannot read into a run of errors (and the caller's growing back-off).
func (p *Provider) address(log logr.Logger, b backend, h provider.KVMHost, dom libvirt.Domain) (string, error) {
	var errs []error
	booting := false
	for _, s := range addressSources {
		ifaces, err := b.DomainInterfaceAddresses(dom, uint32(s.src), 0)
		if err != nil {
			log.V(2).Info("no addresses from source", "source", s.name, "error", err.Error())
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
			booting = booting || (s.src == libvirt.DomainInterfaceAddressesSrcAgent && isCode(err, libvirt.ErrAgentUnresponsive))
			continue
		}
		if log.V(2).Enabled() {
			log.V(2).Info("interface addresses", "source", s.name, "interfaces", fmt.Sprint(ifaces))
		}
		if ip := firstIPv4(ifaces); ip != "" {
			return ip, nil
		}
	}
	if len(errs) == len(addressSources) && !booting {
		return "", provider.Transient(fmt.Errorf("no address source answered for domain %s on host %s: %w",
			dom.Name, h.Name, errors.Join(errs...)))
	}
	return "", nil
}

// firstIPv4 picks the first IPv4 address that is neither loopback, link-local nor
// unspecified. The probe and the discovery API build http://<ip>:<port> from it.
func firstIPv4(ifaces []libvirt.DomainInterface) string {
	for _, ifc := range ifaces {
		for _, a := range ifc.Addrs {
			if a.Type != int32(libvirt.IPAddrTypeIpv4) {
				continue
			}
			ip := net.ParseIP(a.Addr)
			if ip == nil || ip.To4() == nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() {
				continue
			}
			return ip.String()
		}
	}
	return ""
}

// domainID renders a domain's UUID for log lines.
func domainID(dom libvirt.Domain) string {
	u := dom.UUID
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
