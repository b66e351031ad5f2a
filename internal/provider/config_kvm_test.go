package provider

import (
	"bytes"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestKVMConfigWithDefaults(t *testing.T) {
	no := false
	in := KVMConfig{
		Images: map[string]KVMImage{
			"plain":    {URL: "https://x/a", SHA256: strings.ToUpper(testSHA)},
			"explicit": {URL: "https://x/b", Format: "raw", Firmware: "bios"},
		},
		MachineTypes: map[string]KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 512}},
		Hosts: []KVMHost{
			{Name: "a"},
			{Name: "b", Socket: "/run/libvirt/libvirt-sock", Pool: "images", DomainType: "qemu"},
		},
	}
	got := in.WithDefaults()

	cases := []struct {
		field string
		got   any
		want  any
	}{
		{"diskSizeGb", got.DiskSizeGb, 10},
		{"installGuestAgent", got.GuestAgent(), true},
		{"images.plain.format", got.Images["plain"].Format, "qcow2"},
		{"images.plain.firmware", got.Images["plain"].Firmware, "uefi"},
		{"images.plain.sha256 (lower-cased)", got.Images["plain"].SHA256, testSHA},
		{"images.explicit.format", got.Images["explicit"].Format, "raw"},
		{"images.explicit.firmware", got.Images["explicit"].Firmware, "bios"},
		{"machineTypes.small", got.MachineTypes["small"], KVMMachineType{VCPUs: 1, MemoryMiB: 512}},
		{"hosts[0].socket", got.Hosts[0].Socket, "/var/run/libvirt/libvirt-sock"},
		{"hosts[0].pool", got.Hosts[0].Pool, "default"},
		{"hosts[0].domainType", got.Hosts[0].DomainType, "kvm"},
		{"hosts[1].socket", got.Hosts[1].Socket, "/run/libvirt/libvirt-sock"},
		{"hosts[1].pool", got.Hosts[1].Pool, "images"},
		{"hosts[1].domainType", got.Hosts[1].DomainType, "qemu"},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.field, c.got, c.want)
		}
	}

	explicit := KVMConfig{DiskSizeGb: 3, InstallGuestAgent: &no}.WithDefaults()
	if explicit.DiskSizeGb != 3 || explicit.GuestAgent() {
		t.Errorf("explicit diskSizeGb/installGuestAgent overridden: %d, %v", explicit.DiskSizeGb, explicit.GuestAgent())
	}

	// The result is a copy: changing it leaves the input alone.
	got.Images["plain"] = KVMImage{}
	got.MachineTypes["small"] = KVMMachineType{}
	got.Hosts[0].Name = "changed"
	if in.Images["plain"].URL == "" || in.MachineTypes["small"].VCPUs != 1 || in.Hosts[0].Name != "a" || in.Hosts[0].Socket != "" {
		t.Fatalf("WithDefaults changed its input: %+v", in)
	}
}

func TestKVMConfigDefaultsPassValidation(t *testing.T) {
	c := validKVM().WithDefaults()
	if errs := c.Validate("kvm2"); len(errs) != 0 {
		t.Fatalf("a defaulted valid block fails validation: %v", errs)
	}
}

//fuzzsmoke:count 10000
func FuzzParseConfig(f *testing.F) {
	base, _ := yaml.Marshal(validConfig())
	f.Add(base)
	f.Add([]byte(""))
	f.Add([]byte("providers: [{name: a, type: kvm, kvm: {sshKeyFile: /k, insecureIgnoreHostKey: true, " +
		"machineTypes: {m: {vcpus: 1, memoryMiB: 1}}, hosts: [{name: h, address: 'h:1', user: u, bridge: b, socket: /s}]}}]\n"))
	f.Add([]byte("providers: [{name: a, type: kvm2, kvm2: {hosts: [{}], images: {'x y': {}}}, kvm: {}}]\nfoo: 1\n"))
	f.Add([]byte("providers:\n- name: a\n  name: b\n"))
	f.Add([]byte(hcloudGood))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			if cfg != nil {
				t.Fatal("ParseConfig returned a config together with an error")
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("a parsed config fails Validate: %v", err)
		}
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatalf("marshal a parsed config: %v", err)
		}
		again, err := ParseConfig(out)
		if err != nil {
			t.Fatalf("a parsed config does not parse again: %v\n%s", err, out)
		}
		out2, _ := yaml.Marshal(again)
		if !bytes.Equal(out, out2) {
			t.Fatalf("round trip changed the config:\n%s\n---\n%s", out, out2)
		}
		for _, pc := range cfg.Providers {
			for _, b := range []*KVMConfig{pc.KVM2, pc.KVM} {
				if b != nil {
					if errs := b.WithDefaults().Validate(pc.Type); len(errs) != 0 {
						t.Fatalf("defaults broke a valid block: %v", errs)
					}
				}
			}
		}
	})
}
