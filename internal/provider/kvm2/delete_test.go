package kvm2

import (
	"errors"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
)

func volumes(f *libvirtfake.Fake) string {
	p, _ := f.Pool(libvirtfake.DefaultPool)
	return strings.Join(p.Volumes, " ")
}

func TestDeleteRemovesDomainNVRAMAndVolumes(t *testing.T) {
	env := newTestEnv(t)
	f := env.fake
	inst := createOne(t, env, "proxy-d1d1d1d1d1d1d1d1")
	if d, _ := f.Domain(inst.Name); !d.NVRAM {
		t.Fatal("a started UEFI domain should have NVRAM (the fake refuses undefine without the flag)")
	}
	if err := env.p.Delete(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Domain(inst.Name); ok {
		t.Fatal("domain still defined")
	}
	// The cached base and its marker stay.
	if got := volumes(f); got != "base-debian-13.qcow2 base-debian-13.qcow2.sha256" {
		t.Fatalf("volumes after delete: %s", got)
	}
	if len(env.logs.find(`"kvm2 domain deleted"`, inst.Name)) != 1 {
		t.Fatal("no kvm2 domain deleted line")
	}
	// Twice is fine.
	if err := env.p.Delete(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
}

func TestDeleteShutOffDomain(t *testing.T) {
	env := newTestEnv(t)
	inst := createOne(t, env, "proxy-d2d2d2d2d2d2d2d2")
	must(0, env.fake.SetDomainState(inst.Name, libvirt.DomainShutoff))
	if err := env.p.Delete(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	if _, ok := env.fake.Domain(inst.Name); ok {
		t.Fatal("domain still defined")
	}
}

// TestDeleteRemovesVolumesWithoutDomain: volumes of the name with no domain (what an
// earlier release's Create cut off before its definition left) are removed, under a
// claim of the name that goes with them; a Create cut off before its definition now
// leaves its claim, which Delete removes with the volumes.
func TestDeleteRemovesVolumesWithoutDomain(t *testing.T) {
	t.Run("no domain", func(t *testing.T) {
		env := newTestEnv(t)
		f := env.fake
		name := "proxy-d3d3d3d3d3d3d3d3"
		putLeftOvers(t, f, name)
		f.ResetCalls()
		if err := env.p.Delete(t.Context(), ident.ProviderID(fakeHost, name)); err != nil {
			t.Fatal(err)
		}
		if got := volumes(f); strings.Contains(got, name) {
			t.Fatalf("volumes after delete: %s", got)
		}
		if _, ok := f.Domain(name); ok {
			t.Fatal("the claim outlived the delete")
		}
		if f.Calls("DomainDefineXMLFlags") != 1 || f.Calls("DomainUndefineFlags") != 1 {
			t.Fatalf("%d defines and %d undefines, want the claim's one each",
				f.Calls("DomainDefineXMLFlags"), f.Calls("DomainUndefineFlags"))
		}
		if len(env.logs.find(`"kvm2 delete removes volumes left without a domain"`)) != 1 {
			t.Fatal("no line for the left-over volumes")
		}
	})
	t.Run("nothing left", func(t *testing.T) {
		env := newTestEnv(t)
		f := env.fake
		if err := env.p.Delete(t.Context(), ident.ProviderID(fakeHost, "proxy-d3d3d3d3d3d3d3d4")); err != nil {
			t.Fatal(err)
		}
		if n := f.Calls("DomainDefineXMLFlags"); n != 0 {
			t.Fatalf("%d defines with nothing to remove, want none", n)
		}
	})
	t.Run("a create cut off before its definition", func(t *testing.T) {
		env := newTestEnv(t)
		f := env.fake
		f.FailNext("DomainDefineXMLFlags", nil)
		f.FailNext("DomainDefineXMLFlags", libvirtfake.Errorf(libvirt.ErrInternalError, "cut off"))
		req := testRequest("proxy-d3d3d3d3d3d3d3d5")
		if _, err := env.p.Create(t.Context(), req); err == nil {
			t.Fatal("create should have failed")
		}
		if got := volumes(f); !strings.Contains(got, overlayVolName(req.Name)) || !strings.Contains(got, seedVolName(req.Name)) {
			t.Fatalf("volumes after the cut-off create: %s", got)
		}
		if _, ok := f.Domain(req.Name); !ok {
			t.Fatal("the cut-off create left no claim")
		}
		if err := env.p.Delete(t.Context(), ident.ProviderID(fakeHost, req.Name)); err != nil {
			t.Fatal(err)
		}
		if got := volumes(f); strings.Contains(got, req.Name) {
			t.Fatalf("volumes after delete: %s", got)
		}
		if _, ok := f.Domain(req.Name); ok {
			t.Fatal("the claim outlived the delete")
		}
	})
}

func TestDeleteLeavesUnmarkedDomainAlone(t *testing.T) {
	env := newTestEnv(t)
	f := env.fake
	defineForeign(t, f, "proxy-d4d4d4d4d4d4d4d4", markFor(t, MetadataURI("kvm"), "uid-kvm"), true)
	must(0, f.PutVolume(libvirtfake.DefaultPool, libvirtfake.VolumeInfo{Name: "proxy-d4d4d4d4d4d4d4d4.qcow2", Content: []byte("x")}))
	if err := env.p.Delete(t.Context(), "hosts/h1/domains/proxy-d4d4d4d4d4d4d4d4"); err != nil {
		t.Fatal(err)
	}
	if d, ok := f.Domain("proxy-d4d4d4d4d4d4d4d4"); !ok || d.State != libvirt.DomainRunning {
		t.Fatalf("the kvm provider's domain was touched: %+v", d)
	}
	if !strings.Contains(volumes(f), "proxy-d4d4d4d4d4d4d4d4.qcow2") {
		t.Fatal("the kvm provider's overlay was deleted")
	}
}

// A providerID on a host the config no longer lists cannot be deleted: Delete says so
// with a permanent error wrapping ErrLeftBehind (the Proxy may go, the VM may stay) that
// names the host and gives the commands to clean up by hand, without dialling anything.
func TestDeleteOfUnconfiguredHostIsLeftBehind(t *testing.T) {
	env := newTestEnv(t)
	err := env.p.Delete(t.Context(), "hosts/retired/domains/proxy-d5d5d5d5d5d5d5d5")
	wantClass(t, err, provider.ErrPermanent, provider.ErrLeftBehind)
	want := "instance left behind: domain proxy-d5d5d5d5d5d5d5d5 is on host retired, which is not in kvm2.hosts, " +
		"so it and its volumes may still be there; remove them on that host with " +
		"virsh -c qemu:///system undefine --nvram proxy-d5d5d5d5d5d5d5d5, " +
		"virsh -c qemu:///system vol-delete --pool <pool> proxy-d5d5d5d5d5d5d5d5.qcow2 and " +
		"virsh -c qemu:///system vol-delete --pool <pool> proxy-d5d5d5d5d5d5d5d5-seed.iso"
	if err.Error() != want {
		t.Fatalf("got %q\nwant %q", err, want)
	}
	if n := env.totalDials(); n != 0 {
		t.Fatalf("%d dials", n)
	}
	if len(env.logs.find(`"level":0`, "kvm2 delete skipped", `"host":"retired"`, `"name":"proxy-d5d5d5d5d5d5d5d5"`)) != 1 {
		t.Fatalf("no log line for the skipped delete:\n%s", strings.Join(env.logs.all(), "\n"))
	}
	err = env.p.Delete(t.Context(), "hosts/retired/proxy-d5d5d5d5d5d5d5d5")
	if errors.Is(err, provider.ErrLeftBehind) || provider.Class(err) != provider.ErrPermanent || !strings.Contains(err.Error(), "malformed providerID") {
		t.Fatalf("malformed: %v", err)
	}
}

func TestDeleteErrors(t *testing.T) {
	for _, c := range []struct {
		method string
		err    error
		class  error // nil: success
	}{
		{"DomainDestroyFlags", libvirtfake.Errorf(libvirt.ErrNoDomain, "gone"), nil},
		{"DomainUndefineFlags", libvirtfake.Errorf(libvirt.ErrNoDomain, "gone"), nil},
		{"StorageVolDelete", libvirtfake.Errorf(libvirt.ErrNoStorageVol, "gone"), nil},
		{"DomainUndefineFlags", libvirtfake.Errorf(libvirt.ErrInternalError, "boom"), provider.ErrTransient},
		{"StoragePoolLookupByName", libvirtfake.Errorf(libvirt.ErrNoStoragePool, "no pool"), provider.ErrPermanent},
		{"DomainDestroyFlags", libvirtfake.Errorf(libvirt.ErrAccessDenied, "no"), provider.ErrPermanent},
		// NotFound is never returned from Delete.
		{"StoragePoolLookupByName", libvirtfake.Errorf(libvirt.ErrNoStorageVol, "odd"), provider.ErrTransient},
	} {
		t.Run(c.method+"-"+c.err.Error(), func(t *testing.T) {
			env := newTestEnv(t)
			inst := createOne(t, env, "proxy-d6d6d6d6d6d6d6d6")
			env.fake.FailNext(c.method, c.err)
			err := env.p.Delete(t.Context(), inst.ProviderID)
			if c.class == nil {
				if err != nil {
					t.Fatalf("got %v, want success", err)
				}
				return
			}
			if provider.Class(err) != c.class {
				t.Fatalf("got %v (class %s), want %s", err, provider.ClassName(err), provider.ClassName(c.class))
			}
		})
	}
}
