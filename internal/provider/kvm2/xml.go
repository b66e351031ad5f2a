package kvm2

import (
	"encoding/xml"
	"fmt"
)

// domainSpec is everything the domain XML is built from.
type domainSpec struct {
	Name string
	// UUID, when set, is the UUID of the domain's claim, which this definition replaces.
	UUID string
	// DomainType is kvm (hardware virtualisation) or qemu (TCG, for hosts without /dev/kvm).
	DomainType string
	VCPUs      int
	MemoryMiB  int
	// Firmware is uefi or bios.
	Firmware string
	// OverlayPath and SeedPath are what StorageVolGetPath returned for the two volumes.
	OverlayPath string
	SeedPath    string
	Bridge      string
	// Metadata is the marshalled mark (ident.MarshalMark).
	Metadata string
}

// The structs below are the subset of libvirt's domain XML the provider writes.

type domainXML struct {
	XMLName  xml.Name      `xml:"domain"`
	Type     string        `xml:"type,attr"`
	Name     string        `xml:"name"`
	UUID     string        `xml:"uuid,omitempty"`
	Metadata *innerXML     `xml:"metadata,omitempty"`
	Memory   domainMemory  `xml:"memory"`
	VCPU     int           `xml:"vcpu"`
	OS       domainOS      `xml:"os"`
	Features domainFeature `xml:"features"`
	CPU      domainCPU     `xml:"cpu"`
	Clock    domainClock   `xml:"clock"`
	OnPower  string        `xml:"on_poweroff"`
	OnReboot string        `xml:"on_reboot"`
	OnCrash  string        `xml:"on_crash"`
	Devices  domainDevices `xml:"devices"`
}

type innerXML struct {
	Inner string `xml:",innerxml"`
}

type domainMemory struct {
	Unit  string `xml:"unit,attr"`
	Value int    `xml:",chardata"`
}

type domainOS struct {
	Firmware     string          `xml:"firmware,attr,omitempty"`
	Type         domainOSType    `xml:"type"`
	FirmwareInfo *domainFirmware `xml:"firmware,omitempty"`
	Boot         domainBoot      `xml:"boot"`
}

type domainOSType struct {
	Arch    string `xml:"arch,attr"`
	Machine string `xml:"machine,attr"`
	Value   string `xml:",chardata"`
}

type domainFirmware struct {
	Features []domainFirmwareFeature `xml:"feature"`
}

type domainFirmwareFeature struct {
	Enabled string `xml:"enabled,attr"`
	Name    string `xml:"name,attr"`
}

type domainBoot struct {
	Dev string `xml:"dev,attr"`
}

type domainFeature struct {
	ACPI *struct{} `xml:"acpi"`
	APIC *struct{} `xml:"apic"`
}

type domainCPU struct {
	Mode string `xml:"mode,attr"`
}

type domainClock struct {
	Offset string `xml:"offset,attr"`
}

type domainDevices struct {
	Disks      []domainDisk    `xml:"disk"`
	Interfaces []domainIface   `xml:"interface"`
	Serials    []domainChar    `xml:"serial"`
	Consoles   []domainChar    `xml:"console"`
	Channels   []domainChannel `xml:"channel"`
	RNGs       []domainRNG     `xml:"rng"`
}

type domainDisk struct {
	Type     string        `xml:"type,attr"`
	Device   string        `xml:"device,attr"`
	Driver   domainDriver  `xml:"driver"`
	Source   domainDiskSrc `xml:"source"`
	Target   domainDiskTgt `xml:"target"`
	ReadOnly *struct{}     `xml:"readonly"`
}

type domainDriver struct {
	Name string `xml:"name,attr"`
	Type string `xml:"type,attr"`
}

type domainDiskSrc struct {
	File string `xml:"file,attr"`
}

type domainDiskTgt struct {
	Dev string `xml:"dev,attr"`
	Bus string `xml:"bus,attr"`
}

type domainIface struct {
	Type   string      `xml:"type,attr"`
	Source domainIfSrc `xml:"source"`
	Model  domainModel `xml:"model"`
}

type domainIfSrc struct {
	Bridge string `xml:"bridge,attr"`
}

type domainModel struct {
	Type string `xml:"type,attr"`
}

type domainChar struct {
	Type   string        `xml:"type,attr"`
	Target domainCharTgt `xml:"target"`
}

type domainCharTgt struct {
	Type string `xml:"type,attr,omitempty"`
	Port *int   `xml:"port,attr"`
}

type domainChannel struct {
	Type   string           `xml:"type,attr"`
	Target domainChannelTgt `xml:"target"`
}

type domainChannelTgt struct {
	Type string `xml:"type,attr"`
	Name string `xml:"name,attr"`
}

type domainRNG struct {
	Model   string           `xml:"model,attr"`
	Backend domainRNGBackend `xml:"backend"`
}

type domainRNGBackend struct {
	Model string `xml:"model,attr"`
	Path  string `xml:",chardata"`
}

