package libvirtfake

import (
	"fmt"
	"testing"

	"github.com/digitalocean/go-libvirt"
)

const testNS = "https://example.test/kvm2"

func domXML(name, extra string) string {
	return fmt.Sprintf(`<domain type="kvm"><name>%s</name><memory unit="MiB">512</memory>%s</domain>`, name, extra)
}

func mustDefine(t *testing.T, f *Fake, doc string) libvirt.Domain {
	t.Helper()
	d, err := f.DomainDefineXMLFlags(doc, 0)
	if err != nil {
		t.Fatalf("define: %v", err)
	}
	return d
}

func wantCode(t *testing.T, err error, code libvirt.ErrorNumber, msg string) {
	t.Helper()
	if got := libvirtCode(err); got != code {
		t.Fatalf("got error %v (code %d), want code %s", err, got, code)
	}
	if msg != "" && err.Error() != msg {
		t.Fatalf("message %q, want %q", err.Error(), msg)
	}
}

func TestDomainLifecycle(t *testing.T) {
	f := New()
	d := mustDefine(t, f, domXML("vm1", ""))
	if d.ID != -1 {
		t.Fatalf("a defined domain has id %d, want -1", d.ID)
	}
	st, _, _ := f.DomainGetState(d, 0)
	if libvirt.DomainState(st) != libvirt.DomainShutoff {
		t.Fatalf("new domain state %d", st)
	}
	if err := f.DomainCreate(d); err != nil {
		t.Fatal(err)
	}
	wantCode(t, f.DomainCreate(d), libvirt.ErrOperationInvalid, "Requested operation is not valid: domain is already running")
	st, reason, _ := f.DomainGetState(d, 0)
	if libvirt.DomainState(st) != libvirt.DomainRunning || reason != reasonRunningBooted {
		t.Fatalf("after create: state %d reason %d", st, reason)
	}
	if got, _ := f.DomainLookupByName("vm1"); got.ID <= 0 {
		t.Fatalf("running domain has id %d", got.ID)
	}
	if err := f.DomainDestroyFlags(d, 0); err != nil {
		t.Fatal(err)
	}
	wantCode(t, f.DomainDestroyFlags(d, 0), libvirt.ErrOperationInvalid, "Requested operation is not valid: domain is not running")
	if err := f.DomainUndefineFlags(d, 0); err != nil {
		t.Fatal(err)
	}
	_, err := f.DomainLookupByName("vm1")
	wantCode(t, err, libvirt.ErrNoDomain, "Domain not found: no domain with matching name 'vm1'")
	_, _, err = f.DomainGetState(d, 0)
	wantCode(t, err, libvirt.ErrNoDomain, fmt.Sprintf("Domain not found: no domain with matching uuid '%s' (vm1)", FormatUUID(d.UUID)))
}

func TestRedefineNeedsTheSameUUID(t *testing.T) {
	f := New()
	d := mustDefine(t, f, domXML("vm1", ""))
	_, err := f.DomainDefineXMLFlags(domXML("vm1", ""), 0)
	wantCode(t, err, libvirt.ErrOperationFailed,
		fmt.Sprintf("operation failed: domain 'vm1' already exists with uuid %s", FormatUUID(d.UUID)))
	withUUID := domXML("vm1", "<uuid>"+FormatUUID(d.UUID)+"</uuid><title>new</title>")
	again := mustDefine(t, f, withUUID)
	if again.UUID != d.UUID {
		t.Fatal("redefinition changed the uuid")
	}
	if got, _ := f.Domain("vm1"); got.XML != withUUID {
		t.Fatal("redefinition did not replace the XML")
	}
	_, err = f.DomainDefineXMLFlags(domXML("vm2", "<uuid>"+FormatUUID(d.UUID)+"</uuid>"), 0)
	wantCode(t, err, libvirt.ErrOperationFailed, "")
}

func TestStaleHandleAfterRecreate(t *testing.T) {
	f := New()
	old := mustDefine(t, f, domXML("vm1", ""))
	if err := f.DomainUndefineFlags(old, 0); err != nil {
		t.Fatal(err)
	}
	mustDefine(t, f, domXML("vm1", ""))
	_, _, err := f.DomainGetState(old, 0)
	wantCode(t, err, libvirt.ErrNoDomain, "")
}

