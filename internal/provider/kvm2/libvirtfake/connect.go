package libvirtfake

import (
	"github.com/digitalocean/go-libvirt"
)

// ConnectGetLibVersion implements the backend method.
func (f *Fake) ConnectGetLibVersion() (uint64, error) {
	const m = "ConnectGetLibVersion"
	if err := f.enter(m); err != nil {
		return 0, err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.libVersion, nil
}

// ConnectGetHostname implements the backend method.
func (f *Fake) ConnectGetHostname() (string, error) {
	const m = "ConnectGetHostname"
	if err := f.enter(m); err != nil {
		return "", err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hostname, nil
}

// ConnectListAllDomains implements the backend method with libvirt's
// active/inactive, persistent/transient and running/paused/shutoff/other
// filter pairs (a pair with neither bit set does not filter). Domains come
// back sorted by name; with needResults 0 only the count is returned.
func (f *Fake) ConnectListAllDomains(needResults int32, flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, uint32, error) {
	const m = "ConnectListAllDomains"
	if err := f.enter(m); err != nil {
		return nil, 0, err
	}
	defer f.leave(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []libvirt.Domain
	for _, name := range sortedKeys(f.domains) {
		d := f.domains[name]
		if matchListFlags(d, flags) {
			out = append(out, d.handle())
		}
	}
	n := uint32(len(out))
	if needResults == 0 {
		out = nil
	}
	return out, n, nil
}

func matchListFlags(d *domain, flags libvirt.ConnectListAllDomainsFlags) bool {
	pair := func(a, b libvirt.ConnectListAllDomainsFlags, isA bool) bool {
		if flags&(a|b) == 0 {
			return true
		}
		return (isA && flags&a != 0) || (!isA && flags&b != 0)
	}
	if !pair(libvirt.ConnectListDomainsActive, libvirt.ConnectListDomainsInactive, d.active()) {
		return false
	}
	if !pair(libvirt.ConnectListDomainsPersistent, libvirt.ConnectListDomainsTransient, d.persistent) {
		return false
	}
	stateBits := libvirt.ConnectListDomainsRunning | libvirt.ConnectListDomainsPaused |
		libvirt.ConnectListDomainsShutoff | libvirt.ConnectListDomainsOther
	if flags&stateBits == 0 {
		return true
	}
	switch d.state {
	case libvirt.DomainRunning:
		return flags&libvirt.ConnectListDomainsRunning != 0
	case libvirt.DomainPaused:
		return flags&libvirt.ConnectListDomainsPaused != 0
	case libvirt.DomainShutoff:
		return flags&libvirt.ConnectListDomainsShutoff != 0
	default:
		return flags&libvirt.ConnectListDomainsOther != 0
	}
}
