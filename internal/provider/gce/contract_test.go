package gce

import (
	"context"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// TestContract runs the suite every provider passes, against gce over the in-process
// Compute API, operations taking two polls each.
func TestContract(t *testing.T) {
	providertest.RunContract(t, func(t *testing.T) providertest.ContractEnv {
		e := newEnv(t)
		return e.withReboots(providertest.ContractEnv{
			Provider: e.p,
			Request: provider.CreateRequest{
				Placement: provider.Placement{Zone: testZone, MachineType: "small", Image: "ubuntu-2404"},
				CloudInit: []byte(testUserData), Port: 3128,
			},
			MissingID:   ident.ProviderID(testProject, testZone, "proxy-0000000000000000"),
			MalformedID: "gce://" + testProject + "/proxy-0000000000000000",
			Targets:     []string{testZone, testZone2},
			Timeout:     30 * time.Second,
		})
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
		return e.withReboots(providertest.ContractEnv{
			Provider: e.p,
			Request: provider.CreateRequest{
				Placement: provider.Placement{Zone: testZone, MachineType: "small", Image: "ubuntu-2404"},
				CloudInit: []byte(testUserData), Port: 3128, Pool: testPool,
			},
			MissingID:   ident.ProviderID(testProject, testZone, "proxy-0000000000000000"),
			MalformedID: "gce://" + testProject + "/proxy-0000000000000000",
			Targets:     []string{testZone, testZone2},
			Timeout:     30 * time.Second,
		})
	})
}

// withReboots adds what the suite's Reboot cases need: the fake's count of completed resets
// and starts, a stop behind the provider's back (TERMINATED, as a preemption or a stop in
// the console leaves it), and an instance of another install in testZone.
func (e *env) withReboots(ce providertest.ContractEnv) providertest.ContractEnv {
	ce.Restarts = func(id string) int {
		_, zone, name, ok := ident.SplitProviderID(id)
		if !ok {
			return -1
		}
		return e.fake.Restarts(zone, name)
	}
	ce.Stop = func(t *testing.T, id string) {
		_, zone, name, _ := ident.SplitProviderID(id)
		if !e.fake.SetInstanceStatus(zone, name, "TERMINATED") {
			t.Fatalf("no instance %s to stop", id)
		}
	}
	ce.ForeignInstance = func(t *testing.T, _ context.Context) (string, func(*testing.T)) {
		const name = "proxy-0f0f0f0f0f0f0f0f"
		e.fake.PutInstance(testZone, &computepb.Instance{Name: proto.String(name),
			Labels: map[string]string{LabelProvider: "gcp-test", LabelInstall: "install-other", LabelUID: "uid-theirs"}})
		before := e.fake.Instance(testZone, name)
		return ident.ProviderID(testProject, testZone, name), func(t *testing.T) {
			t.Helper()
			after := e.fake.Instance(testZone, name)
			if !proto.Equal(after, before) || e.fake.Restarts(testZone, name) != 0 {
				t.Fatalf("another install's instance is %v after a refused reboot, want it untouched: %v", after, before)
			}
		}
	}
	return ce
}
