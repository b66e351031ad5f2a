package libvirtfake

import (
	"github.com/digitalocean/go-libvirt"
)

// Domain state reasons the fake reports (libvirt-domain.h).
const (
	reasonShutoffUnknown   = 0 // VIR_DOMAIN_SHUTOFF_UNKNOWN: defined, never started
	reasonShutoffDestroyed = 2 // VIR_DOMAIN_SHUTOFF_DESTROYED
	reasonShutoffCrashed   = 3 // VIR_DOMAIN_SHUTOFF_CRASHED
	reasonRunningBooted    = 1 // VIR_DOMAIN_RUNNING_BOOTED
	reasonPausedUser       = 2 // VIR_DOMAIN_PAUSED_USER
	reasonCrashedPanicked  = 1 // VIR_DOMAIN_CRASHED_PANICKED
)

type domain struct {
	def        *domainDef
	xml        string
	uuid       libvirt.UUID
	id         int32 // -1 while inactive
	state      libvirt.DomainState
	reason     int32
	persistent bool
	nvram      bool // the NVRAM file exists: created on the first start of a UEFI domain
	starts     int  // successful DomainCreate calls
	resets     int  // successful DomainReset calls
	addrs      map[libvirt.DomainInterfaceAddressesSource]addrSource
}

type addrSource struct {
	ifaces []libvirt.DomainInterface
	err    error
}

func (d *domain) active() bool { return d.id != -1 }

func (d *domain) handle() libvirt.Domain {
	return libvirt.Domain{Name: d.def.name, UUID: d.uuid, ID: d.id}
}

// domByHandle finds a domain the way libvirt's drivers do: by UUID.
// Callers hold f.mu.
func (f *Fake) domByHandle(h libvirt.Domain) (*domain, error) {
	for _, d := range f.domains {
		if d.uuid == h.UUID {
			return d, nil
		}
	}
	return nil, errNoDomainUUID(h)
}

// stop makes a domain inactive; a transient one disappears. Callers hold f.mu.
func (f *Fake) stop(d *domain, reason int32) {
	d.id, d.state, d.reason = -1, libvirt.DomainShutoff, reason
	if !d.persistent {
		delete(f.domains, d.def.name)
	}
}

