package kvm2test

import (
	"context"
	"slices"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2"
)

// TestHostRunsAVM: the provider New builds creates a VM over SSH into the fake from the
// cached base image, reports it Running at the first address of Addresses and at the
// next one for the second VM, and deletes each with its disks, leaving the cached image.
func TestHostRunsAVM(t *testing.T) {
	h := New(t, "kvm2-home", kvm2.WithInstallID("install-kvm2test"))
	if h.Config.Name != "kvm2-home" || h.Config.Type != provider.TypeKVM2 || h.Provider.InstallID() != "install-kvm2test" {
		t.Fatalf("entry %s of type %s, install %q; want kvm2-home of type kvm2, install-kvm2test",
			h.Config.Name, h.Config.Type, h.Provider.InstallID())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ids []string
	for i, want := range []string{"192.168.122.10", "192.168.122.11"} {
		name := []string{"proxy-0000000000000001", "proxy-0000000000000002"}[i]
		inst, err := h.Provider.Create(ctx, provider.CreateRequest{
			Name: name, UID: "uid-" + name, Port: 3128, CloudInit: []byte("#cloud-config\n"),
			Placement: provider.Placement{Zone: h.Host, MachineType: MachineType, Image: Image},
		})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		got, err := h.Provider.Get(ctx, inst.ProviderID)
		if err != nil || got.State != provider.StateRunning || got.IP != want {
			t.Fatalf("get %s: %+v, %v; want Running at %s", inst.ProviderID, got, err, want)
		}
		ids = append(ids, inst.ProviderID)
	}
	if d, v := h.Domains(), h.Volumes(); len(d) != 2 || len(v) == 0 {
		t.Fatalf("domains %v, volumes %v after two creates; want two domains with their disks", d, v)
	}
	for _, id := range ids {
		if err := h.Provider.Delete(ctx, id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
	}
	if d, v := h.Domains(), h.Volumes(); len(d) != 0 || len(v) != 0 {
		t.Fatalf("domains %v, volumes %v left after the deletes; want none", d, v)
	}
	if pool, _ := h.Fake.Pool("default"); !slices.Contains(pool.Volumes, "base-debian-13.qcow2") {
		t.Fatalf("pool holds %v; want the cached base image kept", pool.Volumes)
	}
}
