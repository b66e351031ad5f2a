package provider

// KVMConfig is the block of a kvm2 (or kvm) provider entry. Both types share it, so their
// fields, defaults and validation are the same; messages name the block the entry used.
type KVMConfig struct {
	// SSHKeyFile is the private key used for every host (OpenSSH or PEM), read on every dial.
	SSHKeyFile string `json:"sshKeyFile"`
	// KnownHostsFile verifies host keys; required unless InsecureIgnoreHostKey.
	KnownHostsFile string `json:"knownHostsFile,omitempty"`
	// InsecureIgnoreHostKey skips host-key verification entirely.
	InsecureIgnoreHostKey bool `json:"insecureIgnoreHostKey,omitempty"`
	// DiskSizeGb is the capacity of each VM's overlay disk (default 10).
	DiskSizeGb int `json:"diskSizeGb,omitempty"`
	// VendorData is extra cloud-init vendor-data placed on every seed.
	VendorData string `json:"vendorData,omitempty"`
	// InstallGuestAgent adds the vendor-data script that installs qemu-guest-agent
	// (default true).
	InstallGuestAgent *bool `json:"installGuestAgent,omitempty"`
	// Images is the image catalogue, keyed by the name placement.image uses.
	Images map[string]KVMImage `json:"images,omitempty"`
	// MachineTypes are the size profiles, keyed by the name placement.machineType uses.
	MachineTypes map[string]KVMMachineType `json:"machineTypes,omitempty"`
	// Hosts are the hypervisors; hosts[].name is what placement.zone selects.
	Hosts []KVMHost `json:"hosts,omitempty"`
}

// KVMImage is one catalogue entry.
type KVMImage struct {
	URL      string `json:"url"`
	SHA256   string `json:"sha256,omitempty"`
	Format   string `json:"format,omitempty"`   // qcow2 (default) or raw
	Firmware string `json:"firmware,omitempty"` // uefi (default) or bios
}

// KVMMachineType is a size profile.
type KVMMachineType struct {
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memoryMiB"`
}

// KVMHost is one hypervisor reached over SSH.
type KVMHost struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	User    string `json:"user"`
	Socket  string `json:"socket,omitempty"` // default /var/run/libvirt/libvirt-sock
	Pool    string `json:"pool,omitempty"`   // default "default"
	Bridge  string `json:"bridge"`
	// DomainType is kvm (default: hardware virtualisation, host-passthrough CPU) or qemu
	// (TCG emulation for hosts without /dev/kvm: domain type qemu, CPU mode maximum).
	DomainType string `json:"domainType,omitempty"`
}

// Defaults of the KVMConfig block.
const (
	DefaultDiskSizeGb  = 10
	DefaultSocket      = "/var/run/libvirt/libvirt-sock"
	DefaultPool        = "default"
	DefaultImageFormat = "qcow2"
	DefaultFirmware    = "uefi"
	DefaultDomainType  = "kvm"
)

// WithDefaults returns a copy of c with every unset field at its default. The maps and
// the hosts slice are copied, so the result can be changed without touching c.
func (c KVMConfig) WithDefaults() KVMConfig {
	out := c
	if out.DiskSizeGb == 0 {
		out.DiskSizeGb = DefaultDiskSizeGb
	}
	if out.InstallGuestAgent == nil {
		t := true
		out.InstallGuestAgent = &t
	}
	out.Images = make(map[string]KVMImage, len(c.Images))
	for k, img := range c.Images {
		if img.Format == "" {
			img.Format = DefaultImageFormat
		}
		if img.Firmware == "" {
			img.Firmware = DefaultFirmware
		}
		out.Images[k] = img
	}
	out.MachineTypes = make(map[string]KVMMachineType, len(c.MachineTypes))
	for k, mt := range c.MachineTypes {
		out.MachineTypes[k] = mt
	}
	out.Hosts = make([]KVMHost, len(c.Hosts))
	for i, h := range c.Hosts {
		if h.Socket == "" {
			h.Socket = DefaultSocket
		}
		if h.Pool == "" {
			h.Pool = DefaultPool
		}
		if h.DomainType == "" {
			h.DomainType = DefaultDomainType
		}
		out.Hosts[i] = h
	}
	return out
}

// GuestAgent reports whether the guest-agent vendor-data script is to be added.
func (c KVMConfig) GuestAgent() bool { return c.InstallGuestAgent == nil || *c.InstallGuestAgent }
