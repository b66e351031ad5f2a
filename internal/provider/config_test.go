package provider

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"sigs.k8s.io/yaml"
)

const testSHA = "6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b"

// validKVM is a block that passes every rule; cases change one thing in a copy.
func validKVM() *KVMConfig {
	return &KVMConfig{
		SSHKeyFile:     "/etc/kvm-ssh/id_ed25519",
		KnownHostsFile: "/etc/kvm-ssh/known_hosts",
		Images: map[string]KVMImage{
			"debian-12": {URL: "https://cloud.debian.org/images/debian-12.qcow2", SHA256: testSHA},
		},
		MachineTypes: map[string]KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 1024}},
		Hosts:        []KVMHost{{Name: "beelink", Address: "beelink:22", User: "novakj", Bridge: "br0"}},
	}
}

func validConfig() *Config {
	return &Config{Providers: []ProviderConfig{{Name: "kvm2-home", Type: TypeKVM2, KVM2: validKVM()}}}
}

// problems splits a joined error into its messages.
func problems(err error) []string {
	if err == nil {
		return nil
	}
	return strings.Split(err.Error(), "\n")
}

func equalMessages(t *testing.T, err error, want []string) {
	t.Helper()
	if diff := cmp.Diff(want, problems(err), cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("problems (-want +got):\n%s", diff)
	}
}

