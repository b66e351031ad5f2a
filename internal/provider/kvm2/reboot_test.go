package kvm2

import (
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
)

// rebootCase is a domain made by the provider, put into a state on the host, then
// rebooted: the class of the answer, the RPCs that changed something, and where the
// domain ends.
func TestRebootByState(t *testing.T) {
	cases := []struct {
		name string
		// set puts the domain into its state on the host (nil: left running).
		set        func(t *testing.T, f *libvirtfake.Fake, vm string)
		class      error // nil for success
		message    string
		wantCalls  map[string]int // the calls that change a domain
		wantState  libvirt.DomainState
		sameID     bool // the domain keeps its id (reset in place)
		wantReason string
	}{
		{name: "running is reset in place", wantCalls: map[string]int{"DomainReset": 1},
			wantState: libvirt.DomainRunning, sameID: true, wantReason: `"how":"reset"`},
		{name: "shut off is started",
			set:       func(t *testing.T, f *libvirtfake.Fake, vm string) { setState(t, f, vm, libvirt.DomainShutoff) },
			wantCalls: map[string]int{"DomainCreate": 1}, wantState: libvirt.DomainRunning, wantReason: `"how":"started"`},
		{name: "crashed is destroyed and started",
			set:       func(t *testing.T, f *libvirtfake.Fake, vm string) { setState(t, f, vm, libvirt.DomainCrashed) },
			wantCalls: map[string]int{"DomainDestroyFlags": 1, "DomainCreate": 1}, wantState: libvirt.DomainRunning,
			wantReason: `"how":"destroyed and started"`},
		{name: "shutting down is destroyed and started",
			set:       func(t *testing.T, f *libvirtfake.Fake, vm string) { setState(t, f, vm, libvirt.DomainShutdown) },
			wantCalls: map[string]int{"DomainDestroyFlags": 1, "DomainCreate": 1}, wantState: libvirt.DomainRunning,
			wantReason: `"how":"destroyed and started"`},
		{name: "a hypervisor that cannot reset destroys and starts",
			set: func(t *testing.T, f *libvirtfake.Fake, vm string) {
				f.FailNext("DomainReset", libvirtfake.Errorf(libvirt.ErrNoSupport, "this function is not supported by the connection driver: virDomainReset"))
			},
			wantCalls: map[string]int{"DomainReset": 1, "DomainDestroyFlags": 1, "DomainCreate": 1}, wantState: libvirt.DomainRunning,
			wantReason: `"how":"destroyed and started"`},
		{name: "paused by someone is left alone",
			set:   func(t *testing.T, f *libvirtfake.Fake, vm string) { setState(t, f, vm, libvirt.DomainPaused) },
			class: provider.ErrPermanent, message: "is DomainPaused and is not rebooted by the operator; resume or destroy it on the host",
			wantCalls: map[string]int{}, wantState: libvirt.DomainPaused, sameID: true},
		{name: "pmsuspended is left alone",
			set:   func(t *testing.T, f *libvirtfake.Fake, vm string) { setState(t, f, vm, libvirt.DomainPmsuspended) },
			class: provider.ErrPermanent, message: "is DomainPmsuspended and is not rebooted by the operator",
			wantCalls: map[string]int{}, wantState: libvirt.DomainPmsuspended, sameID: true},
		{name: "paused while libvirt starts it is transient",
			set: func(t *testing.T, f *libvirtfake.Fake, vm string) {
				if err := f.SetDomainStateReason(vm, libvirt.DomainPaused, int32(libvirt.DomainPausedStartingUp)); err != nil {
					t.Fatal(err)
				}
			},
			class: provider.ErrTransient, message: "is starting up; waiting for it to settle",
			wantCalls: map[string]int{}, wantState: libvirt.DomainPaused, sameID: true},
		{name: "a failed reset is transient",
			set: func(t *testing.T, f *libvirtfake.Fake, vm string) {
				f.FailNext("DomainReset", libvirtfake.Errorf(libvirt.ErrInternalError, "qemu monitor went away"))
			},
			class: provider.ErrTransient, message: "resetting domain proxy-r1r1r1r1r1r1r1r1 on host " + fakeHost + ": internal error: qemu monitor went away",
			wantCalls: map[string]int{"DomainReset": 1}, wantState: libvirt.DomainRunning, sameID: true},
		{name: "a refused start of a shut-off domain is transient",
			set: func(t *testing.T, f *libvirtfake.Fake, vm string) {
				setState(t, f, vm, libvirt.DomainShutoff)
				f.FailNext("DomainCreate", libvirtfake.Errorf(libvirt.ErrOperationFailed, "qemu died at start"))
			},
			class: provider.ErrTransient, message: "starting domain proxy-r1r1r1r1r1r1r1r1 on host " + fakeHost,
			wantCalls: map[string]int{"DomainCreate": 1}, wantState: libvirt.DomainShutoff},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newTestEnv(t)
			req := testRequest("proxy-r1r1r1r1r1r1r1r1")
			inst, err := e.p.Create(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			if c.set != nil {
				c.set(t, e.fake, req.Name)
			}
			before, _ := e.fake.Domain(req.Name)
			e.fake.ResetCalls()
			e.logs.reset()

			err = e.p.Reboot(t.Context(), inst.ProviderID)
			if c.class == nil {
				if err != nil {
					t.Fatalf("reboot: %v", err)
				}
			} else {
				wantClass(t, err, c.class, nil)
				if !strings.Contains(err.Error(), c.message) {
					t.Fatalf("reboot error %q, want it to contain %q", err, c.message)
				}
			}
			changing := map[string]int{}
			for m, n := range e.fake.CallCounts() {
				if m == "DomainReset" || m == "DomainCreate" || m == "DomainDestroyFlags" || m == "DomainUndefineFlags" ||
					m == "DomainDefineXMLFlags" || strings.HasPrefix(m, "StorageVol") && m != "StorageVolLookupByName" {
					changing[m] = n
				}
			}
			if diff := cmp.Diff(c.wantCalls, changing); diff != "" {
				t.Errorf("calls that change the host (-want +got):\n%s", diff)
			}
			after, ok := e.fake.Domain(req.Name)
			if !ok || after.State != c.wantState || after.UUID != before.UUID || after.XML != before.XML {
				t.Fatalf("after the reboot the domain is %+v (there: %v), want %v with its definition", after, ok, c.wantState)
			}
			if c.sameID && after.ID != before.ID {
				t.Errorf("the domain's id went from %d to %d, want it reset in place", before.ID, after.ID)
			}
			if c.wantReason != "" && len(e.logs.find(`"kvm2 domain rebooted"`, c.wantReason, `"name":"`+req.Name+`"`, `"host":"`+fakeHost+`"`)) != 1 {
				t.Errorf("no kvm2 domain rebooted line with %s in %q", c.wantReason, e.logs.all())
			}
		})
	}
}

