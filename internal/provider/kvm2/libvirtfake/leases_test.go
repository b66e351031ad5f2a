package libvirtfake

import (
	"net/netip"
	"testing"

	"github.com/digitalocean/go-libvirt"
)

// TestAssignAddresses: with AssignAddresses each domain's first start gives it the next
// address of the range on the chosen source, kept through a restart, not given to a
// domain that already has one, none past the range's end, and a fresh one to a domain
// defined again after its undefine; without it a start gives none (the default).
func TestAssignAddresses(t *testing.T) {
	agent, arp := libvirt.DomainInterfaceAddressesSrcAgent, libvirt.DomainInterfaceAddressesSrcArp
	addrOf := func(f *Fake, d libvirt.Domain, src libvirt.DomainInterfaceAddressesSource) (ip, mac, name string) {
		t.Helper()
		ifaces, err := f.DomainInterfaceAddresses(d, uint32(src), 0)
		if err != nil {
			return "error: " + err.Error(), "", ""
		}
		if len(ifaces) != 1 || len(ifaces[0].Addrs) != 1 || len(ifaces[0].Hwaddr) != 1 {
			return "", "", ""
		}
		a := ifaces[0].Addrs[0]
		return netip.PrefixFrom(netip.MustParseAddr(a.Addr), int(a.Prefix)).String(), ifaces[0].Hwaddr[0], ifaces[0].Name
	}
	start := func(f *Fake, name string) libvirt.Domain {
		t.Helper()
		d := mustDefine(t, f, domXML(name, ""))
		if err := f.DomainCreate(d); err != nil {
			t.Fatal(err)
		}
		d, _ = f.DomainLookupByName(name)
		return d
	}

	plain := New()
	if ip, _, _ := addrOf(plain, start(plain, "vm0"), arp); ip != "" {
		t.Fatalf("without AssignAddresses the ARP source answers %q, want nothing", ip)
	}

	f := New()
	f.AssignAddresses(arp, netip.MustParsePrefix("192.168.122.254/24"))
	a := start(f, "a")
	if ip, mac, name := addrOf(f, a, arp); ip != "192.168.122.254/24" || mac != "52:54:00:a8:7a:fe" || name != "vnet0" {
		t.Fatalf("first domain: %s %s %s, want 192.168.122.254/24 on vnet0 with MAC 52:54:00:a8:7a:fe", ip, mac, name)
	}
	if ip, _, _ := addrOf(f, a, agent); ip != "error: Guest agent is not responding: QEMU guest agent is not connected" {
		t.Fatalf("the agent source answers %q, want its default", ip)
	}
	b := start(f, "b")
	if ip, _, name := addrOf(f, b, arp); ip != "192.168.122.255/24" || name != "vnet1" {
		t.Fatalf("second domain: %s on %s, want 192.168.122.255/24 on vnet1", ip, name)
	}
	if ip, _, _ := addrOf(f, start(f, "c"), arp); ip != "" {
		t.Fatalf("a domain started past the range's end got %s, want no address", ip)
	}

	// A restart keeps the address; an address set beforehand is left alone.
	if err := f.DomainDestroyFlags(a, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.DomainCreate(a); err != nil {
		t.Fatal(err)
	}
	a, _ = f.DomainLookupByName("a")
	if ip, _, _ := addrOf(f, a, arp); ip != "192.168.122.254/24" {
		t.Fatalf("after a restart: %s, want 192.168.122.254/24", ip)
	}
	f.AssignAddresses(arp, netip.MustParsePrefix("10.0.0.5/8"))
	d := mustDefine(t, f, domXML("d", ""))
	if err := f.SetInterfaceAddresses("d", arp, []libvirt.DomainInterface{Interface("eth0", "52:54:00:00:00:01", "172.16.0.9/16")}, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.DomainCreate(d); err != nil {
		t.Fatal(err)
	}
	d, _ = f.DomainLookupByName("d")
	if ip, _, _ := addrOf(f, d, arp); ip != "172.16.0.9/16" {
		t.Fatalf("a domain with an address set: %s, want it kept (172.16.0.9/16)", ip)
	}

	// Undefined and defined again, the domain is a new one with a new lease.
	if err := f.DomainDestroyFlags(b, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.DomainUndefineFlags(b, 0); err != nil {
		t.Fatal(err)
	}
	if ip, _, name := addrOf(f, start(f, "b"), arp); ip != "10.0.0.5/8" || name != "vnet0" {
		t.Fatalf("b defined again: %s on %s, want 10.0.0.5/8 on vnet0", ip, name)
	}
}
