package provider

import (
	"slices"
	"testing"
)

const gceGood = `
providers:
- name: gcp-eu
  type: gce
  gce:
    project: my-proxies
    zones: [europe-west1-b, europe-west4-a]
    machineTypes: {small: e2-small}
    images: {ubuntu-2404: projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64}
    firewall: {sourceRanges: [192.0.2.0/24]}
`

func TestParseConfigGCE(t *testing.T) {
	cfg, err := ParseConfig([]byte(gceGood))
	if err != nil {
		t.Fatal(err)
	}
	g := cfg.Providers[0].GCE
	if g == nil || g.Project != "my-proxies" || len(g.Zones) != 2 || g.MachineTypes["small"] != "e2-small" {
		t.Fatalf("parsed %+v", g)
	}
	d := g.WithDefaults()
	if d.Network != "global/networks/default" || d.NetworkTier != "PREMIUM" || d.DiskSizeGb != 10 ||
		!d.HasExternalIP() || d.Firewall.TargetTag != "egress-proxy" {
		t.Errorf("defaults: %+v (firewall %+v)", d, d.Firewall)
	}
	d.Zones[0] = "changed"
	d.MachineTypes["small"] = "changed"
	if g.Zones[0] != "europe-west1-b" || g.MachineTypes["small"] != "e2-small" {
		t.Error("WithDefaults shares the zones or machine types of its input")
	}
}

