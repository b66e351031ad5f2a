package kvm2

import (
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/sshtest"
)

const (
	testImageURL = "https://images.example/debian-13-generic-amd64.qcow2"
	testDigest   = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	testUserData = "#cloud-config\nwrite_files: [{path: /etc/secret, content: s3cr3t-user-data}]\n"
)

// testEnv is a kvm2 provider over hypervisors that are libvirt fakes, one fake per host,
// reached in memory or, with withSSH, the way production reaches them: go-libvirt
// through a forwarded socket of a real SSH server (sshtest) into the fake's wire protocol.
// Every test of this package builds its hosts with newTestEnv; tests of the connection
// layer use e.hs, the provider's own hosts.
type testEnv struct {
	p     *Provider
	hs    *hosts // p.hosts
	cfg   provider.KVMConfig
	fakes map[string]*libvirtfake.Fake
	fake  *libvirtfake.Fake // the first host's
	host  string            // the first host's name
	logs  *logSink
	d     *memDialer       // the in-memory dialer (nil with withSSH)
	ssh   *sshtest.Env     // the SSH server of the first host (withSSH), or nil
	srv   *imageServer     // the image server (withImageServer), or nil
	img   imagecache.Image // debian-13 resolved from the catalogue
}

// envConfig is what the options set; newTestEnv builds from it.
type envConfig struct {
	hosts      []string
	typ, name  string
	verbosity  int
	ssh        bool
	emptyPools bool
	imageSHA   func(digest string) string
	imageSrv   bool
	opts       []Option
}

// envOption changes what newTestEnv builds.
type envOption func(t testing.TB, c *envConfig)

// withHosts names the hosts, in config order (default one host, h1).
func withHosts(names ...string) envOption {
	return func(_ testing.TB, c *envConfig) {
		if len(names) > 0 {
			c.hosts = names
		}
	}
}

// withTestHost is one host named prefix-<test name>, so that the spans and metrics the
// package collects across tests are told apart by host.
func withTestHost(prefix string) envOption {
	return func(t testing.TB, c *envConfig) {
		c.hosts = []string{prefix + "-" + strings.NewReplacer("/", "-", "#", "-").Replace(t.Name())}
	}
}

// withType builds a provider of type typ (kvm2 unless set) on the same code, named
// typ-test.
func withType(typ string) envOption { return func(_ testing.TB, c *envConfig) { c.typ = typ } }

// withName names the provider (default <type>-test).
func withName(name string) envOption { return func(_ testing.TB, c *envConfig) { c.name = name } }

// withLogVerbosity sets the verbosity up to which e.logs collects lines (default 2).
func withLogVerbosity(v int) envOption { return func(_ testing.TB, c *envConfig) { c.verbosity = v } }

// withProviderOptions passes opts to the provider's constructor (WithInstallID).
func withProviderOptions(opts ...Option) envOption {
	return func(_ testing.TB, c *envConfig) { c.opts = append(c.opts, opts...) }
}

// withSSH reaches every host over SSH: one sshtest server per host, all accepting the
// same key, each forwarding the libvirt socket to its host's fake.
func withSSH() envOption { return func(_ testing.TB, c *envConfig) { c.ssh = true } }

// withEmptyPools leaves every pool empty; by default each holds the cached debian-13
// base image and its marker.
func withEmptyPools() envOption { return func(_ testing.TB, c *envConfig) { c.emptyPools = true } }

// withImageServer serves debian-13 from an in-process image server (e.srv) that no
// host has cached yet. sha, when set, makes the catalogue's sha256 from the body's digest.
func withImageServer(sha func(digest string) string) envOption {
	return func(_ testing.TB, c *envConfig) { c.imageSrv, c.imageSHA, c.emptyPools = true, sha, true }
}

// fakeHost is the first host of an env built without withHosts or withTestHost.
const fakeHost = "h1"

