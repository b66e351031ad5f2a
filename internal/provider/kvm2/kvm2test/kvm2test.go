// Package kvm2test builds a real kvm2 provider over one in-process hypervisor, for the
// tests of other packages (controllers, pools) that want kvm2 itself rather than the
// generic fake provider: go-libvirt's client reaches a libvirtfake.Fake through a
// forwarded socket of an sshtest SSH server, as production reaches libvirtd through sshd.
//
//	h := kvm2test.New(t, "kvm2-home")
//	// h.Provider is the provider of entry "kvm2-home"; a Proxy placed on it uses
//	// Zone h.Host, MachineType kvm2test.MachineType and Image kvm2test.Image.
//
// The host's pool already holds the cached base image of Image (volume and marker), so a
// Create fetches nothing, and each domain the provider starts gets the next address of
// Addresses from the guest agent, so a Get after the Create reports it Running with an
// IP. Everything is closed when the test ends.
package kvm2test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/sshtest"
)

// What the provider's config holds, and the addresses its domains get.
const (
	// HostName is the only host's name: the zone a Proxy's placement names.
	HostName = "hv1"
	// Image is the catalogue entry (qcow2, UEFI) whose base image the host has cached.
	Image = "debian-13"
	// ImageURL is Image's URL; it is never fetched.
	ImageURL = "https://images.example/debian-13-generic-amd64.qcow2"
	// MachineType is the only machine type: 1 vCPU, 1024 MiB.
	MachineType = "small"
	// Addresses is the range the guest agent hands started domains their IPv4 from.
	Addresses = "192.168.122.10/24"
	// imageFormat is Image's format (the catalogue's default).
	imageFormat = "qcow2"
	// digest is what the cached base image's marker records.
	digest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

// Host is a kvm2 provider over one libvirt fake behind an SSH server.
type Host struct {
	// Provider is the kvm2 provider of the providers-config entry Config.
	Provider *kvm2.Provider
	// Config is the entry: type kvm2, one host, Image and MachineType, the SSH server's
	// key and known_hosts files.
	Config provider.ProviderConfig
	// Host names the hypervisor (HostName).
	Host string
	// Fake is the hypervisor's libvirt, for assertions and faults.
	Fake *libvirtfake.Fake
	// SSH is the hypervisor's SSH server.
	SSH *sshtest.Env
}

// New builds the provider named name (type kvm2) over one fresh host, with opts passed
// to its constructor. The provider, the SSH server and the fake are closed when the test
// ends.
func New(t testing.TB, name string, opts ...kvm2.Option) *Host {
	t.Helper()
	f := libvirtfake.New()
	for _, v := range []libvirtfake.VolumeInfo{
		{Name: imagecache.BaseVolName(Image, imageFormat), Format: imageFormat, Capacity: 2 << 30, Allocation: 300 << 20},
		{Name: imagecache.MarkerVolName(Image, imageFormat), Content: []byte(digest)},
	} {
		if err := f.PutVolume(libvirtfake.DefaultPool, v); err != nil {
			t.Fatal(err)
		}
	}
	f.AssignAddresses(libvirt.DomainInterfaceAddressesSrcAgent, netip.MustParsePrefix(Addresses))
	env := sshtest.NewEnv(t, f.ServeConn)
	cfg := provider.KVMConfig{
		SSHKeyFile: env.KeyFile, KnownHostsFile: env.KnownHostsFile,
		Images:       map[string]provider.KVMImage{Image: {URL: ImageURL}},
		MachineTypes: map[string]provider.KVMMachineType{MachineType: {VCPUs: 1, MemoryMiB: 1024}},
		Hosts:        []provider.KVMHost{{Name: HostName, Address: env.Addr, User: env.User, Socket: env.Socket, Bridge: "br0"}},
	}.WithDefaults()
	pc := provider.ProviderConfig{Name: name, Type: provider.TypeKVM2, KVM2: &cfg}
	p, err := kvm2.New(pc, logr.Discard(), opts...)
	if err != nil {
		t.Fatalf("building kvm2 provider %s: %v", name, err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return &Host{Provider: p, Config: pc, Host: HostName, Fake: f, SSH: env}
}

// Domains names every domain defined on the host, sorted.
func (h *Host) Domains() []string {
	var names []string
	for _, d := range h.Fake.Domains() {
		names = append(names, d.Name)
	}
	return names
}

// Volumes names the volumes of the host's pool other than the cached base image and its
// marker (the VMs' overlays and seeds), sorted.
func (h *Host) Volumes() []string {
	pool, _ := h.Fake.Pool(libvirtfake.DefaultPool)
	base := []string{imagecache.BaseVolName(Image, imageFormat), imagecache.MarkerVolName(Image, imageFormat)}
	return slices.DeleteFunc(pool.Volumes, func(v string) bool { return slices.Contains(base, v) })
}
