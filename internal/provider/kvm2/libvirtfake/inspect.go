package libvirtfake

import (
	"fmt"
	"net/netip"

	"github.com/digitalocean/go-libvirt"
)

// This file holds the test-side view of the daemon: setters that arrange
// what an administrator would have done on the host, and snapshots to assert
// on. None of them counts as a call or passes through the fault hooks.

// SetHostname sets what ConnectGetHostname answers.
func (f *Fake) SetHostname(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hostname = name
}

// SetLibVersion sets what ConnectGetLibVersion answers
// (major*1,000,000 + minor*1,000 + micro).
func (f *Fake) SetLibVersion(v uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.libVersion = v
}

// AddPool defines and starts a pool with no volumes, replacing any pool of
// the same name.
func (f *Fake) AddPool(name, path string, capacity uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pools[name] = &pool{name: name, uuid: newUUID(), path: path, active: true, capacity: capacity,
		vols: map[string]*volume{}}
}

// RemovePool undefines a pool and its volumes.
func (f *Fake) RemovePool(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pools, name)
}

// SetPoolActive starts or stops a pool (virsh pool-start / pool-destroy).
// Volumes survive a stop, as files in a dir pool do.
func (f *Fake) SetPoolActive(name string, active bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pools[name]
	if !ok {
		return fmt.Errorf("libvirtfake: no pool %q", name)
	}
	p.active = active
	return nil
}

// SetPoolCapacity changes a pool's capacity; its available space is the
// capacity less what its volumes allocate.
func (f *Fake) SetPoolCapacity(name string, capacity uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pools[name]
	if !ok {
		return fmt.Errorf("libvirtfake: no pool %q", name)
	}
	p.capacity = capacity
	return nil
}

// PoolInfo is a snapshot of a pool.
type PoolInfo struct {
	Name, Path                      string
	UUID                            libvirt.UUID
	Active                          bool
	Capacity, Allocation, Available uint64
	Volumes                         []string // sorted
}

// Pool returns a snapshot of the named pool.
func (f *Fake) Pool(name string) (PoolInfo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pools[name]
	if !ok {
		return PoolInfo{}, false
	}
	return PoolInfo{Name: p.name, Path: p.path, UUID: p.uuid, Active: p.active, Capacity: p.capacity,
		Allocation: p.allocation(), Available: p.available(), Volumes: sortedKeys(p.vols)}, true
}

// VolumeInfo is a snapshot of a volume, also used to place one with
// PutVolume.
type VolumeInfo struct {
	Pool, Name, Path string
	XML              string // the definition it was created from; empty for PutVolume
	Format           string // raw, qcow2, ...
	Capacity         uint64
	Allocation       uint64
	Content          []byte // a copy of what was written
	BackingStore     string // path of the backing file
	BackingFormat    string
	InUse            bool // an upload or download is running
}

// Volume returns a snapshot of a volume, its content copied.
func (f *Fake) Volume(poolName, name string) (VolumeInfo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pools[poolName]
	if !ok {
		return VolumeInfo{}, false
	}
	v, ok := p.vols[name]
	if !ok {
		return VolumeInfo{}, false
	}
	return VolumeInfo{Pool: p.name, Name: v.name, Path: p.volPath(v.name), XML: v.xml, Format: v.format,
		Capacity: v.capacity, Allocation: v.allocation, Content: append([]byte(nil), v.content...),
		BackingStore: v.backing, BackingFormat: v.backingFmt, InUse: v.inUse > 0}, true
}

// PutVolume places a volume in a pool directly, as if a file had been copied
// there and the pool refreshed; it replaces a volume of the same name.
// Format defaults to raw, Capacity to len(Content) and Allocation to
// len(Content). Pool, Path, XML and InUse are ignored.
func (f *Fake) PutVolume(poolName string, v VolumeInfo) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pools[poolName]
	if !ok {
		return fmt.Errorf("libvirtfake: no pool %q", poolName)
	}
	vol := &volume{name: v.Name, format: v.Format, capacity: v.Capacity, allocation: v.Allocation,
		content: append([]byte(nil), v.Content...), backing: v.BackingStore, backingFmt: v.BackingFormat}
	if vol.format == "" {
		vol.format = "raw"
	}
	if vol.capacity == 0 {
		vol.capacity = uint64(len(v.Content))
	}
	if vol.allocation == 0 {
		vol.allocation = uint64(len(v.Content))
	}
	p.vols[v.Name] = vol
	return nil
}

