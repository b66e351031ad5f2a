package main

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/cost"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// A pool's spread is checked against the host names of each kvm2 and kvm block and the
// locations of each hcloud block.
func TestPoolZonesAreTheHostNames(t *testing.T) {
	cfg := &provider.Config{Providers: []provider.ProviderConfig{
		{Name: "kvm2-home", Type: provider.TypeKVM2, KVM2: &provider.KVMConfig{Hosts: []provider.KVMHost{{Name: "beelink"}, {Name: "nuc"}}}},
		{Name: "old-lab", Type: provider.TypeKVM, KVM: &provider.KVMConfig{Hosts: []provider.KVMHost{{Name: "tower"}}}},
		{Name: "empty", Type: provider.TypeKVM2, KVM2: &provider.KVMConfig{}},
		{Name: "hetzner-eu", Type: provider.TypeHCloud, HCloud: &provider.HCloudConfig{Locations: []string{"fsn1", "hel1"}}},
	}}
	want := map[string][]string{"kvm2-home": {"beelink", "nuc"}, "old-lab": {"tower"}, "empty": nil, "hetzner-eu": {"fsn1", "hel1"}}
	if diff := cmp.Diff(want, poolZones(cfg)); diff != "" {
		t.Errorf("poolZones (-want +got):\n%s", diff)
	}
}

// The manager caches only the Services and EndpointSlices of pools.
func TestPoolCacheSelectsPoolObjects(t *testing.T) {
	by := poolCacheByObject()
	if len(by) != 2 {
		t.Fatalf("cache restrictions for %d kinds, want Services and EndpointSlices", len(by))
	}
	for obj, o := range by {
		if !o.Label.Matches(labels.Set{v1alpha1.PoolLabel: "news"}) || o.Label.Matches(labels.Set{"app": "web"}) {
			t.Errorf("%T: selector %q", obj, o.Label)
		}
	}
}

// The manager caches only the demand Leases, not the cluster's own (one per node among
// them), and only in the demand namespace.
func TestCacheHoldsOnlyDemandLeases(t *testing.T) {
	for obj, o := range cacheByObject("egress-system") {
		if _, ok := obj.(*coordinationv1.Lease); !ok {
			continue
		}
		if !o.Label.Matches(labels.Set{demand.LabelFor: "news"}) || o.Label.Matches(labels.Set{"kubernetes.io/hostname": "node-1"}) {
			t.Fatalf("Lease cache selector %q", o.Label)
		}
		if _, ok := o.Namespaces["egress-system"]; !ok || len(o.Namespaces) != 1 {
			t.Fatalf("Lease cache namespaces %v, want the demand namespace egress-system alone", o.Namespaces)
		}
		return
	}
	t.Fatal("the manager's cache does not restrict Leases")
}

// The autoscaler's budget is priced by the providers config: a pool of hcloud cx22
// children costs the cx22 price and its primary IPv4's; a pool on a provider without
// prices has no known cost (its budget caps nothing).
func TestChildCostIsThePoolsPrice(t *testing.T) {
	cfg := &provider.Config{Providers: []provider.ProviderConfig{
		{Name: "hetzner", Type: provider.TypeHCloud, HCloud: &provider.HCloudConfig{Locations: []string{"fsn1"}},
			Prices: &provider.Prices{Currency: "EUR", MachineTypes: map[string]provider.Price{"cx22": "0.006"}, IPv4Address: "0.001"}},
		{Name: "home", Type: provider.TypeKVM2, KVM2: &provider.KVMConfig{}},
	}}
	f := childCost(cost.Entries(cfg))
	pool := &v1alpha1.ProxyPool{}
	pool.Spec.Template.Spec.Provider, pool.Spec.Template.Spec.Placement.MachineType = "hetzner", "cx22"
	if got, ok := f(context.Background(), pool); !ok || got != 0.007 {
		t.Errorf("a cx22 child costs %g (%v), want 0.007 EUR/h", got, ok)
	}
	pool.Spec.Template.Spec.Provider = "home"
	if got, ok := f(context.Background(), pool); ok {
		t.Errorf("a child on a provider without prices costs %g, want unknown", got)
	}
}
