package kvm2

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
)

const (
	testImageURL = "https://images.example/debian-13-generic-amd64.qcow2"
	testDigest   = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	testUserData = "#cloud-config\nwrite_files: [{path: /etc/secret, content: s3cr3t-user-data}]\n"
)

// providerEnv is a kvm2 provider whose hosts are in-memory libvirt fakes, one per host.
type providerEnv struct {
	p     *Provider
	fakes map[string]*libvirtfake.Fake
	logs  *logSink

	mu    sync.Mutex
	dials map[string]int
}

// fakeHost is the first host of every env.
const fakeHost = "h1"

// newProviderEnv builds a provider over hosts (default one host, h1), each host with
// its own fake holding the debian-13 base image and its marker.
func newProviderEnv(t testing.TB, hostNames ...string) *providerEnv {
	t.Helper()
	if len(hostNames) == 0 {
		hostNames = []string{fakeHost}
	}
	cfg := testHostConfig(hostNames...)
	cfg.Images = map[string]provider.KVMImage{"debian-13": {URL: testImageURL}, "legacy": {URL: testImageURL + ".raw", Format: "raw", Firmware: "bios"}}
	cfg.MachineTypes = map[string]provider.KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 1024}}
	env := &providerEnv{fakes: map[string]*libvirtfake.Fake{}, dials: map[string]int{}}
	var log logr.Logger
	env.logs, log = newLogSink(2)
	p, err := New(provider.ProviderConfig{Name: "kvm2-test", Type: provider.TypeKVM2, KVM2: &cfg}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.hosts.budgets = testBudgets
	p.runningPoll = 5 * time.Millisecond
	p.runningWait = 2 * time.Second
	for _, h := range hostNames {
		f := libvirtfake.New()
		putBase(t, f, "debian-13", "qcow2")
		env.fakes[h] = f
	}
	p.hosts.dial = func(ctx context.Context, h provider.KVMHost) (*conn, error) {
		env.mu.Lock()
		env.dials[h.Name]++
		env.mu.Unlock()
		return newConn(h.Name, env.fakes[h.Name], nil), nil
	}
	env.p = p
	return env
}

// putBase places a complete cached base image (volume plus marker) in the default pool.
func putBase(t testing.TB, f *libvirtfake.Fake, key, format string) {
	t.Helper()
	if err := f.PutVolume(libvirtfake.DefaultPool, libvirtfake.VolumeInfo{Name: baseVolName(key, format), Format: format, Capacity: 2 << 30, Allocation: 300 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := f.PutVolume(libvirtfake.DefaultPool, libvirtfake.VolumeInfo{Name: markerVolName(key, format), Content: []byte(testDigest)}); err != nil {
		t.Fatal(err)
	}
}

func (e *providerEnv) fake() *libvirtfake.Fake { return e.fakes[fakeHost] }

func (e *providerEnv) totalDials() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, d := range e.dials {
		n += d
	}
	return n
}

// testRequest is a valid CreateRequest for name on the only host.
func testRequest(name string) provider.CreateRequest {
	return provider.CreateRequest{
		Name: name, UID: "uid-" + name,
		Placement: provider.Placement{MachineType: "small", Image: "debian-13"},
		CloudInit: []byte(testUserData), Port: 3128,
	}
}

// defineForeign defines (and optionally starts) a domain of name carrying metadata meta
// (none when empty), as another tool or an admin would have.
func defineForeign(t *testing.T, f *libvirtfake.Fake, name, meta string, start bool) {
	t.Helper()
	doc := "<domain type=\"kvm\"><name>" + name + "</name>"
	if meta != "" {
		doc += "<metadata>" + meta + "</metadata>"
	}
	doc += "<memory unit=\"MiB\">512</memory><vcpu>1</vcpu><os><type arch=\"x86_64\" machine=\"q35\">hvm</type></os></domain>"
	dom, err := f.DomainDefineXMLFlags(doc, 0)
	if err != nil {
		t.Fatal(err)
	}
	if start {
		if err := f.DomainCreate(dom); err != nil {
			t.Fatal(err)
		}
	}
	f.ResetCalls()
}

func markFor(t *testing.T, ns, uid string) string {
	t.Helper()
	return must(marshalMetadata(ns, mark{UID: uid, CreatedAt: time.Date(2026, 9, 16, 17, 42, 11, 0, time.UTC)}))
}

// stateOf returns the fake's state of domain name, or -1 when it does not exist.
func stateOf(f *libvirtfake.Fake, name string) libvirt.DomainState {
	d, ok := f.Domain(name)
	if !ok {
		return -1
	}
	return d.State
}