// DomainLookupByName implements the backend method.
func (f *Fake) DomainLookupByName(name string) (libvirt.Domain, error) {
	const m = "DomainLookupByName"
	if err := f.enter(m); err != nil {
		return libvirt.Domain{}, err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.domains[name]
	if !ok {
		return libvirt.Domain{}, errNoDomainName(name)
	}
	return d.handle(), nil
}

// DomainDefineXMLFlags implements the backend method. Redefining a domain
// keeps its state and UUID; like libvirt, a definition without a <uuid> gets
// a fresh one, so redefining an existing name without its uuid fails with
// ErrOperationFailed ("already exists with uuid").
func (f *Fake) DomainDefineXMLFlags(doc string, flags libvirt.DomainDefineFlags) (libvirt.Domain, error) {
	const m = "DomainDefineXMLFlags"
	if err := f.enter(m); err != nil {
		return libvirt.Domain{}, err
	}
	defer f.leave(m)
	def, err := parseDomainXML(doc)
	if err != nil {
		return libvirt.Domain{}, err
	}
	if !def.hasUUID {
		def.uuid = newUUID()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range f.domains {
		if d.uuid == def.uuid && d.def.name != def.name {
			return libvirt.Domain{}, Errorf(libvirt.ErrOperationFailed,
				"domain '%s' is already defined with uuid %s", d.def.name, FormatUUID(d.uuid))
		}
	}
	d, ok := f.domains[def.name]
	if ok && d.uuid != def.uuid {
		return libvirt.Domain{}, Errorf(libvirt.ErrOperationFailed,
			"domain '%s' already exists with uuid %s", def.name, FormatUUID(d.uuid))
	}
	if !ok {
		d = &domain{uuid: def.uuid, id: -1, state: libvirt.DomainShutoff, reason: reasonShutoffUnknown,
			addrs: map[libvirt.DomainInterfaceAddressesSource]addrSource{}}
		f.domains[def.name] = d
	}
	d.def, d.xml, d.persistent = def, doc, true
	return d.handle(), nil
}

// DomainCreate implements the backend method: the domain runs (reason
// booted) unless SetStateAfterCreate asked for another outcome. A UEFI domain
// gets its NVRAM file on the first start.
func (f *Fake) DomainCreate(h libvirt.Domain) error {
	const m = "DomainCreate"
	if err := f.enter(m); err != nil {
		return err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.domByHandle(h)
	if err != nil {
		return err
	}
	if d.active() {
		return errDomainActive()
	}
	f.nextID++
	d.id, d.state, d.reason = f.nextID, libvirt.DomainRunning, reasonRunningBooted
	d.starts++
	if d.def.uefi {
		d.nvram = true
	}
	if st, ok := f.afterCreate[d.def.name]; ok {
		delete(f.afterCreate, d.def.name)
		f.setState(d, st)
	}
	if d.state == libvirt.DomainRunning {
		f.lease(d)
	}
	return nil
}

// setState moves a domain to state with a plausible reason. Callers hold f.mu.
func (f *Fake) setState(d *domain, st libvirt.DomainState) {
	switch st {
	case libvirt.DomainShutoff:
		f.stop(d, reasonShutoffCrashed)
		return
	case libvirt.DomainPaused:
		d.reason = reasonPausedUser
	case libvirt.DomainCrashed:
		d.reason = reasonCrashedPanicked
	default:
		d.reason = 0
		if st == libvirt.DomainRunning {
			d.reason = reasonRunningBooted
		}
	}
	if !d.active() {
		f.nextID++
		d.id = f.nextID
	}
	d.state = st
}

// DomainGetState implements the backend method.
func (f *Fake) DomainGetState(h libvirt.Domain, flags uint32) (int32, int32, error) {
	const m = "DomainGetState"
	if err := f.enter(m); err != nil {
		return 0, 0, err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.domByHandle(h)
	if err != nil {
		return 0, 0, err
	}
	return int32(d.state), d.reason, nil
}

// DomainGetMetadata implements the backend method. For
// DomainMetadataElement it returns the <metadata> child in namespace uri as
// libvirtd 9.0 serialises it, without its namespace (see dropNamespace and
// dump), or ErrNoDomainMetadata. The live and the
// persistent definition are the same here; asking for the live one of an
// inactive domain fails as in libvirt.
func (f *Fake) DomainGetMetadata(h libvirt.Domain, typ int32, uri libvirt.OptString, flags libvirt.DomainModificationImpact) (string, error) {
	const m = "DomainGetMetadata"
	if err := f.enter(m); err != nil {
		return "", err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.domByHandle(h)
	if err != nil {
		return "", err
	}
	switch {
	case flags&libvirt.DomainAffectLive != 0 && flags&libvirt.DomainAffectConfig != 0:
		return "", Errorf(libvirt.ErrInvalidArg,
			"Flags 'VIR_DOMAIN_AFFECT_LIVE' and 'VIR_DOMAIN_AFFECT_CONFIG' are mutually exclusive")
	case flags&libvirt.DomainAffectLive != 0 && !d.active():
		return "", errDomainInactive()
	}
	switch libvirt.DomainMetadataType(typ) {
	case libvirt.DomainMetadataDescription, libvirt.DomainMetadataTitle:
		if len(uri) > 0 {
			return "", Errorf(libvirt.ErrInvalidArg, "uri in virDomainGetMetadata must be NULL")
		}
		s := d.def.description
		if libvirt.DomainMetadataType(typ) == libvirt.DomainMetadataTitle {
			s = d.def.title
		}
		if s == "" {
			return "", errNoMetadata()
		}
		return s, nil
	case libvirt.DomainMetadataElement:
		if len(uri) == 0 {
			return "", Errorf(libvirt.ErrInvalidArg, "uri in virDomainGetMetadata must not be NULL")
		}
		for _, e := range d.def.metadata {
			if e.uri == uri[0] {
				return e.xml, nil
			}
		}
		return "", errNoMetadata()
	default:
		return "", Errorf(libvirt.ErrInvalidArg, "unknown metadata type '%d'", typ)
	}
}

// DomainInterfaceAddresses implements the backend method. Sources answer
// what SetInterfaceAddresses gave them; by default the agent source fails
// with ErrAgentUnresponsive (no agent connected) and the lease and ARP
// sources answer with no interfaces, as on a plain bridge. An inactive
// domain fails with ErrOperationInvalid.
func (f *Fake) DomainInterfaceAddresses(h libvirt.Domain, source uint32, flags uint32) ([]libvirt.DomainInterface, error) {
	const m = "DomainInterfaceAddresses"
	if err := f.enter(m); err != nil {
		return nil, err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.domByHandle(h)
	if err != nil {
		return nil, err
	}
	if !d.active() {
		return nil, errDomainInactive()
	}
	src := libvirt.DomainInterfaceAddressesSource(source)
	if src > libvirt.DomainInterfaceAddressesSrcArp {
		return nil, Errorf(libvirt.ErrInvalidArg, "Unknown IP address data source %d", source)
	}
	a, ok := d.addrs[src]
	if !ok {
		if src == libvirt.DomainInterfaceAddressesSrcAgent {
			return nil, errAgentNotConnected()
		}
		return nil, nil
	}
	if a.err != nil {
		return nil, a.err
	}
	return cloneIfaces(a.ifaces), nil
}

// DomainDestroyFlags implements the backend method: the domain stops
// (reason destroyed); a transient one disappears.
func (f *Fake) DomainDestroyFlags(h libvirt.Domain, flags libvirt.DomainDestroyFlagsValues) error {
	const m = "DomainDestroyFlags"
	if err := f.enter(m); err != nil {
		return err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.domByHandle(h)
	if err != nil {
		return err
	}
	if !d.active() {
		return errDomainInactive()
	}
	f.stop(d, reasonShutoffDestroyed)
	return nil
}

// DomainReset implements the backend method, as QEMU's system_reset through libvirt: an
// active domain is reset in place (same id, UUID and interface addresses; the reset is
// counted in DomainInfo.Resets). A running one keeps running, a paused one stays paused,
// and a crashed or shutting-down one runs again (reason booted). An inactive domain
// fails with ErrOperationInvalid, "domain is not running", as in libvirt.
func (f *Fake) DomainReset(h libvirt.Domain, flags uint32) error {
	const m = "DomainReset"
	if err := f.enter(m); err != nil {
		return err
	}
	defer f.leave(m)
	if flags != 0 {
		return Errorf(libvirt.ErrInvalidArg, "unsupported flags (0x%x) in function qemuDomainReset", flags)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.domByHandle(h)
	if err != nil {
		return err
	}
	if !d.active() {
		return errDomainInactive()
	}
	d.resets++
	if d.state == libvirt.DomainCrashed || d.state == libvirt.DomainShutdown {
		d.state, d.reason = libvirt.DomainRunning, reasonRunningBooted
	}
	return nil
}

// DomainUndefineFlags implements the backend method. A domain whose NVRAM
// file exists (a UEFI domain that has been started) can only be undefined
// with DomainUndefineNvram (which removes the file) or
// DomainUndefineKeepNvram. An active domain stays running as a transient one
// and disappears when it stops.
func (f *Fake) DomainUndefineFlags(h libvirt.Domain, flags libvirt.DomainUndefineFlagsValues) error {
	const m = "DomainUndefineFlags"
	if err := f.enter(m); err != nil {
		return err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	d, err := f.domByHandle(h)
	if err != nil {
		return err
	}
	if !d.persistent {
		return Errorf(libvirt.ErrOperationInvalid, "cannot undefine transient domain")
	}
	if d.nvram {
		switch {
		case flags&libvirt.DomainUndefineNvram != 0:
			d.nvram = false
		case flags&libvirt.DomainUndefineKeepNvram != 0:
		default:
			return Errorf(libvirt.ErrOperationInvalid, "cannot undefine domain with nvram")
		}
	}
	d.persistent = false
	if !d.active() {
		delete(f.domains, d.def.name)
	}
	return nil
}

func cloneIfaces(in []libvirt.DomainInterface) []libvirt.DomainInterface {
	if in == nil {
		return nil
	}
	out := make([]libvirt.DomainInterface, len(in))
	for i, x := range in {
		out[i] = libvirt.DomainInterface{Name: x.Name, Hwaddr: append(libvirt.OptString(nil), x.Hwaddr...),
			Addrs: append([]libvirt.DomainIPAddr(nil), x.Addrs...)}
	}
	return out
}