func TestDefineRejectsBadXML(t *testing.T) {
	f := New()
	for _, tc := range []struct {
		doc  string
		code libvirt.ErrorNumber
	}{
		{"<domain type='kvm'><name>x</name>", libvirt.ErrXMLDetail},
		{"<volume><name>x</name></volume>", libvirt.ErrXMLError},
		{"<domain><name>x</name></domain>", libvirt.ErrXMLError},
		{"<domain type='kvm'></domain>", libvirt.ErrNoName},
		{"<domain type='kvm'><name>x</name><uuid>zz</uuid></domain>", libvirt.ErrInternalError},
	} {
		_, err := f.DomainDefineXMLFlags(tc.doc, 0)
		if libvirtCode(err) != tc.code {
			t.Errorf("%s: got %v, want code %s", tc.doc, err, tc.code)
		}
	}
}

func TestUndefineUEFIDomainNeedsNVRAMFlag(t *testing.T) {
	f := New()
	d := mustDefine(t, f, domXML("vm1", `<os firmware="efi"><type>hvm</type></os>`))
	// Never started: no NVRAM file yet, so a plain undefine would work; start it.
	if err := f.DomainCreate(d); err != nil {
		t.Fatal(err)
	}
	if err := f.DomainDestroyFlags(d, 0); err != nil {
		t.Fatal(err)
	}
	wantCode(t, f.DomainUndefineFlags(d, 0), libvirt.ErrOperationInvalid,
		"Requested operation is not valid: cannot undefine domain with nvram")
	if _, ok := f.Domain("vm1"); !ok {
		t.Fatal("failed undefine removed the domain")
	}
	if err := f.DomainUndefineFlags(d, libvirt.DomainUndefineNvram); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Domain("vm1"); ok {
		t.Fatal("domain still defined")
	}
}

func TestUndefineRunningDomainLeavesItTransient(t *testing.T) {
	f := New()
	d := mustDefine(t, f, domXML("vm1", ""))
	_ = f.DomainCreate(d)
	if err := f.DomainUndefineFlags(d, 0); err != nil {
		t.Fatal(err)
	}
	info, ok := f.Domain("vm1")
	if !ok || info.Persistent || info.State != libvirt.DomainRunning {
		t.Fatalf("after undefine of a running domain: %+v, %v", info, ok)
	}
	wantCode(t, f.DomainUndefineFlags(d, 0), libvirt.ErrOperationInvalid, "")
	_ = f.DomainDestroyFlags(d, 0)
	if _, ok := f.Domain("vm1"); ok {
		t.Fatal("a stopped transient domain is still there")
	}
}

func TestStateAfterCreate(t *testing.T) {
	for _, st := range []libvirt.DomainState{libvirt.DomainShutoff, libvirt.DomainCrashed, libvirt.DomainPaused} {
		f := New()
		d := mustDefine(t, f, domXML("vm1", ""))
		f.SetStateAfterCreate("vm1", st)
		if err := f.DomainCreate(d); err != nil {
			t.Fatal(err)
		}
		got, _, _ := f.DomainGetState(d, 0)
		if libvirt.DomainState(got) != st {
			t.Errorf("state after create %d, want %d", got, st)
		}
		// One-shot: the next start runs.
		_ = f.SetDomainState("vm1", libvirt.DomainShutoff)
		_ = f.DomainCreate(d)
		if got, _, _ := f.DomainGetState(d, 0); libvirt.DomainState(got) != libvirt.DomainRunning {
			t.Errorf("second start: state %d", got)
		}
	}
}

func TestListAllDomainsFilters(t *testing.T) {
	f := New()
	a := mustDefine(t, f, domXML("a", ""))
	mustDefine(t, f, domXML("b", ""))
	c := mustDefine(t, f, domXML("c", ""))
	_ = f.DomainCreate(a)
	_ = f.DomainCreate(c)
	_ = f.SetDomainState("c", libvirt.DomainPaused)
	names := func(flags libvirt.ConnectListAllDomainsFlags) string {
		doms, n, err := f.ConnectListAllDomains(1, flags)
		if err != nil || int(n) != len(doms) {
			t.Fatalf("list: %v, n=%d len=%d", err, n, len(doms))
		}
		s := ""
		for _, d := range doms {
			s += d.Name
		}
		return s
	}
	for flags, want := range map[libvirt.ConnectListAllDomainsFlags]string{
		0:                                   "abc",
		libvirt.ConnectListDomainsActive:    "ac",
		libvirt.ConnectListDomainsInactive:  "b",
		libvirt.ConnectListDomainsRunning:   "a",
		libvirt.ConnectListDomainsPaused:    "c",
		libvirt.ConnectListDomainsTransient: "",
		libvirt.ConnectListDomainsActive | libvirt.ConnectListDomainsInactive: "abc",
	} {
		if got := names(flags); got != want {
			t.Errorf("flags %d: %q, want %q", flags, got, want)
		}
	}
	if doms, n, _ := f.ConnectListAllDomains(0, 0); doms != nil || n != 3 {
		t.Errorf("needResults 0: %v, %d", doms, n)
	}
}