// Uploads returns every StorageVolUpload so far, in the order they started.
func (f *Fake) Uploads() []Upload {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Upload(nil), f.uploads...)
}

// DomainInfo is a snapshot of a domain.
type DomainInfo struct {
	Name       string
	UUID       libvirt.UUID
	ID         int32 // -1 while inactive
	XML        string
	State      libvirt.DomainState
	Reason     int32
	Persistent bool
	UEFI       bool
	NVRAM      bool // its NVRAM file exists
	// Starts and Resets count the DomainCreate and DomainReset calls that started or
	// reset it.
	Starts, Resets int
	// Metadata maps each namespace URI under <metadata> to the element
	// DomainGetMetadata returns for it.
	Metadata map[string]string
}

// Domain returns a snapshot of the named domain.
func (f *Fake) Domain(name string) (DomainInfo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.domains[name]
	if !ok {
		return DomainInfo{}, false
	}
	return d.info(), true
}

// Domains returns snapshots of every domain, sorted by name.
func (f *Fake) Domains() []DomainInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]DomainInfo, 0, len(f.domains))
	for _, name := range sortedKeys(f.domains) {
		out = append(out, f.domains[name].info())
	}
	return out
}

func (d *domain) info() DomainInfo {
	meta := map[string]string{}
	for _, e := range d.def.metadata {
		meta[e.uri] = e.xml
	}
	return DomainInfo{Name: d.def.name, UUID: d.uuid, ID: d.id, XML: d.xml, State: d.state, Reason: d.reason,
		Persistent: d.persistent, UEFI: d.def.uefi, NVRAM: d.nvram, Metadata: meta,
		Starts: d.starts, Resets: d.resets}
}

// SetDomainState moves a domain to state as if it happened on the host:
// DomainShutoff stops it (a transient domain disappears), DomainPaused,
// DomainPmsuspended, DomainCrashed and DomainRunning leave it active.
func (f *Fake) SetDomainState(name string, state libvirt.DomainState) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.domains[name]
	if !ok {
		return fmt.Errorf("libvirtfake: no domain %q", name)
	}
	f.setState(d, state)
	return nil
}

// SetDomainStateReason is SetDomainState with libvirt's reason for the state, for
// example a domain paused with DomainPausedStartingUp while libvirt still starts it.
func (f *Fake) SetDomainStateReason(name string, state libvirt.DomainState, reason int32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.domains[name]
	if !ok {
		return fmt.Errorf("libvirtfake: no domain %q", name)
	}
	f.setState(d, state)
	d.reason = reason
	return nil
}

// SetInterfaceAddresses sets what DomainInterfaceAddresses answers for one
// source of the named domain: ifaces, or err when it is not nil.
func (f *Fake) SetInterfaceAddresses(name string, source libvirt.DomainInterfaceAddressesSource,
	ifaces []libvirt.DomainInterface, err error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.domains[name]
	if !ok {
		return fmt.Errorf("libvirtfake: no domain %q", name)
	}
	d.addrs[source] = addrSource{ifaces: cloneIfaces(ifaces), err: err}
	return nil
}

// Interface builds a DomainInterface with a MAC address and addresses in
// CIDR form ("192.168.1.73/24", "fe80::1/64"); it panics on a malformed one.
func Interface(name, mac string, cidrs ...string) libvirt.DomainInterface {
	iface := libvirt.DomainInterface{Name: name}
	if mac != "" {
		iface.Hwaddr = libvirt.OptString{mac}
	}
	for _, c := range cidrs {
		p := netip.MustParsePrefix(c)
		typ := int32(libvirt.IPAddrTypeIpv4)
		if p.Addr().Is6() {
			typ = int32(libvirt.IPAddrTypeIpv6)
		}
		iface.Addrs = append(iface.Addrs, libvirt.DomainIPAddr{Type: typ, Addr: p.Addr().String(), Prefix: uint32(p.Bits())})
	}
	return iface
}
