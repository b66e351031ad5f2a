package kvm2

import (
	"testing"
	"time"

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
	}
}
