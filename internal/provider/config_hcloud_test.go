package provider

import (
	"slices"
	"testing"
)

const hcloudGood = `
providers:
- name: hetzner-eu
  type: hcloud
  hcloud:
    tokenFile: /etc/proxy-operator/hcloud/token
    locations: [fsn1, nbg1, hel1]
    serverTypes: [cx22, cax11]
    images: [ubuntu-24.04, "123456"]
    firewall: {sourceRanges: [192.0.2.0/24, "2001:db8::/32"]}
    limits: {servers: 10, primaryIPs: 10, firewalls: 50}
`

func TestParseConfigHCloud(t *testing.T) {
	cfg, err := ParseConfig([]byte(hcloudGood))
	if err != nil {
		t.Fatal(err)
	}
	h := cfg.Providers[0].HCloud
	if h == nil || h.TokenFile != "/etc/proxy-operator/hcloud/token" || len(h.Locations) != 3 || h.ServerTypes[1] != "cax11" ||
		h.Images[1] != "123456" || h.Limits.Firewalls != 50 {
		t.Fatalf("parsed %+v", h)
	}
	if !h.HasIPv6() || !h.ManagesFirewall() {
		t.Errorf("defaults: ipv6 %v, firewall %v; want both on", h.HasIPv6(), h.ManagesFirewall())
	}
}

// TestParseConfigHCloudProblems: every rule of the hcloud block, each message prefixed
// with the block and the path inside it, all reported at once.
func TestParseConfigHCloudProblems(t *testing.T) {
	const ok = `tokenFile: /t, locations: [fsn1], serverTypes: [cx22], images: [ubuntu-24.04]`
	cases := []struct {
		name, block string
		want        []string
	}{
		{"unknown field", `{` + ok + `, location: fsn1}`, []string{`provider "h": hcloud: unknown field "location"`}},
		{"unknown nested field", `{` + ok + `, firewall: {ranges: []}}`, []string{`provider "h": hcloud.firewall: unknown field "ranges"`}},
		{"empty", `{}`, []string{
			`provider "h": hcloud: tokenFile is required (a file holding the project's API token, such as a mounted Secret)`,
			`provider "h": hcloud: locations needs at least one entry`,
			`provider "h": hcloud: serverTypes needs at least one entry`,
			`provider "h": hcloud: images needs at least one entry`}},
		{"bad values", `{tokenFile: /t, locations: [Falkenstein, fsn1, fsn1], serverTypes: ["CX 22"], images: ["-1", "Ubuntu 24"],
		  firewall: {sourceRanges: [10.0.0.0/33]}, limits: {servers: -1}, endpoint: 'ftp://x'}`, []string{
			`provider "h": hcloud.locations[0]: "Falkenstein" is not a location name (such as fsn1, nbg1, hel1, ash, hil, sin)`,
			`provider "h": hcloud.locations[2]: "fsn1" is already listed at hcloud.locations[1]`,
			`provider "h": hcloud.serverTypes[0]: "CX 22" is not a server type name (such as cx22, cpx11, cax11)`,
			`provider "h": hcloud.images[0]: "-1" is not an image name or ID (such as ubuntu-24.04, or the number of a snapshot)`,
			`provider "h": hcloud.images[1]: "Ubuntu 24" is not an image name or ID (such as ubuntu-24.04, or the number of a snapshot)`,
			`provider "h": hcloud.firewall.sourceRanges[0]: "10.0.0.0/33" is not a CIDR`,
			`provider "h": hcloud.limits: servers must be at least 1 (or left out), got -1`,
			`provider "h": hcloud: endpoint "ftp://x" must be an http or https URL with a host`}},
		{"mixed families without IPv6", `{` + ok + `, ipv6: false, firewall: {sourceRanges: [192.0.2.0/24, "2001:db8::/32"]}}`, []string{
			`provider "h": hcloud.firewall.sourceRanges: mixes IPv4 (192.0.2.0/24) and IPv6 (2001:db8::/32) ranges, but with hcloud.ipv6 false ` +
				`the servers have no IPv6 address to admit the IPv6 ones to: list the IPv4 ranges (or leave hcloud.ipv6 on, its default)`}},
		{"mixed families with IPv6", `{` + ok + `, firewall: {sourceRanges: [192.0.2.0/24, "2001:db8::/32"]}}`, nil},
		{"a block of another type", `{` + ok + `}` + "\n  gce: {}", []string{`provider "h": a gce: block does not match type hcloud`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte("providers:\n- name: h\n  type: hcloud\n  hcloud: " + c.block + "\n"))
			if got := problems(err); !slices.Equal(got, c.want) {
				t.Errorf("problems:\n  got:  %q\n  want: %q", got, c.want)
			}
		})
	}
	if _, err := ParseConfig([]byte("providers:\n- name: h\n  type: hcloud\n")); !slices.Equal(problems(err), []string{`provider "h": type hcloud needs a hcloud: block`}) {
		t.Errorf("no block: %v", err)
	}
}
