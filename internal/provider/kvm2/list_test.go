package kvm2

import (
	"sort"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
)

func TestListByTagAcrossHosts(t *testing.T) {
	env := newTestEnv(t, withHosts("h1", "h2"))
	req := testRequest("proxy-l1l1l1l1l1l1l1l1")
	req.Placement.Zone = "h1"
	a, err := env.p.Create(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	req = testRequest("proxy-l2l2l2l2l2l2l2l2")
	req.Placement.Zone = "h2"
	b, err := env.p.Create(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	must(0, env.fakes["h2"].SetDomainState(b.Name, libvirt.DomainShutoff))
	// Not ours: no mark, the kvm provider's mark, a mark that does not parse.
	defineForeign(t, env.fakes["h1"], "admin-vm", "", true)
	defineForeign(t, env.fakes["h1"], "proxy-kvmkvmkvmkvmkvm", markFor(t, MetadataURI("kvm"), "uid-kvm"), false)
	defineForeign(t, env.fakes["h2"], "proxy-corrupt", `<instance xmlns="`+metadataURI+`">nonsense</instance>`, false)

	env.logs.reset() // the second Create looked at h1 for domains of its UID
	list, err := env.p.ListByTag(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
	want := []provider.Instance{{ProviderID: a.ProviderID, Name: a.Name, UID: a.UID, State: provider.StateRunning, CreatedAt: a.CreatedAt},
		{ProviderID: b.ProviderID, Name: b.Name, UID: b.UID, State: provider.StateStopped, CreatedAt: b.CreatedAt}}
	if diff := cmp.Diff(want, list, cmpopts.IgnoreFields(provider.Instance{}, "IP")); diff != "" {
		t.Fatalf("listed other than exactly the two created (-want +got):\n%s", diff)
	}
	for _, name := range []string{"admin-vm", "proxy-kvmkvmkvmkvmkvm", "proxy-corrupt"} {
		if len(env.logs.find(`"kvm2 list skips domain"`, `"name":"`+name+`"`)) != 1 {
			t.Errorf("no skip line for %s", name)
		}
	}
	if len(env.logs.find(`"kvm2 domains listed"`, `"hosts":2`, `"managed":2`)) != 1 {
		t.Error("no kvm2 domains listed line with hosts and managed counts")
	}
	if len(env.logs.find(`"kvm2 listed instance"`, `"level":2`)) != 2 {
		t.Error("want a kvm2 listed instance line per instance at V(2)")
	}
}

func TestListByTagFailsWholeWhenAHostFails(t *testing.T) {
	env := newTestEnv(t, withHosts("h1", "h2"))
	req := testRequest("proxy-l3l3l3l3l3l3l3l3")
	req.Placement.Zone = "h1"
	if _, err := env.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	env.fakes["h2"].FailNext("ConnectListAllDomains", libvirtfake.Errorf(libvirt.ErrInternalError, "boom"))
	list, err := env.p.ListByTag(t.Context())
	if provider.Class(err) != provider.ErrTransient || list != nil || !strings.Contains(err.Error(), "listing domains on host h2") {
		t.Fatalf("got %v, %v; want a transient error naming h2 and no partial list", list, err)
	}
	// A domain that goes away while being listed is skipped, not an error.
	env.fakes["h1"].FailNext("DomainGetMetadata", libvirtfake.Errorf(libvirt.ErrNoDomain, "gone"))
	list, err = env.p.ListByTag(t.Context())
	if err != nil || len(list) != 0 {
		t.Fatalf("vanished domain: %v %v", list, err)
	}
}