func setState(t *testing.T, f *libvirtfake.Fake, vm string, s libvirt.DomainState) {
	t.Helper()
	if err := f.SetDomainState(vm, s); err != nil {
		t.Fatal(err)
	}
}

// TestRebootRPCs: a reboot of a running domain costs four RPCs (lookup, mark, state,
// reset), each a libvirt call line.
func TestRebootRPCs(t *testing.T) {
	e := newTestEnv(t)
	inst, err := e.p.Create(t.Context(), testRequest("proxy-r2r2r2r2r2r2r2r2"))
	if err != nil {
		t.Fatal(err)
	}
	e.fake.ResetCalls()
	e.logs.reset()
	if err := e.p.Reboot(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"DomainLookupByName": 1, "DomainGetMetadata": 1, "DomainGetState": 1, "DomainReset": 1}
	if diff := cmp.Diff(want, e.fake.CallCounts()); diff != "" {
		t.Errorf("RPCs of a reboot (-want +got):\n%s", diff)
	}
	if n := len(e.logs.find(`"libvirt call"`, `"rpc":"DomainReset"`, `"domain":"proxy-r2r2r2r2r2r2r2r2"`)); n != 1 {
		t.Errorf("%d libvirt call lines for DomainReset, want 1", n)
	}
}

// TestRebootRefusals: what is not this provider's and install's, or cannot be named, is
// never touched; a domain that is gone is ErrNotFound.
func TestRebootRefusals(t *testing.T) {
	e := newTestEnv(t, withProviderOptions(WithInstallID("install-a")))
	f := e.fake
	defineForeign(t, f, "proxy-nomarknomarknoma", "", true)
	defineForeign(t, f, "proxy-kvmkvmkvmkvmkvmk", markFor(t, MetadataURI(provider.TypeKVM), "uid-kvm"), true)
	other := e.beside(t, provider.TypeKVM2, "home", WithInstallID("install-b"))
	theirs, err := other.Create(t.Context(), testRequest("proxy-bbbbbbbbbbbbbbbb"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		id, vm  string
		class   error
		message string
	}{
		{ident.ProviderID(fakeHost, "proxy-nomarknomarknoma"), "proxy-nomarknomarknoma", provider.ErrPermanent,
			"domain proxy-nomarknomarknoma on host " + fakeHost + " carries no kvm2 mark; it was not created by this provider and is not rebooted"},
		{ident.ProviderID(fakeHost, "proxy-kvmkvmkvmkvmkvmk"), "proxy-kvmkvmkvmkvmkvmk", provider.ErrPermanent, "carries no kvm2 mark"},
		{theirs.ProviderID, theirs.Name, provider.ErrPermanent,
			"domain " + theirs.Name + " on host " + fakeHost + " belongs to install install-b, not to this one"},
		{ident.ProviderID(fakeHost, "proxy-0000000000000000"), "", provider.ErrNotFound,
			"domain proxy-0000000000000000 not found on host " + fakeHost},
		{ident.ProviderID("gone-host", "proxy-0000000000000000"), "", provider.ErrPermanent,
			`providerID "hosts/gone-host/domains/proxy-0000000000000000" names host "gone-host", which is not in kvm2.hosts`},
		{"hosts/" + fakeHost + "/domains/../x", "", provider.ErrPermanent, "malformed providerID"},
	}
	for _, c := range cases {
		var before libvirtfake.DomainInfo
		if c.vm != "" {
			before, _ = f.Domain(c.vm)
		}
		err := e.p.Reboot(t.Context(), c.id)
		wantClass(t, err, c.class, nil)
		if !strings.Contains(err.Error(), c.message) {
			t.Errorf("reboot of %s: %q, want it to contain %q", c.id, err, c.message)
		}
		if c.vm == "" {
			continue
		}
		after, _ := f.Domain(c.vm)
		if after.State != libvirt.DomainRunning || after.ID != before.ID || after.Resets != before.Resets || after.Starts != before.Starts {
			t.Errorf("domain %s after a refused reboot: %+v, want it untouched: %+v", c.vm, after, before)
		}
	}
	if n := f.Calls("DomainReset") + f.Calls("DomainDestroyFlags"); n != 0 {
		t.Errorf("%d reset or destroy calls for refused reboots, want none", n)
	}
}
