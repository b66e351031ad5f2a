package provider

import (
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
)

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
	// Images is the image catalogue, keyed by the name placement.image uses. Its URLs are
	// the cluster admin's and are fetched as they are.
	Images map[string]KVMImage `json:"images,omitempty"`
	// AllowedImageURLPrefixes limits the URLs a Proxy gives in placement.image, which are
	// the tenant's: when set, only URLs under one of these prefixes are fetched (an empty
	// list admits none, so placement.image must be a catalogue key); when absent, any
	// http(s) URL is, but never from a loopback, link-local, unspecified or cloud metadata
	// address. A pointer, so that absent and empty differ.
	AllowedImageURLPrefixes *[]string `json:"allowedImageURLPrefixes,omitempty"`
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

// WithDefaults returns a copy of c with every unset field at its default. The maps, the
// prefix list and the hosts slice are copied, so the result can be changed without touching c.
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
		// Validation accepts either case; digests are compared in lower case.
		img.SHA256 = strings.ToLower(img.SHA256)
		out.Images[k] = img
	}
	if c.AllowedImageURLPrefixes != nil {
		prefixes := slices.Clone(*c.AllowedImageURLPrefixes)
		if prefixes == nil {
			prefixes = []string{}
		}
		out.AllowedImageURLPrefixes = &prefixes
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

// ImageURLPrefixes is the allowedImageURLPrefixes list; nil when it is absent. Whether it
// is set at all is AllowedImageURLPrefixes != nil.
func (c KVMConfig) ImageURLPrefixes() []string {
	if c.AllowedImageURLPrefixes == nil {
		return nil
	}
	return *c.AllowedImageURLPrefixes
}

// GuestAgent reports whether the guest-agent vendor-data script is to be added.
func (c KVMConfig) GuestAgent() bool { return c.InstallGuestAgent == nil || *c.InstallGuestAgent }

// Validate checks the block against every field rule and returns all problems in a stable
// order (top-level fields, images by key, allowedImageURLPrefixes in order, machine types
// by key, hosts in order). block is the name the entry used (kvm2 or kvm); every message
// starts with it and the path inside, for example `kvm2.hosts[0]: bridge is required`.
func (c KVMConfig) Validate(block string) []error {
	var problems []error
	add := func(path, format string, args ...any) {
		problems = append(problems, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}
	if c.SSHKeyFile == "" {
		add(block, "sshKeyFile is required")
	}
	if c.KnownHostsFile == "" && !c.InsecureIgnoreHostKey {
		add(block, "knownHostsFile is required unless insecureIgnoreHostKey is true")
	}
	if c.DiskSizeGb < 0 {
		add(block, "diskSizeGb must be at least 1, got %d", c.DiskSizeGb)
	}
	for _, key := range sortedKeys(c.Images) {
		if !validName(key) {
			add(block+".images", "key %q: %s", key, nameChars)
			continue
		}
		for _, msg := range c.Images[key].problems() {
			add(block+".images."+key, "%s", msg)
		}
	}
	for i, prefix := range c.ImageURLPrefixes() {
		if _, err := ParseImageURLPrefix(prefix); err != nil {
			add(fmt.Sprintf("%s.allowedImageURLPrefixes[%d]", block, i), "%s", err)
		}
	}
	if len(c.MachineTypes) == 0 {
		add(block, "machineTypes needs at least one entry")
	}
	for _, key := range sortedKeys(c.MachineTypes) {
		path := block + ".machineTypes." + key
		if key == "" {
			add(block+".machineTypes", "key must not be empty")
			continue
		}
		if mt := c.MachineTypes[key]; mt.VCPUs <= 0 {
			add(path, "vcpus must be greater than zero, got %d", mt.VCPUs)
		}
		if mt := c.MachineTypes[key]; mt.MemoryMiB <= 0 {
			add(path, "memoryMiB must be greater than zero, got %d", mt.MemoryMiB)
		}
	}
	if len(c.Hosts) == 0 {
		add(block, "hosts needs at least one entry")
	}
	seen := map[string]int{}
	for i, h := range c.Hosts {
		path := fmt.Sprintf("%s.hosts[%d]", block, i)
		if j, dup := seen[h.Name]; dup && h.Name != "" {
			add(path, "name %q is already used by %s.hosts[%d]", h.Name, block, j)
		} else if h.Name != "" {
			seen[h.Name] = i
		}
		for _, msg := range h.problems() {
			add(path, "%s", msg)
		}
	}
	return problems
}

const nameChars = "only letters, digits, dots, dashes and underscores are allowed"

// validName reports whether s is a non-empty string of letters, digits, '.', '-' and '_'.
// Image keys and host names end up in volume names and providerIDs.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_'
		if !ok {
			return false
		}
	}
	return true
}

func (img KVMImage) problems() []string {
	var out []string
	if img.URL == "" {
		out = append(out, "url is required")
	} else if u, err := url.Parse(img.URL); err != nil {
		// The url.Error would repeat the URL, which may carry credentials.
		out = append(out, "url is not a valid URL")
	} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		out = append(out, fmt.Sprintf("url %q must be an http or https URL with a host", RedactURL(img.URL)))
	}
	if img.SHA256 != "" && !isHex64(img.SHA256) {
		out = append(out, fmt.Sprintf("sha256 must be exactly 64 hex characters, got %d characters", len(img.SHA256)))
	}
	switch img.Format {
	case "", "qcow2", "raw":
	default:
		out = append(out, fmt.Sprintf("format must be qcow2 or raw, got %q", img.Format))
	}
	switch img.Firmware {
	case "", "uefi", "bios":
	default:
		out = append(out, fmt.Sprintf("firmware must be uefi or bios, got %q", img.Firmware))
	}
	return out
}

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func (h KVMHost) problems() []string {
	var out []string
	switch {
	case h.Name == "":
		out = append(out, "name is required")
	case !validName(h.Name):
		out = append(out, fmt.Sprintf("name %q: %s", h.Name, nameChars))
	}
	if h.Address == "" {
		out = append(out, "address is required")
	} else if msg := addressProblem(h.Address); msg != "" {
		out = append(out, msg)
	}
	if h.User == "" {
		out = append(out, "user is required")
	}
	if h.Socket != "" && !path.IsAbs(h.Socket) {
		out = append(out, fmt.Sprintf("socket %q must be an absolute path", h.Socket))
	}
	if h.Bridge == "" {
		out = append(out, "bridge is required")
	}
	switch h.DomainType {
	case "", "kvm", "qemu":
	default:
		out = append(out, fmt.Sprintf("domainType must be kvm or qemu, got %q", h.DomainType))
	}
	return out
}

// addressProblem checks a host:port SSH endpoint.
func addressProblem(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return fmt.Sprintf("address %q must be host:port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Sprintf("address %q: port must be a number from 1 to 65535", addr)
	}
	return ""
}
