package kvm2

import (
	"encoding/xml"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

func testDomainSpec(t *testing.T, domainType, firmware string) domainSpec {
	t.Helper()
	meta, err := ident.MarshalMark(metadataURI, ident.Mark{UID: "0f3a9c1e-uid", CreatedAt: time.Date(2026, 9, 16, 17, 42, 11, 0, time.UTC),
		Install: "5c1b7a2e-install", SpecHash: "9d4e1f0a"})
	if err != nil {
		t.Fatal(err)
	}
	return domainSpec{
		Name: "proxy-0123456789abcdef", DomainType: domainType, VCPUs: 2, MemoryMiB: 1024, Firmware: firmware,
		OverlayPath: "/var/lib/libvirt/images/proxy-0123456789abcdef.qcow2",
		SeedPath:    "/var/lib/libvirt/images/proxy-0123456789abcdef-seed.iso",
		Bridge:      "br0", Metadata: meta,
	}
}

// TestBuildDomainXML compares the four variants with their golden files and checks the
// properties a VM depends on, so a regenerated golden cannot hide a lost device.
func TestBuildDomainXML(t *testing.T) {
	for _, domainType := range []string{"kvm", "qemu"} {
		for _, firmware := range []string{"uefi", "bios"} {
			t.Run(domainType+"-"+firmware, func(t *testing.T) {
				out, err := buildDomainXML(testDomainSpec(t, domainType, firmware))
				if err != nil {
					t.Fatal(err)
				}
				testutil.Golden(t, "domain-"+domainType+"-"+firmware+".xml", out)
				checkDomain(t, out, domainType, firmware)
			})
		}
	}
}

func checkDomain(t *testing.T, out, domainType, firmware string) {
	t.Helper()
	var d domainXML
	if err := xml.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("domain xml does not parse: %v", err)
	}
	wantCPU := map[string]string{"kvm": "host-passthrough", "qemu": "maximum"}[domainType]
	if d.Type != domainType || d.CPU.Mode != wantCPU {
		t.Errorf("domain type %q cpu %q, want %q %q", d.Type, d.CPU.Mode, domainType, wantCPU)
	}
	if d.OS.Type.Machine != "q35" || d.OS.Type.Value != "hvm" || d.Features.ACPI == nil || d.Features.APIC == nil {
		t.Errorf("os/features: %+v %+v", d.OS, d.Features)
	}
	if d.Memory.Unit != "MiB" || d.Memory.Value != 1024 || d.VCPU != 2 {
		t.Errorf("memory %+v vcpu %d", d.Memory, d.VCPU)
	}
	switch firmware {
	case "uefi":
		if d.OS.Firmware != "efi" || d.OS.FirmwareInfo == nil || len(d.OS.FirmwareInfo.Features) != 1 ||
			d.OS.FirmwareInfo.Features[0] != (domainFirmwareFeature{Enabled: "no", Name: "secure-boot"}) {
			t.Errorf("uefi os: %+v", d.OS)
		}
	case "bios":
		if d.OS.Firmware != "" || d.OS.FirmwareInfo != nil || strings.Contains(out, "efi") {
			t.Errorf("bios domain mentions efi: %+v", d.OS)
		}
	}
	dev := d.Devices
	if len(dev.Disks) != 2 {
		t.Fatalf("disks: %+v", dev.Disks)
	}
	vda, sda := dev.Disks[0], dev.Disks[1]
	if vda.Type != "file" || vda.Device != "disk" || vda.Target != (domainDiskTgt{Dev: "vda", Bus: "virtio"}) ||
		vda.Driver.Type != "qcow2" || vda.Source.File != "/var/lib/libvirt/images/proxy-0123456789abcdef.qcow2" || vda.ReadOnly != nil {
		t.Errorf("overlay disk: %+v", vda)
	}
	if sda.Type != "file" || sda.Device != "cdrom" || sda.Target != (domainDiskTgt{Dev: "sda", Bus: "sata"}) ||
		sda.Driver.Type != "raw" || sda.Source.File != "/var/lib/libvirt/images/proxy-0123456789abcdef-seed.iso" || sda.ReadOnly == nil {
		t.Errorf("seed disk: %+v", sda)
	}
	if len(dev.Interfaces) != 1 || dev.Interfaces[0].Type != "bridge" || dev.Interfaces[0].Source.Bridge != "br0" ||
		dev.Interfaces[0].Model.Type != "virtio" {
		t.Errorf("interfaces: %+v", dev.Interfaces)
	}
	if len(dev.Serials) != 1 || dev.Serials[0].Type != "pty" || len(dev.Consoles) != 1 || dev.Consoles[0].Target.Type != "serial" {
		t.Errorf("serial/console: %+v %+v", dev.Serials, dev.Consoles)
	}
	if len(dev.Channels) != 1 || dev.Channels[0].Type != "unix" ||
		dev.Channels[0].Target != (domainChannelTgt{Type: "virtio", Name: "org.qemu.guest_agent.0"}) {
		t.Errorf("channels: %+v", dev.Channels)
	}
	if len(dev.RNGs) != 1 || dev.RNGs[0].Model != "virtio" || dev.RNGs[0].Backend != (domainRNGBackend{Model: "random", Path: "/dev/urandom"}) {
		t.Errorf("rng: %+v", dev.RNGs)
	}
	if strings.Contains(out, "<graphics") || strings.Contains(out, "<video") {
		t.Errorf("domain has graphics")
	}
	// The mark must survive inside <metadata> in its own namespace.
	var probe struct {
		Metadata struct {
			Inner string `xml:",innerxml"`
		} `xml:"metadata"`
	}
	if err := xml.Unmarshal([]byte(out), &probe); err != nil {
		t.Fatal(err)
	}
	m, err := ident.ParseMark(metadataURI, strings.TrimSpace(probe.Metadata.Inner))
	if err != nil || m.UID != "0f3a9c1e-uid" {
		t.Errorf("metadata element: %+v %v in %q", m, err, probe.Metadata.Inner)
	}
}

func TestBuildDomainXMLRejectsUnknownValues(t *testing.T) {
	s := testDomainSpec(t, "xen", "uefi")
	if _, err := buildDomainXML(s); err == nil || !strings.Contains(err.Error(), `unknown domain type "xen"`) {
		t.Errorf("domain type xen: %v", err)
	}
	s = testDomainSpec(t, "kvm", "coreboot")
	if _, err := buildDomainXML(s); err == nil || !strings.Contains(err.Error(), `unknown firmware "coreboot"`) {
		t.Errorf("firmware coreboot: %v", err)
	}
}