// newTestEnv builds the env: a fake per host, the provider of the catalogue debian-13
// (and a raw, BIOS image "legacy") and machine type small, with testBudgets and a
// Running wait polled every 5 ms for at most 2 s. It is closed when the test ends.
func newTestEnv(t testing.TB, opts ...envOption) *testEnv {
	t.Helper()
	c := envConfig{hosts: []string{fakeHost}, typ: provider.TypeKVM2, verbosity: 2}
	for _, o := range opts {
		o(t, &c)
	}
	if c.name == "" {
		c.name = c.typ + "-test"
	}
	e := &testEnv{fakes: map[string]*libvirtfake.Fake{}, host: c.hosts[0]}
	for _, h := range c.hosts {
		f := libvirtfake.New()
		if !c.emptyPools {
			putBase(t, f, "debian-13", "qcow2")
		}
		e.fakes[h] = f
	}
	e.fake = e.fakes[e.host]
	cfg := testHostConfig(c.hosts...)
	cfg.Images = map[string]provider.KVMImage{"debian-13": {URL: testImageURL}, "legacy": {URL: testImageURL + ".raw", Format: "raw", Firmware: "bios"}}
	cfg.MachineTypes = map[string]provider.KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 1024}}
	if c.imageSrv {
		e.srv = newImageServer(t, testImageSize)
		entry := provider.KVMImage{URL: e.srv.url()}
		if c.imageSHA != nil {
			entry.SHA256 = c.imageSHA(e.srv.digest)
		}
		cfg.Images["debian-13"] = entry
	}
	if c.ssh {
		for i := range cfg.Hosts {
			h := &cfg.Hosts[i]
			if i == 0 {
				e.ssh = sshtest.NewEnv(t, e.fakes[h.Name].ServeConn)
				h.Address = e.ssh.Addr
			} else {
				h.Address = e.ssh.AddHost(t, e.fakes[h.Name].ServeConn).Addr()
			}
			h.User, h.Socket = e.ssh.User, e.ssh.Socket
		}
		cfg.SSHKeyFile, cfg.KnownHostsFile = e.ssh.KeyFile, e.ssh.KnownHostsFile
	}
	e.cfg = cfg.WithDefaults()
	e.logs, e.p = e.newProvider(t, c.typ, c.name, c.verbosity, c.opts...)
	if !c.ssh {
		e.d = &memDialer{fakes: e.fakes}
		e.p.hosts.dial = e.d.dial
	}
	e.hs = e.p.hosts
	e.img = must(imagecache.Resolve(c.typ, e.cfg.Images, "debian-13"))
	return e
}

// newProvider builds a provider of type typ named name on the env's config, logging up to
// verbosity into its own sink.
func (e *testEnv) newProvider(t testing.TB, typ, name string, verbosity int, opts ...Option) (*logSink, *Provider) {
	t.Helper()
	cfg := e.cfg
	pc := provider.ProviderConfig{Name: name, Type: typ}
	if typ == provider.TypeKVM {
		pc.KVM = &cfg
	} else {
		pc.KVM2 = &cfg
	}
	logs, log := newLogSink(verbosity)
	p, err := NewOfType(pc, typ, log, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.hosts.budgets = testBudgets
	p.runningPoll = 5 * time.Millisecond
	p.runningWait = 2 * time.Second
	return logs, p
}

// beside builds another provider of type typ, named name, on the env's hosts and fakes,
// as a second providers-config entry naming the same hypervisors would be.
func (e *testEnv) beside(t testing.TB, typ, name string, opts ...Option) *Provider {
	t.Helper()
	p, _ := e.besideLogged(t, typ, name, opts...)
	return p
}

// besideLogged is beside that also returns the provider's own log sink.
func (e *testEnv) besideLogged(t testing.TB, typ, name string, opts ...Option) (*Provider, *logSink) {
	t.Helper()
	logs, p := e.newProvider(t, typ, name, 2, opts...)
	p.runningPoll, p.runningWait = e.p.runningPoll, e.p.runningWait
	p.hosts.dial = e.p.hosts.dial
	return p, logs
}

// putBase places a complete cached base image (volume plus marker) in the default pool.
func putBase(t testing.TB, f *libvirtfake.Fake, key, format string) {
	t.Helper()
	if err := f.PutVolume(libvirtfake.DefaultPool, libvirtfake.VolumeInfo{Name: imagecache.BaseVolName(key, format), Format: format, Capacity: 2 << 30, Allocation: 300 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := f.PutVolume(libvirtfake.DefaultPool, libvirtfake.VolumeInfo{Name: imagecache.MarkerVolName(key, format), Content: []byte(testDigest)}); err != nil {
		t.Fatal(err)
	}
}

// totalDials is how many times the provider dialled any host in memory.
func (e *testEnv) totalDials() int { return int(e.d.dials.Load()) }

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
	return must(ident.MarshalMark(ns, ident.Mark{UID: uid, CreatedAt: time.Date(2026, 9, 16, 17, 42, 11, 0, time.UTC)}))
}

// stateOf returns the fake's state of domain name, or -1 when it does not exist.
func stateOf(f *libvirtfake.Fake, name string) libvirt.DomainState {
	d, ok := f.Domain(name)
	if !ok {
		return -1
	}
	return d.State
}
