package gce

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

const testDualSubnet = "regions/europe-west1/subnetworks/proxies-v6"

// dualStack puts the provider on subnetwork proxies-v6 of network proxies, in testZone
// only (a subnetwork is regional), with stack type IPV4_IPV6.
func dualStack(c *provider.GCEConfig) {
	c.Zones = []string{testZone}
	c.Network, c.Subnetwork = "global/networks/proxies", testDualSubnet
	c.StackType = provider.GCEStackDualIPv6
}

// newDualEnv is a dual-stack provider (with opts) over a fake whose subnetwork is
// dual-stack when dual is true, IPv4 only otherwise.
func newDualEnv(t *testing.T, dual bool, opts ...envOption) *env {
	e := newEnv(t, append([]envOption{dualStack}, opts...)...)
	e.fake.AddNetwork("proxies")
	if dual {
		e.fake.AddDualStackSubnetwork("europe-west1", "proxies-v6", "proxies")
	} else {
		e.fake.AddSubnetwork("europe-west1", "proxies-v6", "proxies")
	}
	return e
}

// TestContractDualStack runs the suite every provider passes with stackType IPV4_IPV6 on
// a dual-stack subnetwork, the provider managing rules for IPv4 and IPv6 sources (two
// per instance, none left once the suite's instances are deleted).
func TestContractDualStack(t *testing.T) {
	providertest.RunContract(t, func(t *testing.T) providertest.ContractEnv {
		e := newDualEnv(t, true, withDualFirewall)
		return e.withReboots(providertest.ContractEnv{
			Provider: e.p,
			Request: provider.CreateRequest{
				Placement: provider.Placement{Zone: testZone, MachineType: "small", Image: "ubuntu-2404"},
				CloudInit: []byte(testUserData), Port: 3128,
			},
			MissingID:   ident.ProviderID(testProject, testZone, "proxy-0000000000000000"),
			MalformedID: "gce://" + testProject + "/proxy-0000000000000000",
			Targets:     []string{testZone},
			Timeout:     30 * time.Second,
		})
	})
}

// TestDualStackCreateAndGet: with stackType IPV4_IPV6 the instance's interface asks for
// one external IPv6 access (DIRECT_IPV6, PREMIUM); Create and Get report its address as
// IPv6 beside the IPv4 one, each instance its own, and a preempted (stopped) instance
// reports neither until it runs again.
func TestDualStackCreateAndGet(t *testing.T) {
	e := newDualEnv(t, true)
	a, err := e.p.Create(t.Context(), request("proxy-00000000000000d1", "uid-d1"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.p.Create(t.Context(), request("proxy-00000000000000d2", "uid-d2"))
	if err != nil {
		t.Fatal(err)
	}
	for _, inst := range []provider.Instance{a, b} {
		v6, err := netip.ParseAddr(inst.IPv6)
		if err != nil || !v6.Is6() || !strings.HasPrefix(inst.IP, "203.0.113.") {
			t.Fatalf("instance %+v: want an external IPv4 and an IPv6 address", inst)
		}
		got, err := e.p.Get(t.Context(), inst.ProviderID)
		if err != nil || got.IPv6 != inst.IPv6 || got.IP != inst.IP {
			t.Errorf("Get %s = %+v, %v; want the addresses Create reported (%s, %s)", inst.ProviderID, got, err, inst.IP, inst.IPv6)
		}
	}
	if a.IPv6 == b.IPv6 {
		t.Errorf("two instances share the IPv6 address %s", a.IPv6)
	}
	nic := e.fake.Instance(testZone, a.Name).GetNetworkInterfaces()[0]
	if nic.GetStackType() != provider.GCEStackDualIPv6 || len(nic.GetIpv6AccessConfigs()) != 1 ||
		nic.GetIpv6AccessConfigs()[0].GetType() != "DIRECT_IPV6" || nic.GetIpv6AccessConfigs()[0].GetNetworkTier() != "PREMIUM" {
		t.Errorf("interface %v: want stackType IPV4_IPV6 and one DIRECT_IPV6 PREMIUM access", nic)
	}
	if !strings.HasSuffix(nic.GetSubnetwork(), testDualSubnet) {
		t.Errorf("interface on subnetwork %q, want %s", nic.GetSubnetwork(), testDualSubnet)
	}

	if !e.fake.Preempt(testZone, a.Name) {
		t.Fatalf("preempting %s", a.Name)
	}
	if got, err := e.p.Get(t.Context(), a.ProviderID); err != nil || got.IP != "" || got.IPv6 != "" {
		t.Errorf("Get of the stopped instance = %+v, %v; want no addresses", got, err)
	}
	again, err := e.p.Create(t.Context(), request(a.Name, "uid-d1"))
	if err != nil || again.IPv6 == "" || again.IP == "" {
		t.Errorf("create over the stopped instance = %+v, %v; want it started with both addresses", again, err)
	}
}

// TestIPv4OnlyStackHasNoIPv6: without stackType the interface asks for no IPv6 and the
// instance reports none.
func TestIPv4OnlyStackHasNoIPv6(t *testing.T) {
	e := newEnv(t)
	inst, err := e.p.Create(t.Context(), request("proxy-00000000000000d3", "uid-d3"))
	if err != nil || inst.IPv6 != "" {
		t.Fatalf("instance %+v, %v; want no IPv6 address", inst, err)
	}
	nic := e.fake.Instance(testZone, inst.Name).GetNetworkInterfaces()[0]
	if nic.StackType != nil || len(nic.GetIpv6AccessConfigs()) != 0 {
		t.Errorf("interface %v asks for IPv6", nic)
	}
}

// TestDualStackRefusedOnIPv4OnlySubnetwork: the API refuses IPv6 access on an IPv4-only
// subnetwork; the error is permanent and says the subnetwork must be dual-stack, naming it.
func TestDualStackRefusedOnIPv4OnlySubnetwork(t *testing.T) {
	e := newDualEnv(t, false)
	_, err := e.p.Create(t.Context(), request("proxy-00000000000000d4", "uid-d4"))
	if err == nil || !errors.Is(err, provider.ErrPermanent) {
		t.Fatalf("create on an IPv4-only subnetwork: %v, want a permanent error", err)
	}
	for _, want := range []string{"stack type IPV4_ONLY", "the subnetwork " + testDualSubnet + " must be dual-stack", "--stack-type=IPV4_IPV6"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if n := e.fake.Instances(); n != 0 {
		t.Errorf("%d instances after the refusal, want none", n)
	}
}
