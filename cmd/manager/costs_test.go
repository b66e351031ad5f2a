package main

import (
	"slices"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// The manager names, per provider with a price table, the placement.machineType names it
// has no price for; a kvm2 entry without prices has none to name.
func TestUnpricedMachineTypes(t *testing.T) {
	cfg, err := provider.ParseConfig([]byte(`providers:
- name: gce-us
  type: gce
  gce: {project: my-proxies, zones: [us-central1-a], machineTypes: {small: e2-small, big: c3-standard-4, arm: t2a-standard-1}, images: {d: images/family/x}}
- name: hetzner-eu
  type: hcloud
  hcloud: {tokenFile: /t, locations: [fsn1], serverTypes: [cx22, cx23], images: [ubuntu-24.04]}
- name: kvm2-home
  type: kvm2
  kvm2: {sshKeyFile: /k, insecureIgnoreHostKey: true, machineTypes: {small: {vcpus: 1, memoryMiB: 1024}},
         hosts: [{name: beelink, address: 'beelink:22', user: u, bridge: br0}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range [][]string{{"arm", "big"}, {"cx23"}, nil} {
		if got := unpriced(cfg.Providers[i]); !slices.Equal(got, want) {
			t.Errorf("%s: unpriced %q, want %q", cfg.Providers[i].Name, got, want)
		}
	}
}