// TestParseConfigGCEProblems: every rule of the gce block, each message prefixed with
// the block and the path inside it, all reported at once.
func TestParseConfigGCEProblems(t *testing.T) {
	cases := []struct {
		name, block string
		want        []string
	}{
		{"unknown field", `{project: my-proxies, zones: [europe-west1-b], machineTypes: {s: e2-small}, images: {d: images/family/x}, zone: x}`,
			[]string{`provider "g": gce: unknown field "zone"`}},
		{"unknown nested field", `{project: my-proxies, zones: [europe-west1-b], machineTypes: {s: e2-small}, images: {d: images/family/x}, firewall: {tag: x}}`,
			[]string{`provider "g": gce.firewall: unknown field "tag"`}},
		{"empty", `{}`, []string{
			`provider "g": gce: project is required`,
			`provider "g": gce: zones needs at least one entry`,
			`provider "g": gce: machineTypes needs at least one entry`,
			`provider "g": gce: images needs at least one entry`}},
		{"bad values", `{project: My_Project, zones: [europe-west1, europe-west1], machineTypes: {s: E2}, images: {d: 'ubuntu'},
		  networkTier: GOLD, diskSizeGb: -1, firewall: {targetTag: Bad_Tag, sourceRanges: [10.0.0.0/33]}, endpoint: 'ftp://x'}`, []string{
			`provider "g": gce: project "My_Project" is not a project ID (6 to 30 lowercase letters, digits and dashes, starting with a letter)`,
			`provider "g": gce.zones[0]: "europe-west1" is not a zone name (such as europe-west1-b)`,
			`provider "g": gce.zones[1]: zone "europe-west1" is already listed at gce.zones[0]`,
			`provider "g": gce.machineTypes.s: "E2" is not a machine type name (such as e2-small)`,
			`provider "g": gce.images.d: "ubuntu" is not an image or image family (such as projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64)`,
			`provider "g": gce: networkTier must be PREMIUM or STANDARD, got "GOLD"`,
			`provider "g": gce: diskSizeGb must be at least 1, got -1`,
			`provider "g": gce.firewall: targetTag "Bad_Tag" must be a lowercase name of letters, digits and dashes, starting with a letter`,
			`provider "g": gce.firewall.sourceRanges[0]: "10.0.0.0/33" is not a CIDR`,
			`provider "g": gce: endpoint "ftp://x" must be an http or https URL with a host`}},
		{"mixed families", `{project: my-proxies, zones: [europe-west1-b], machineTypes: {s: e2-small}, images: {d: images/family/x},
		  firewall: {sourceRanges: [192.0.2.0/24, 10.0.0.0/8, "2001:db8::/32"]}}`, []string{
			`provider "g": gce.firewall.sourceRanges: mixes IPv4 (192.0.2.0/24) and IPv6 (2001:db8::/32) ranges, which one GCE firewall rule cannot hold; ` +
				`with gce.stackType IPV4_ONLY the VMs have no IPv6 address, so list the IPv4 ranges ` +
				`(or set gce.stackType IPV4_IPV6: the provider then writes a second rule for the IPv6 ranges)`}},
		{"mixed families on a dual stack", `{project: my-proxies, zones: [europe-west1-b], machineTypes: {s: e2-small}, images: {d: images/family/x},
		  subnetwork: regions/europe-west1/subnetworks/proxies, stackType: IPV4_IPV6, firewall: {sourceRanges: [192.0.2.0/24, "2001:db8::/32"]}}`, nil},
		{"stack type", `{project: my-proxies, zones: [europe-west1-b], machineTypes: {s: e2-small}, images: {d: images/family/x}, stackType: IPV6_ONLY}`, []string{
			`provider "g": gce: stackType must be IPV4_ONLY or IPV4_IPV6, got "IPV6_ONLY"`}},
		{"dual stack without subnetwork, standard tier", `{project: my-proxies, zones: [europe-west1-b], machineTypes: {s: e2-small}, images: {d: images/family/x},
		  stackType: IPV4_IPV6, networkTier: STANDARD}`, []string{
			`provider "g": gce: stackType IPV4_IPV6 needs a subnetwork: the default network's subnetworks are IPv4 only, so name a subnetwork with stack type IPV4_IPV6 and an external IPv6 range`,
			`provider "g": gce: stackType IPV4_IPV6 needs networkTier PREMIUM: GCE gives external IPv6 addresses in the PREMIUM tier only`}},
		{"subnetwork of another region", `{project: my-proxies, zones: [europe-west1-b, europe-west4-a, europe-west1-c], machineTypes: {s: e2-small},
		  images: {d: images/family/x}, subnetwork: projects/my-proxies/regions/europe-west1/subnetworks/proxies}`, []string{
			`provider "g": gce.zones[1]: zone "europe-west4-a" is in region europe-west4, but subnetwork projects/my-proxies/regions/europe-west1/subnetworks/proxies ` +
				`is in region europe-west1: a subnetwork is regional, so list zones of europe-west1 only (or make one provider entry per region)`}},
		{"subnetwork malformed", `{project: my-proxies, zones: [europe-west1-b], machineTypes: {s: e2-small},
		  images: {d: images/family/x}, subnetwork: subnetworks/proxies}`, []string{
			`provider "g": gce: subnetwork "subnetworks/proxies" is not regions/<region>/subnetworks/<name> (or that path under projects/<project>/, or its URL)`}},
		{"authentication", `{project: my-proxies, zones: [europe-west1-b], machineTypes: {s: e2-small}, images: {d: images/family/x},
		  credentialsFile: /k.json, withoutAuthentication: true}`, []string{
			`provider "g": gce: credentialsFile and withoutAuthentication exclude each other`,
			`provider "g": gce: withoutAuthentication needs an endpoint (the real API refuses unauthenticated calls)`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte("providers:\n- name: g\n  type: gce\n  gce: " + c.block + "\n"))
			if got := problems(err); !slices.Equal(got, c.want) {
				t.Errorf("problems:\n  got:  %q\n  want: %q", got, c.want)
			}
		})
	}
}

func TestGCEImageReferences(t *testing.T) {
	for _, ok := range []string{
		"projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64",
		"projects/ubuntu-os-cloud/global/images/ubuntu-2404-noble-amd64-v20250101",
		"https://www.googleapis.com/compute/v1/projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64",
		"global/images/family/my-family",
		"global/images/my-image",
	} {
		if msg := gceImageProblem(ok); msg != "" {
			t.Errorf("%s refused: %s", ok, msg)
		}
	}
	for _, bad := range []string{"ubuntu-2404", "projects/ubuntu-os-cloud/images/ubuntu-2404", "projects/x/global/images/family/", "images//x"} {
		if gceImageProblem(bad) == "" {
			t.Errorf("%s accepted", bad)
		}
	}
}
