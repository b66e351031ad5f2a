package libvirtfake

import (
	"fmt"
	"net/netip"

	"github.com/digitalocean/go-libvirt"
)

// leases hands out the addresses AssignAddresses asked for.
type leases struct {
	source libvirt.DomainInterfaceAddressesSource
	prefix netip.Prefix
	next   netip.Addr
	n      int // addresses handed out
}

// AssignAddresses makes every later DomainCreate that leaves a domain running give it an
// address of prefix on source, when source knows none for it yet, as a guest that booted
// and took a DHCP lease shows: the first is prefix's own address ("192.168.122.10/24"
// hands out .10, .11, ...), on an interface vnet<n> whose MAC is 52:54:00 and the
// address's last three bytes. A domain keeps its address through stops and restarts
// until it is undefined; past the end of prefix no more are handed out. Without it (the
// default) the sources answer only what SetInterfaceAddresses set.
func (f *Fake) AssignAddresses(source libvirt.DomainInterfaceAddressesSource, prefix netip.Prefix) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leases = &leases{source: source, prefix: prefix, next: prefix.Addr()}
}

// lease gives d the next address, if AssignAddresses asked for it and its source knows
// none for d. Callers hold f.mu.
func (f *Fake) lease(d *domain) {
	l := f.leases
	if l == nil || !l.next.IsValid() || !l.prefix.Contains(l.next) {
		return
	}
	if _, ok := d.addrs[l.source]; ok {
		return
	}
	b := l.next.AsSlice()
	mac := fmt.Sprintf("52:54:00:%02x:%02x:%02x", b[len(b)-3], b[len(b)-2], b[len(b)-1])
	cidr := netip.PrefixFrom(l.next, l.prefix.Bits()).String()
	d.addrs[l.source] = addrSource{ifaces: []libvirt.DomainInterface{Interface(fmt.Sprintf("vnet%d", l.n), mac, cidr)}}
	l.n++
	l.next = l.next.Next()
}
