package kvm2

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
)

// Ceilings on libvirt RPCs per operation, counted by the observe decorator. Each RPC is a
// round trip over SSH to the host, so these are the operations' latency floor.
const (
	maxCreateRPCs = 16 // a fresh Create with the base image cached
	maxGetRPCs    = 4  // a Get of a running domain whose agent answers
	maxDeleteRPCs = 9  // a Delete of a running domain and its two volumes
)

func rpcBreakdown(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(parts, " ")
}

// TestRPCsPerOperation reports and bounds the RPCs of Create (cached image), Get and
// Delete.
func TestRPCsPerOperation(t *testing.T) {
	env := newTestEnv(t)
	rpcs := env.p.hosts.rpcs
	req := testRequest("proxy-c0c0c0c0c0c0c0c0")

	rpcs.reset()
	inst, err := env.p.Create(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	create := rpcs.total()
	t.Logf("Create (cached image): %d RPCs: %s", create, rpcBreakdown(rpcs.methods()))

	must(0, env.fake.SetInterfaceAddresses(req.Name, libvirt.DomainInterfaceAddressesSrcAgent,
		[]libvirt.DomainInterface{libvirtfake.Interface("eth0", "52:54:00:00:00:01", "192.168.1.80/24")}, nil))
	rpcs.reset()
	if _, err := env.p.Get(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	get := rpcs.total()
	t.Logf("Get (running, agent answers): %d RPCs: %s", get, rpcBreakdown(rpcs.methods()))

	must(0, env.fake.SetDomainState(req.Name, libvirt.DomainShutoff))
	rpcs.reset()
	if _, err := env.p.Get(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	getOff := rpcs.total()
	t.Logf("Get (shut off): %d RPCs: %s", getOff, rpcBreakdown(rpcs.methods()))
	if getOff >= get {
		t.Errorf("a Get of a shut-off domain took %d RPCs, a running one %d: it should skip the address lookup", getOff, get)
	}
	must(0, env.fake.SetDomainState(req.Name, libvirt.DomainRunning))

	rpcs.reset()
	if err := env.p.Delete(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	del := rpcs.total()
	t.Logf("Delete: %d RPCs: %s", del, rpcBreakdown(rpcs.methods()))

	if create > maxCreateRPCs || get > maxGetRPCs || del > maxDeleteRPCs {
		t.Fatalf("RPCs per Create %d (max %d), Get %d (max %d), Delete %d (max %d)",
			create, maxCreateRPCs, get, maxGetRPCs, del, maxDeleteRPCs)
	}
	// The fake counts what reached it: the decorator must not miss or invent calls.
	if n := env.fake.TotalCalls(); int64(n) < create+get+del {
		t.Fatalf("the fake saw %d calls, the counter %d", n, create+get+del)
	}
}

// BenchmarkCreateGetDelete reports RPCs per Create (cached image) and per Get next to
// the time, over in-memory libvirt.
func BenchmarkCreateGetDelete(b *testing.B) {
	env := newTestEnv(b)
	rpcs := env.p.hosts.rpcs
	var creates, gets int64
	for i := 0; b.Loop(); i++ {
		req := testRequest(fmt.Sprintf("proxy-bench%011d", i))
		rpcs.reset()
		inst, err := env.p.Create(b.Context(), req)
		if err != nil {
			b.Fatal(err)
		}
		creates += rpcs.total()
		if err := env.fake.SetInterfaceAddresses(req.Name, libvirt.DomainInterfaceAddressesSrcAgent,
			[]libvirt.DomainInterface{libvirtfake.Interface("eth0", "52:54:00:00:00:01", "192.168.1.80/24")}, nil); err != nil {
			b.Fatal(err)
		}
		rpcs.reset()
		if _, err := env.p.Get(b.Context(), inst.ProviderID); err != nil {
			b.Fatal(err)
		}
		gets += rpcs.total()
		if err := env.p.Delete(b.Context(), inst.ProviderID); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(creates)/float64(b.N), "create-rpcs/op")
	b.ReportMetric(float64(gets)/float64(b.N), "get-rpcs/op")
}
