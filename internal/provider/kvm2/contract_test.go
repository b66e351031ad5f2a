package kvm2

import (
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// TestContract runs the suite every provider passes, against kvm2 over in-memory libvirt.
func TestContract(t *testing.T) {
	providertest.RunContract(t, func(t *testing.T) providertest.ContractEnv {
		env := newProviderEnv(t)
		return providertest.ContractEnv{
			Provider: env.p,
			Request: provider.CreateRequest{
				Placement: provider.Placement{MachineType: "small", Image: "debian-13"},
				CloudInit: []byte(testUserData), Port: 3128,
			},
			MissingID:   providerID(fakeHost, "proxy-0000000000000000"),
			MalformedID: "domains/proxy-0000000000000000",
			Targets:     []string{fakeHost},
			Timeout:     30 * time.Second,
		}
	})
}
