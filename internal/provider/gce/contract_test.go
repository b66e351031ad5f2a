package gce

import (
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// TestContract runs the suite every provider passes, against gce over the in-process
// Compute API, operations taking two polls each.
func TestContract(t *testing.T) {
	providertest.RunContract(t, func(t *testing.T) providertest.ContractEnv {
		e := newEnv(t)
		return providertest.ContractEnv{
			Provider: e.p,
			Request: provider.CreateRequest{
				Placement: provider.Placement{Zone: testZone, MachineType: "small", Image: "ubuntu-2404"},
				CloudInit: []byte(testUserData), Port: 3128,
			},
			MissingID:   ident.ProviderID(testProject, testZone, "proxy-0000000000000000"),
			MalformedID: "gce://" + testProject + "/proxy-0000000000000000",
			Targets:     []string{testZone, testZone2},
			Timeout:     30 * time.Second,
		}
	})
}

// TestContractPoolChildren runs the suite for the children of one pool with managed
// firewall rules: they share one rule, which goes with the last of them.
func TestContractPoolChildren(t *testing.T) {
	providertest.RunContract(t, func(t *testing.T) providertest.ContractEnv {
		e := newEnv(t, withFirewall)
		t.Cleanup(func() {
			if n := e.fake.Firewalls(); n > 1 {
				t.Errorf("%d firewall rules for the children of one pool, want at most one", n)
			}
		})
		return providertest.ContractEnv{
			Provider: e.p,
			Request: provider.CreateRequest{
				Placement: provider.Placement{Zone: testZone, MachineType: "small", Image: "ubuntu-2404"},
				CloudInit: []byte(testUserData), Port: 3128, Pool: testPool,
			},
			MissingID:   ident.ProviderID(testProject, testZone, "proxy-0000000000000000"),
			MalformedID: "gce://" + testProject + "/proxy-0000000000000000",
			Targets:     []string{testZone, testZone2},
			Timeout:     30 * time.Second,
		}
	})
}