// buildDomainXML renders the VM: a q35 machine with ACPI and APIC, the overlay on vda
// (virtio) and the seed as a read-only SATA cdrom on sda, one virtio NIC on the bridge, a
// serial console on a pty, the guest-agent channel, a virtio RNG and no graphics.
//
// Both disks are type="file" with the paths StorageVolGetPath returned rather than
// type="volume": AppArmor builds QEMU's profile from file paths, and volume disks are
// refused with permission denied on stock Debian and Ubuntu hosts.
func buildDomainXML(s domainSpec) (string, error) {
	cpu := "host-passthrough"
	switch s.DomainType {
	case "kvm":
	case "qemu":
		// TCG cannot pass the host CPU through; "maximum" still boots distros built for
		// x86-64-v2, which the default qemu64 model would not.
		cpu = "maximum"
	default:
		return "", fmt.Errorf("domain %s: unknown domain type %q (want kvm or qemu)", s.Name, s.DomainType)
	}
	os := domainOS{
		Type: domainOSType{Arch: "x86_64", Machine: "q35", Value: "hvm"},
		Boot: domainBoot{Dev: "hd"},
	}
	switch s.Firmware {
	case "uefi":
		// libvirt picks the OVMF binary and gives the domain its own NVRAM copy.
		os.Firmware = "efi"
		os.FirmwareInfo = &domainFirmware{Features: []domainFirmwareFeature{{Enabled: "no", Name: "secure-boot"}}}
	case "bios":
	default:
		return "", fmt.Errorf("domain %s: unknown firmware %q (want uefi or bios)", s.Name, s.Firmware)
	}
	port0 := 0
	d := domainXML{
		Type:     s.DomainType,
		Name:     s.Name,
		UUID:     s.UUID,
		Memory:   domainMemory{Unit: "MiB", Value: s.MemoryMiB},
		VCPU:     s.VCPUs,
		OS:       os,
		Features: domainFeature{ACPI: &struct{}{}, APIC: &struct{}{}},
		CPU:      domainCPU{Mode: cpu},
		Clock:    domainClock{Offset: "utc"},
		OnPower:  "destroy",
		OnReboot: "restart",
		OnCrash:  "destroy",
		Devices: domainDevices{
			Disks: []domainDisk{{
				Type: "file", Device: "disk",
				Driver: domainDriver{Name: "qemu", Type: "qcow2"},
				Source: domainDiskSrc{File: s.OverlayPath},
				Target: domainDiskTgt{Dev: "vda", Bus: "virtio"},
			}, {
				Type: "file", Device: "cdrom",
				Driver:   domainDriver{Name: "qemu", Type: "raw"},
				Source:   domainDiskSrc{File: s.SeedPath},
				Target:   domainDiskTgt{Dev: "sda", Bus: "sata"},
				ReadOnly: &struct{}{},
			}},
			Interfaces: []domainIface{{
				Type: "bridge", Source: domainIfSrc{Bridge: s.Bridge}, Model: domainModel{Type: "virtio"},
			}},
			Serials:  []domainChar{{Type: "pty", Target: domainCharTgt{Port: &port0}}},
			Consoles: []domainChar{{Type: "pty", Target: domainCharTgt{Type: "serial", Port: &port0}}},
			Channels: []domainChannel{{
				Type: "unix", Target: domainChannelTgt{Type: "virtio", Name: "org.qemu.guest_agent.0"},
			}},
			RNGs: []domainRNG{{Model: "virtio", Backend: domainRNGBackend{Model: "random", Path: "/dev/urandom"}}},
		},
	}
	if s.Metadata != "" {
		d.Metadata = &innerXML{Inner: s.Metadata}
	}
	out, err := xml.MarshalIndent(d, "", "  ")
	if err != nil {
		return "", fmt.Errorf("encoding domain xml for %s: %w", s.Name, err)
	}
	return string(out) + "\n", nil
}

// buildClaimXML renders the claim of domain name: a domain of the host's domainType that
// carries the mark meta and nothing else, no disks, no NIC. Defining it is atomic on the
// name (libvirt refuses a second domain of a name), so whoever defines it owns the name
// and may create and delete the volumes of that name; the full definition replaces it
// under the same UUID. It is never started.
func buildClaimXML(name, domainType, meta string) (string, error) {
	switch domainType {
	case "kvm", "qemu":
	default:
		return "", fmt.Errorf("domain %s: unknown domain type %q (want kvm or qemu)", name, domainType)
	}
	d := domainXML{
		Type:     domainType,
		Name:     name,
		Metadata: &innerXML{Inner: meta},
		Memory:   domainMemory{Unit: "MiB", Value: 128},
		VCPU:     1,
		OS:       domainOS{Type: domainOSType{Arch: "x86_64", Machine: "q35", Value: "hvm"}, Boot: domainBoot{Dev: "hd"}},
		CPU:      domainCPU{Mode: "host-passthrough"},
		Clock:    domainClock{Offset: "utc"},
		OnPower:  "destroy",
		OnReboot: "destroy",
		OnCrash:  "destroy",
	}
	if domainType == "qemu" {
		d.CPU.Mode = "maximum"
	}
	out, err := xml.MarshalIndent(d, "", "  ")
	if err != nil {
		return "", fmt.Errorf("encoding claim xml for %s: %w", name, err)
	}
	return string(out) + "\n", nil
}
