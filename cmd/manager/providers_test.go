package main

import (
	"io"
	"testing"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2"
)

// TestRegistryBuildsKVMAndKVM2FromOneFile: one providers file holding a kvm entry and a
// kvm2 entry on the same host and the same kvm-ssh Secret builds both, and each answers
// with its own block's name, so each entry really runs as its own type.
func TestRegistryBuildsKVMAndKVM2FromOneFile(t *testing.T) {
	const block = `
    sshKeyFile: /etc/kvm-ssh/id_ed25519
    knownHostsFile: /etc/kvm-ssh/known_hosts
    images: {debian-13: {url: 'https://cloud.debian.org/images/cloud/trixie/latest/debian-13-generic-amd64.qcow2'}}
    machineTypes: {small: {vcpus: 1, memoryMiB: 1024}}
    hosts: [{name: beelink, address: 'beelink:22', user: novakj, bridge: br0}]
`
	path := writeFile(t, "providers.yaml", "providers:\n"+
		"- name: kvm-home\n  type: kvm\n  kvm:"+block+
		"- name: kvm2-home\n  type: kvm2\n  kvm2:"+block)
	providers := buildProviders(t, path)
	if len(providers) != 2 {
		t.Fatalf("built %d providers, want kvm-home and kvm2-home", len(providers))
	}
	for name, typ := range map[string]string{"kvm-home": "kvm", "kvm2-home": "kvm2"} {
		p := providers[name]
		if p == nil {
			t.Fatalf("no provider %s", name)
		}
		// Both carry the install identity the registry was given into their marks.
		if k, ok := p.(interface{ Unwrap() provider.Provider }).Unwrap().(*kvm2.Provider); !ok || k.InstallID() != "install-test" {
			t.Errorf("%s: built without the registry's install ID (%T)", name, p)
		}
		// Placement is checked before any host is dialled.
		_, err := p.Create(t.Context(), provider.CreateRequest{Name: "proxy-0123456789abcdef", UID: "u",
			Placement: provider.Placement{Zone: "nowhere", MachineType: "small", Image: "debian-13"}})
		want := `placement.zone "nowhere" is not in ` + typ + `.hosts`
		if err == nil || err.Error() != want || provider.Class(err) != provider.ErrPermanent {
			t.Errorf("%s: create in an unknown zone: %v, want permanent %q", name, err, want)
		}
	}
}

// TestRegistryBuildsGCE: a providers file with a gce entry builds a gce provider carrying
// the registry's install ID, without reading credentials or dialling, and its placement
// checks answer with the gce block's name.
func TestRegistryBuildsGCE(t *testing.T) {
	path := writeFile(t, "providers.yaml", gceProviders("gcp-eu"))
	providers := buildProviders(t, path)
	p := providers["gcp-eu"]
	g, ok := p.(interface{ Unwrap() provider.Provider }).Unwrap().(*gce.Provider)
	if !ok || g.InstallID() != "install-test" {
		t.Fatalf("gcp-eu: built %T without the registry's install ID", p)
	}
	_, err := p.Create(t.Context(), provider.CreateRequest{Name: "proxy-0123456789abcdef", UID: "u",
		Placement: provider.Placement{Zone: "us-east1-b", MachineType: "small", Image: "ubuntu-2404"}})
	if want := `placement.zone "us-east1-b" is not in gce.zones`; err == nil || err.Error() != want || provider.Class(err) != provider.ErrPermanent {
		t.Errorf("create in an unknown zone: %v, want permanent %q", err, want)
	}
}

// TestRegistryBuildsHCloud: a providers file with an hcloud entry builds an hcloud
// provider carrying the registry's install ID, without reading the token or dialling,
// and its placement checks answer with the hcloud block's name.
func TestRegistryBuildsHCloud(t *testing.T) {
	path := writeFile(t, "providers.yaml", `providers:
- name: hetzner-eu
  type: hcloud
  hcloud:
    tokenFile: /nonexistent/token
    locations: [fsn1, nbg1]
    serverTypes: [cx23]
    images: [ubuntu-24.04]
`)
	p := buildProviders(t, path)["hetzner-eu"]
	h, ok := p.(interface{ Unwrap() provider.Provider }).Unwrap().(*hcloud.Provider)
	if !ok || h.InstallID() != "install-test" {
		t.Fatalf("hetzner-eu: built %T without the registry's install ID", p)
	}
	if _, ok := provider.RebooterOf(p); !ok {
		t.Error("hetzner-eu cannot reboot")
	}
	_, err := p.Create(t.Context(), provider.CreateRequest{Name: "proxy-0123456789abcdef", UID: "u",
		Placement: provider.Placement{Zone: "hel1", MachineType: "cx23", Image: "ubuntu-24.04"}})
	if want := `placement.zone "hel1" is not in hcloud.locations [fsn1 nbg1]`; err == nil || err.Error() != want || provider.Class(err) != provider.ErrPermanent {
		t.Errorf("create in an unlisted location: %v, want permanent %q", err, want)
	}
}

// The operation metrics of the providers the manager builds are on controller-runtime's
// registry, the one /metrics serves: internal/provider registers nothing itself.
func TestProviderOperationsOnTheManagersMetrics(t *testing.T) {
	registerProviderMetrics()
	registerProviderMetrics() // once per process, however often the manager starts
	path := writeFile(t, "providers.yaml", gceProviders("gcp-metrics"))
	p := buildProviders(t, path)["gcp-metrics"]
	before := permanentGets(t)
	if _, err := p.Get(t.Context(), "gce://other-project/europe-west1-b/proxy-x"); provider.Class(err) != provider.ErrPermanent {
		t.Fatalf("get of another project's instance: %v, want a permanent error", err)
	}
	if after := permanentGets(t); after != before+1 {
		t.Fatalf("proxy_operator_provider_operations_total{provider=gcp-metrics,op=get,class=permanent} on controller-runtime's registry went %v -> %v, want one more", before, after)
	}
}

// permanentGets is proxy_operator_provider_operations_total{provider=gcp-metrics,
// op=get,class=permanent} on controller-runtime's registry, 0 before any.
func permanentGets(t *testing.T) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != "proxy_operator_provider_operations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["provider"] == "gcp-metrics" && labels["op"] == "get" && labels["class"] == "permanent" {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// gceProviders is a providers file with one gce entry called name, whose credentials
// file does not exist: building it dials nothing.
func gceProviders(name string) string {
	return `providers:
- name: ` + name + `
  type: gce
  gce:
    project: my-proxies
    zones: [europe-west1-b]
    machineTypes: {small: e2-small}
    images: {ubuntu-2404: projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64}
    credentialsFile: /nonexistent/key.json
`
}

// buildProviders loads the providers file at path and builds it through the manager's
// registry (install ID install-test); the providers are closed when the test ends.
func buildProviders(t *testing.T, path string) map[string]provider.Provider {
	t.Helper()
	cfg, err := provider.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	providers, err := provider.Build(cfg, registry("install-test"), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range providers {
			p.(io.Closer).Close()
		}
	})
	return providers
}
