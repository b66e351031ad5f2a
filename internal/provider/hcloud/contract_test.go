package hcloud

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud/hcloudfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// TestContract runs the suite every provider passes, against hcloud over the in-process
// Hetzner Cloud API through the official client, actions taking two polls each.
func TestContract(t *testing.T) {
	providertest.RunContract(t, func(t *testing.T) providertest.ContractEnv {
		return newEnv(t).contractEnv()
	})
}

// TestContractWithFirewall runs the suite with a firewall per Proxy; when a case ends,
// no firewall is left without its server.
func TestContractWithFirewall(t *testing.T) {
	providertest.RunContract(t, func(t *testing.T) providertest.ContractEnv {
		e := newEnv(t, withFirewall)
		t.Cleanup(func() {
			for _, fw := range e.fake.Firewalls() {
				if _, ok := e.fake.ServerByName(fw.Name); !ok {
					t.Errorf("firewall %s is left without its server", fw.Name)
				}
			}
		})
		return e.contractEnv()
	})
}

// contractEnv is the suite's view of e, with what the Reboot cases need: the fake's
// count of resets and power-ons of a server, a stop behind the provider's back, and a
// server of another install.
func (e *env) contractEnv() providertest.ContractEnv {
	return providertest.ContractEnv{
		Provider: e.p,
		Request: provider.CreateRequest{
			Placement: provider.Placement{Zone: testLocation, MachineType: "cx23", Image: "ubuntu-24.04"},
			CloudInit: []byte(testUserData), Port: 3128,
		},
		MissingID:   ProviderID("proxy-0000000000000000"),
		MalformedID: "hcloud:/proxy-0000000000000000",
		Targets:     []string{testLocation, "nbg1"},
		Timeout:     30 * time.Second,
		Restarts: func(id string) int {
			name, err := parseProviderID(id)
			if err != nil {
				return -1
			}
			return e.restarts(e.serverID(name))
		},
		Stop: func(t *testing.T, id string) {
			name, _ := parseProviderID(id)
			if !e.fake.SetServerStatus(e.serverID(name), "off") {
				t.Fatalf("no server %s to stop", id)
			}
		},
		ForeignInstance: func(t *testing.T, _ context.Context) (string, func(*testing.T)) {
			const name = "proxy-0f0f0f0f0f0f0f0f"
			if _, err := e.fake.SeedServer(name, "cx23", "ubuntu-24.04", testLocation,
				map[string]string{LabelProvider: testName, LabelInstall: "install-other", LabelUID: "uid-theirs"}); err != nil {
				t.Fatal(err)
			}
			before, _ := e.fake.ServerByName(name)
			return ProviderID(name), func(t *testing.T) {
				t.Helper()
				after, _ := e.fake.ServerByName(name)
				if !reflect.DeepEqual(after, before) || e.restarts(before.ID) != 0 {
					t.Fatalf("another install's server is %+v after a refused reboot, want it untouched: %+v", after, before)
				}
			}
		},
	}
}

// restarts counts the reset and poweron calls the fake answered for server id.
func (e *env) restarts(id int64) int {
	n := 0
	for _, c := range e.fake.Calls() {
		if (c.Route == hcloudfake.ServersReset || c.Route == hcloudfake.ServersPoweron) && c.Status < 300 &&
			strings.HasPrefix(c.Path, fmt.Sprintf("/v1/servers/%d/", id)) {
			n++
		}
	}
	return n
}
