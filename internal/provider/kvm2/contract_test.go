package kvm2

import (
	"context"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// TestContract runs the suite every provider passes, against kvm2 over in-memory libvirt.
func TestContract(t *testing.T) {
	providertest.RunContract(t, func(t *testing.T) providertest.ContractEnv {
		env := newTestEnv(t)
		return env.contract()
	})
}

// contract is the contract suite's view of the env: its provider, a request for the
// catalogue's debian-13 on machine type small, and the first host as the one target.
func (e *testEnv) contract() providertest.ContractEnv {
	return providertest.ContractEnv{
		Provider: e.p,
		Request: provider.CreateRequest{
			Placement: provider.Placement{MachineType: "small", Image: "debian-13"},
			CloudInit: []byte(testUserData), Port: 3128,
		},
		MissingID:   ident.ProviderID(e.host, "proxy-0000000000000000"),
		MalformedID: "domains/proxy-0000000000000000",
		Targets:     []string{e.host},
		Timeout:     30 * time.Second,

		Restarts: func(id string) int {
			_, vm, err := ident.ParseProviderID(id)
			if err != nil {
				return -1
			}
			d, ok := e.fakes[e.host].Domain(vm)
			if !ok {
				return -1
			}
			return d.Starts + d.Resets
		},
		Stop: func(t *testing.T, id string) {
			_, vm, _ := ident.ParseProviderID(id)
			if err := e.fake.SetDomainState(vm, libvirt.DomainShutoff); err != nil {
				t.Fatal(err)
			}
		},
		ForeignInstance: e.foreignInstance,
	}
}

// foreignInstance creates a running domain on the first host through a provider of the
// same type and host as another install (install-other) would, and returns its
// providerID and the check that it is still running, not restarted, with its mark.
func (e *testEnv) foreignInstance(t *testing.T, ctx context.Context) (string, func(t *testing.T)) {
	other := e.beside(t, e.p.typ, "other-install", WithInstallID("install-other"))
	req := testRequest("proxy-0f0f0f0f0f0f0f0f")
	inst, err := providertest.CreateSettled(ctx, other, req, 0)
	if err != nil {
		t.Fatalf("create as another install: %v", err)
	}
	before, _ := e.fake.Domain(req.Name)
	return inst.ProviderID, func(t *testing.T) {
		t.Helper()
		after, ok := e.fake.Domain(req.Name)
		if !ok || after.State != libvirt.DomainRunning || after.ID != before.ID || after.Starts != before.Starts ||
			after.Resets != before.Resets || after.Metadata[e.p.metaNS] != before.Metadata[e.p.metaNS] {
			t.Fatalf("another install's domain %s is %+v (there: %v), want it as it was: %+v", req.Name, after, ok, before)
		}
	}
}