func TestParseConfigFieldRules(t *testing.T) {
	const p = `provider "kvm2-home": `
	setPrefixes := func(prefixes ...string) func(c *KVMConfig) {
		return func(c *KVMConfig) { c.AllowedImageURLPrefixes = &prefixes }
	}
	cases := []struct {
		name   string
		mutate func(c *KVMConfig)
		want   []string
	}{
		{"valid", func(c *KVMConfig) {}, nil},
		{"sshKeyFile required", func(c *KVMConfig) { c.SSHKeyFile = "" }, []string{p + "kvm2: sshKeyFile is required"}},
		{"knownHostsFile required", func(c *KVMConfig) { c.KnownHostsFile = "" },
			[]string{p + "kvm2: knownHostsFile is required unless insecureIgnoreHostKey is true"}},
		{"knownHostsFile optional when insecure", func(c *KVMConfig) { c.KnownHostsFile = ""; c.InsecureIgnoreHostKey = true }, nil},
		{"diskSizeGb negative", func(c *KVMConfig) { c.DiskSizeGb = -1 }, []string{p + "kvm2: diskSizeGb must be at least 1, got -1"}},
		{"diskSizeGb one", func(c *KVMConfig) { c.DiskSizeGb = 1 }, nil},
		{"no images is fine", func(c *KVMConfig) { c.Images = nil }, nil},
		{"image key with a space", func(c *KVMConfig) { c.Images["deb ian"] = KVMImage{URL: "https://x/y"} },
			[]string{p + `kvm2.images: key "deb ian": only letters, digits, dots, dashes and underscores are allowed`}},
		{"image key with a slash", func(c *KVMConfig) { c.Images["a/b"] = KVMImage{URL: "https://x/y"} },
			[]string{p + `kvm2.images: key "a/b": only letters, digits, dots, dashes and underscores are allowed`}},
		{"image key with every allowed character", func(c *KVMConfig) { c.Images["Deb_12.3-x"] = KVMImage{URL: "http://x/y"} }, nil},
		{"image url required", func(c *KVMConfig) { c.Images["debian-12"] = KVMImage{} },
			[]string{p + "kvm2.images.debian-12: url is required"}},
		{"image url not http", func(c *KVMConfig) { c.Images["debian-12"] = KVMImage{URL: "ftp://host/x"} },
			[]string{p + `kvm2.images.debian-12: url "ftp://host/x" must be an http or https URL with a host`}},
		{"image url without host", func(c *KVMConfig) { c.Images["debian-12"] = KVMImage{URL: "https:///x"} },
			[]string{p + `kvm2.images.debian-12: url "https:///x" must be an http or https URL with a host`}},
		{"image url relative", func(c *KVMConfig) { c.Images["debian-12"] = KVMImage{URL: "images/x.qcow2"} },
			[]string{p + `kvm2.images.debian-12: url "images/x.qcow2" must be an http or https URL with a host`}},
		{"image url unparsable", func(c *KVMConfig) { c.Images["debian-12"] = KVMImage{URL: "http://[::1"} },
			[]string{p + "kvm2.images.debian-12: url is not a valid URL"}},
		{"image sha256 short", func(c *KVMConfig) { c.Images["debian-12"] = KVMImage{URL: "https://x/y", SHA256: "abc"} },
			[]string{p + "kvm2.images.debian-12: sha256 must be exactly 64 hex characters, got 3 characters"}},
		{"image sha256 not hex", func(c *KVMConfig) {
			c.Images["debian-12"] = KVMImage{URL: "https://x/y", SHA256: strings.Repeat("g", 64)}
		}, []string{p + "kvm2.images.debian-12: sha256 must be exactly 64 hex characters, got 64 characters"}},
		{"image sha256 upper case", func(c *KVMConfig) {
			c.Images["debian-12"] = KVMImage{URL: "https://x/y", SHA256: strings.ToUpper(testSHA)}
		}, nil},
		{"image format", func(c *KVMConfig) { c.Images["debian-12"] = KVMImage{URL: "https://x/y", Format: "vmdk"} },
			[]string{p + `kvm2.images.debian-12: format must be qcow2 or raw, got "vmdk"`}},
		{"image format raw", func(c *KVMConfig) { c.Images["debian-12"] = KVMImage{URL: "https://x/y", Format: "raw"} }, nil},
		{"image firmware", func(c *KVMConfig) { c.Images["debian-12"] = KVMImage{URL: "https://x/y", Firmware: "efi"} },
			[]string{p + `kvm2.images.debian-12: firmware must be uefi or bios, got "efi"`}},
		{"image firmware bios", func(c *KVMConfig) { c.Images["debian-12"] = KVMImage{URL: "https://x/y", Firmware: "bios"} }, nil},
		{"machineTypes required", func(c *KVMConfig) { c.MachineTypes = nil }, []string{p + "kvm2: machineTypes needs at least one entry"}},
		{"machineType vcpus", func(c *KVMConfig) { c.MachineTypes["small"] = KVMMachineType{MemoryMiB: 512} },
			[]string{p + "kvm2.machineTypes.small: vcpus must be greater than zero, got 0"}},
		{"machineType memory", func(c *KVMConfig) { c.MachineTypes["small"] = KVMMachineType{VCPUs: 2, MemoryMiB: -5} },
			[]string{p + "kvm2.machineTypes.small: memoryMiB must be greater than zero, got -5"}},
		{"hosts required", func(c *KVMConfig) { c.Hosts = nil }, []string{p + "kvm2: hosts needs at least one entry"}},
		{"host name required", func(c *KVMConfig) { c.Hosts[0].Name = "" }, []string{p + "kvm2.hosts[0]: name is required"}},
		{"host name characters", func(c *KVMConfig) { c.Hosts[0].Name = "bee/link" },
			[]string{p + `kvm2.hosts[0]: name "bee/link": only letters, digits, dots, dashes and underscores are allowed`}},
		{"host names unique", func(c *KVMConfig) { c.Hosts = append(c.Hosts, c.Hosts[0]) },
			[]string{p + `kvm2.hosts[1]: name "beelink" is already used by kvm2.hosts[0]`}},
		{"host address required", func(c *KVMConfig) { c.Hosts[0].Address = "" }, []string{p + "kvm2.hosts[0]: address is required"}},
		{"host address without port", func(c *KVMConfig) { c.Hosts[0].Address = "beelink" },
			[]string{p + `kvm2.hosts[0]: address "beelink" must be host:port`}},
		{"host address without host", func(c *KVMConfig) { c.Hosts[0].Address = ":22" },
			[]string{p + `kvm2.hosts[0]: address ":22" must be host:port`}},
		{"host address port zero", func(c *KVMConfig) { c.Hosts[0].Address = "beelink:0" },
			[]string{p + `kvm2.hosts[0]: address "beelink:0": port must be a number from 1 to 65535`}},
		{"host address named port", func(c *KVMConfig) { c.Hosts[0].Address = "beelink:ssh" },
			[]string{p + `kvm2.hosts[0]: address "beelink:ssh": port must be a number from 1 to 65535`}},
		{"host address ipv6", func(c *KVMConfig) { c.Hosts[0].Address = "[::1]:2222" }, nil},
		{"host user required", func(c *KVMConfig) { c.Hosts[0].User = "" }, []string{p + "kvm2.hosts[0]: user is required"}},
		{"host bridge required", func(c *KVMConfig) { c.Hosts[0].Bridge = "" }, []string{p + "kvm2.hosts[0]: bridge is required"}},
		{"host socket relative", func(c *KVMConfig) { c.Hosts[0].Socket = "run/libvirt-sock" },
			[]string{p + `kvm2.hosts[0]: socket "run/libvirt-sock" must be an absolute path`}},
		{"host socket absolute", func(c *KVMConfig) { c.Hosts[0].Socket = "/run/libvirt/libvirt-sock" }, nil},
		{"host domainType", func(c *KVMConfig) { c.Hosts[0].DomainType = "xen" },
			[]string{p + `kvm2.hosts[0]: domainType must be kvm or qemu, got "xen"`}},
		{"host domainType qemu", func(c *KVMConfig) { c.Hosts[0].DomainType = "qemu" }, nil},
		{"allowedImageURLPrefixes", setPrefixes("https://images.example.com/cloud/", "http://10.0.0.5:8080"), nil},
		{"allowedImageURLPrefixes empty", setPrefixes(), nil},
		{"allowedImageURLPrefixes problems, in order", setPrefixes("https://ok.example/", "ftp://host/x", "images/x", "https:///x", "%zz://x",
			"https://u:s3cret@host/x", "https://host/x?sig=t0ken", "https://host/x#f", "https://host/a/../b"), []string{
			p + `kvm2.allowedImageURLPrefixes[1]: "ftp://host/x" must be an http or https URL with a host`,
			p + `kvm2.allowedImageURLPrefixes[2]: "images/x" must be an http or https URL with a host`,
			p + `kvm2.allowedImageURLPrefixes[3]: "https:///x" must be an http or https URL with a host`,
			p + `kvm2.allowedImageURLPrefixes[4]: is not a valid URL`,
			p + `kvm2.allowedImageURLPrefixes[5]: "https://host/x" must not carry userinfo, a query or a fragment`,
			p + `kvm2.allowedImageURLPrefixes[6]: "https://host/x" must not carry userinfo, a query or a fragment`,
			p + `kvm2.allowedImageURLPrefixes[7]: "https://host/x" must not carry userinfo, a query or a fragment`,
			p + `kvm2.allowedImageURLPrefixes[8]: "https://host/a/../b" must not have . or .. path segments`,
		}},
		{"every problem at once, in order", func(c *KVMConfig) {
			c.SSHKeyFile = ""
			c.Images["b"] = KVMImage{}
			c.Images["a"] = KVMImage{Format: "x"}
			c.Hosts = append(c.Hosts, KVMHost{Name: "two", Address: "two:22"})
			c.Hosts[0].Bridge = ""
		}, []string{
			p + "kvm2: sshKeyFile is required",
			p + "kvm2.images.a: url is required",
			p + `kvm2.images.a: format must be qcow2 or raw, got "x"`,
			p + "kvm2.images.b: url is required",
			p + "kvm2.hosts[0]: bridge is required",
			p + "kvm2.hosts[1]: user is required",
			p + "kvm2.hosts[1]: bridge is required",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validConfig()
			tc.mutate(cfg.Providers[0].KVM2)
			data, err := yaml.Marshal(cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseConfig(data)
			equalMessages(t, err, tc.want)
			if err == nil && got.Providers[0].Name != "kvm2-home" {
				t.Fatalf("parsed %+v", got)
			}
			if err != nil && got != nil {
				t.Fatal("a config with problems was returned")
			}
		})
	}
}

func TestParseConfigEntryRules(t *testing.T) {
	kvm := validKVM
	cases := []struct {
		name    string
		entries []ProviderConfig
		want    []string
	}{
		{"kvm type uses the kvm block and its name in messages",
			[]ProviderConfig{{Name: "old", Type: TypeKVM, KVM: func() *KVMConfig { c := kvm(); c.Hosts[0].Bridge = ""; return c }()}},
			[]string{`provider "old": kvm.hosts[0]: bridge is required`}},
		{"both types side by side", []ProviderConfig{{Name: "a", Type: TypeKVM, KVM: kvm()}, {Name: "b", Type: TypeKVM2, KVM2: kvm()}}, nil},
		{"empty name", []ProviderConfig{{Type: TypeKVM2, KVM2: kvm()}}, []string{"providers[0]: name is required"}},
		{"name not an object name", []ProviderConfig{{Name: "KVM_Home", Type: TypeKVM2, KVM2: kvm()}},
			[]string{`provider "KVM_Home": name "KVM_Home" is not a valid object name: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')`}},
		{"duplicate names", []ProviderConfig{{Name: "a", Type: TypeKVM2, KVM2: kvm()}, {Name: "b", Type: TypeKVM2, KVM2: kvm()}, {Name: "a", Type: TypeKVM, KVM: kvm()}},
			[]string{`provider "a": name is already used by providers[0]`}},
		{"missing type", []ProviderConfig{{Name: "a", KVM2: kvm()}}, []string{`provider "a": type is required (one of gce, hcloud, kvm, kvm2)`}},
		{"unknown type", []ProviderConfig{{Name: "a", Type: "gcp", KVM2: kvm()}}, []string{`provider "a": unknown type "gcp" (one of gce, hcloud, kvm, kvm2)`}},
		{"gce type with a kvm2 block", []ProviderConfig{{Name: "a", Type: "gce", KVM2: kvm()}}, []string{`provider "a": a kvm2: block does not match type gce`, `provider "a": type gce needs a gce: block`}},
		{"missing block", []ProviderConfig{{Name: "a", Type: TypeKVM2}}, []string{`provider "a": type kvm2 needs a kvm2: block`}},
		{"block of the other type", []ProviderConfig{{Name: "a", Type: TypeKVM2, KVM: kvm()}},
			[]string{`provider "a": a kvm: block does not match type kvm2`, `provider "a": type kvm2 needs a kvm2: block`}},
		{"two blocks", []ProviderConfig{{Name: "a", Type: TypeKVM, KVM: kvm(), KVM2: kvm()}},
			[]string{`provider "a": a kvm2: block does not match type kvm`}},
		{"problems of several entries in config order", []ProviderConfig{
			{Name: "b", Type: TypeKVM2, KVM2: func() *KVMConfig { c := kvm(); c.Hosts = nil; return c }()},
			{Name: "a", Type: "nope"},
		}, []string{`provider "b": kvm2: hosts needs at least one entry`, `provider "a": unknown type "nope" (one of gce, hcloud, kvm, kvm2)`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data, err := yaml.Marshal(&Config{Providers: tc.entries})
			if err != nil {
				t.Fatal(err)
			}
			_, err = ParseConfig(data)
			equalMessages(t, err, tc.want)
		})
	}
}

func TestParseConfigDocument(t *testing.T) {
	const base = "providers:\n- name: home\n  type: kvm2\n  kvm2:\n    sshKeyFile: /k\n    insecureIgnoreHostKey: true\n" +
		"    machineTypes: {small: {vcpus: 1, memoryMiB: 512}}\n" +
		"    hosts: [{name: h, address: 'h:22', user: u, bridge: br0}]\n"
	cases := []struct {
		name string
		yaml string
		want []string // exact messages; a single entry ending in "*" is a prefix
	}{
		{"valid", base, nil},
		{"empty file", "", nil},
		{"no providers", "providers: []\n", nil},
		{"unknown fields at every level, all reported with their paths",
			"provider: x\n" + strings.Replace(strings.Replace(strings.Replace(base,
				"  type: kvm2\n", "  type: kvm2\n  kvm3: {}\n", 1),
				"sshKeyFile: /k\n", "sshKeyFile: /k\n    SSHKeyFile: /k\n", 1),
				"bridge: br0}", "bridge: br0, bridgex: br1}", 1),
			[]string{
				`top level: unknown field "provider"`,
				`provider "home": kvm2: unknown field "SSHKeyFile"`,
				`provider "home": kvm2.hosts[0]: unknown field "bridgex"`,
				`provider "home": unknown field "kvm3"`, // keys are walked in sorted order
			}},
		{"unknown field in an image and a machine type",
			strings.Replace(base, "machineTypes: {small: {vcpus: 1, memoryMiB: 512}}",
				"machineTypes: {small: {vcpus: 1, memoryMiB: 512, memory: 3}}\n    images: {deb: {url: 'http://x/y', urll: z}}", 1),
			[]string{`provider "home": kvm2.images.deb: unknown field "urll"`, `provider "home": kvm2.machineTypes.small: unknown field "memory"`}},
		{"unknown field and a rule, reported together",
			strings.Replace(base, "bridge: br0}", "bridgex: br0}", 1),
			[]string{`provider "home": kvm2.hosts[0]: unknown field "bridgex"`, `provider "home": kvm2.hosts[0]: bridge is required`}},
		{"duplicate key", strings.Replace(base, "user: u,", "user: u, user: v,", 1), []string{"does not parse: *"}},
		{"syntax error", "providers: [\n", []string{"does not parse: *"}},
		{"wrong value type", strings.Replace(base, "vcpus: 1", "vcpus: two", 1), []string{"does not parse: *"}},
		{"top level a list", "- a\n", []string{"top level: must be a mapping with a providers list"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			if len(tc.want) == 1 && strings.HasSuffix(tc.want[0], "*") {
				if err == nil || !strings.HasPrefix(err.Error(), strings.TrimSuffix(tc.want[0], "*")) {
					t.Fatalf("got %v, want an error starting %q", err, tc.want[0])
				}
				return
			}
			equalMessages(t, err, tc.want)
		})
	}
}

func TestParseConfigKeepsValues(t *testing.T) {
	cfg, err := ParseConfig([]byte(`providers:
- name: home
  type: kvm2
  kvm2:
    sshKeyFile: /etc/kvm-ssh/id_ed25519
    knownHostsFile: /etc/kvm-ssh/known_hosts
    diskSizeGb: 20
    installGuestAgent: false
    vendorData: "#cloud-config\n"
    images: {deb: {url: 'https://x/y', format: raw, firmware: bios}}
    machineTypes: {small: {vcpus: 2, memoryMiB: 2048}}
    hosts: [{name: h, address: 'h:22', user: u, bridge: br0, socket: /s, pool: p, domainType: qemu}]
`))
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.Providers[0].KVM2
	if k.DiskSizeGb != 20 || k.GuestAgent() || k.VendorData != "#cloud-config\n" ||
		k.Images["deb"] != (KVMImage{URL: "https://x/y", Format: "raw", Firmware: "bios"}) ||
		k.MachineTypes["small"] != (KVMMachineType{VCPUs: 2, MemoryMiB: 2048}) ||
		k.Hosts[0] != (KVMHost{Name: "h", Address: "h:22", User: "u", Bridge: "br0", Socket: "/s", Pool: "p", DomainType: "qemu"}) {
		t.Fatalf("parsed block %+v", k)
	}
}

func TestParseConfigRedactsURLCredentials(t *testing.T) {
	cfg := validConfig()
	cfg.Providers[0].KVM2.Images["debian-12"] = KVMImage{URL: "ftp://user:s3cret@host/x?token=t0ken"}
	data, _ := yaml.Marshal(cfg)
	_, err := ParseConfig(data)
	if err == nil || strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "user") ||
		strings.Contains(err.Error(), "t0ken") || !strings.Contains(err.Error(), `url "ftp://host/x" must be`) {
		t.Fatalf("got %v, want the URL named without userinfo and query", err)
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	data, _ := yaml.Marshal(validConfig())
	if err := os.WriteFile(good, data, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(good)
	if err != nil || len(cfg.Providers) != 1 {
		t.Fatalf("LoadConfig(good) = %+v, %v", cfg, err)
	}

	bad := filepath.Join(dir, "bad.yaml")
	cfg = validConfig()
	cfg.Providers[0].KVM2.Hosts[0].Bridge = ""
	cfg.Providers[0].KVM2.SSHKeyFile = ""
	data, _ = yaml.Marshal(cfg)
	if err := os.WriteFile(bad, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadConfig(bad)
	if err == nil || !strings.HasPrefix(err.Error(), "providers config "+bad+": ") ||
		!strings.Contains(err.Error(), "kvm2.hosts[0]: bridge is required") || !strings.Contains(err.Error(), "kvm2: sshKeyFile is required") {
		t.Fatalf("LoadConfig(bad) = %v", err)
	}

	missing := filepath.Join(dir, "missing.yaml")
	_, err = LoadConfig(missing)
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("LoadConfig(missing) = %v, want a not-exist error naming the path", err)
	}
}