func TestInterfaceAddressSources(t *testing.T) {
	f := New()
	d := mustDefine(t, f, domXML("vm1", ""))
	_, err := f.DomainInterfaceAddresses(d, uint32(libvirt.DomainInterfaceAddressesSrcArp), 0)
	wantCode(t, err, libvirt.ErrOperationInvalid, "")
	_ = f.DomainCreate(d)
	_, err = f.DomainInterfaceAddresses(d, uint32(libvirt.DomainInterfaceAddressesSrcAgent), 0)
	wantCode(t, err, libvirt.ErrAgentUnresponsive, "Guest agent is not responding: QEMU guest agent is not connected")
	if got, err := f.DomainInterfaceAddresses(d, uint32(libvirt.DomainInterfaceAddressesSrcLease), 0); err != nil || len(got) != 0 {
		t.Fatalf("lease by default: %v, %v", got, err)
	}
	eth := Interface("eth0", "52:54:00:aa:bb:cc", "192.168.1.73/24", "fe80::1/64")
	_ = f.SetInterfaceAddresses("vm1", libvirt.DomainInterfaceAddressesSrcAgent, []libvirt.DomainInterface{eth}, nil)
	arpErr := Errorf(libvirt.ErrInternalError, "arp table unreadable")
	_ = f.SetInterfaceAddresses("vm1", libvirt.DomainInterfaceAddressesSrcArp, nil, arpErr)
	got, err := f.DomainInterfaceAddresses(d, uint32(libvirt.DomainInterfaceAddressesSrcAgent), 0)
	if err != nil || len(got) != 1 || got[0].Addrs[0].Addr != "192.168.1.73" || got[0].Addrs[0].Prefix != 24 ||
		got[0].Addrs[1].Type != int32(libvirt.IPAddrTypeIpv6) || got[0].Hwaddr[0] != "52:54:00:aa:bb:cc" {
		t.Fatalf("agent: %+v, %v", got, err)
	}
	if _, err := f.DomainInterfaceAddresses(d, uint32(libvirt.DomainInterfaceAddressesSrcArp), 0); err != arpErr {
		t.Fatalf("arp: %v", err)
	}
}

// TestDomainReset: a reset keeps an active domain in place (id, addresses) and counts;
// a crashed one runs again, a paused one stays paused; an inactive one is refused.
func TestDomainReset(t *testing.T) {
	f := New()
	d := mustDefine(t, f, domXML("vm1", ""))
	wantCode(t, f.DomainReset(d, 0), libvirt.ErrOperationInvalid, "Requested operation is not valid: domain is not running")
	if err := f.DomainCreate(d); err != nil {
		t.Fatal(err)
	}
	d, _ = f.DomainLookupByName("vm1")
	iface := Interface("vnet0", "52:54:00:00:00:01", "10.0.0.5/24")
	if err := f.SetInterfaceAddresses("vm1", libvirt.DomainInterfaceAddressesSrcArp, []libvirt.DomainInterface{iface}, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.DomainReset(d, 0); err != nil {
		t.Fatal(err)
	}
	got, _ := f.Domain("vm1")
	if got.ID != d.ID || got.State != libvirt.DomainRunning || got.Resets != 1 || got.Starts != 1 {
		t.Fatalf("after a reset: %+v, want running with id %d, one reset, one start", got, d.ID)
	}
	if ifaces, err := f.DomainInterfaceAddresses(d, uint32(libvirt.DomainInterfaceAddressesSrcArp), 0); err != nil ||
		len(ifaces) != 1 || ifaces[0].Addrs[0].Addr != "10.0.0.5" {
		t.Fatalf("addresses after a reset: %+v, %v", ifaces, err)
	}
	wantCode(t, f.DomainReset(d, 1), libvirt.ErrInvalidArg, "invalid argument: unsupported flags (0x1) in function qemuDomainReset")

	for _, c := range []struct {
		from, want libvirt.DomainState
	}{{libvirt.DomainCrashed, libvirt.DomainRunning}, {libvirt.DomainPaused, libvirt.DomainPaused}} {
		if err := f.SetDomainState("vm1", c.from); err != nil {
			t.Fatal(err)
		}
		if err := f.DomainReset(d, 0); err != nil {
			t.Fatalf("reset of a %v domain: %v", c.from, err)
		}
		if got, _ := f.Domain("vm1"); got.State != c.want || got.ID != d.ID {
			t.Fatalf("reset of a %v domain left it %v (id %d), want %v in place", c.from, got.State, got.ID, c.want)
		}
	}
	if got, _ := f.Domain("vm1"); got.Resets != 3 {
		t.Fatalf("resets counted %d, want 3", got.Resets)
	}
}
