//go:build integration

package kvm2

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
)

// The integration tier drives the provider against the libvirt host hack/libvirt-host.sh
// runs on this machine: libvirtd behind sshd on loopback, a dir pool and a bridge. Its
// env file says where everything is; `make test-integration-kvm2` starts the host and
// sources the file. Every test names what it creates after itself (see names), removes it
// again and checks that the pool holds nothing of it afterwards.

// itRealHost is the libvirt host described by the KVM2_TEST_* variables.
type itRealHost struct {
	addr, user, key, knownHosts, socket string
	pool, poolPath, bridge, domainType  string
	script, sshdPIDFile                 string
}

// integrationHost is the name the tests give the host in the provider config.
const integrationHost = "local"

// itLoadRealHost reads the host's description from the environment. A missing variable
// fails the test: under the integration tag there is nothing to skip to.
func itLoadRealHost(t testing.TB) itRealHost {
	t.Helper()
	get := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			t.Fatalf("%s is not set: the integration tests need the local libvirt host; run `make test-integration-kvm2` "+
				"(it runs hack/libvirt-host.sh up and sources ~/.cache/egress-proxies-operator/libvirt-host/env)", name)
		}
		return v
	}
	return itRealHost{
		addr: get("KVM2_TEST_ADDRESS"), user: get("KVM2_TEST_USER"), key: get("KVM2_TEST_KEY"),
		knownHosts: get("KVM2_TEST_KNOWN_HOSTS"), socket: get("KVM2_TEST_SOCKET"), pool: get("KVM2_TEST_POOL"),
		poolPath: get("KVM2_TEST_POOL_PATH"), bridge: get("KVM2_TEST_BRIDGE"), domainType: get("KVM2_TEST_DOMAIN_TYPE"),
		script: get("KVM2_TEST_HOST_SCRIPT"), sshdPIDFile: get("KVM2_TEST_SSHD_PIDFILE"),
	}
}

// kvmHost is the provider's view of the host, under name.
func (h itRealHost) kvmHost(name string) provider.KVMHost {
	return provider.KVMHost{Name: name, Address: h.addr, User: h.user, Socket: h.socket, Pool: h.pool,
		Bridge: h.bridge, DomainType: h.domainType}
}

// itRunToken tells this run's objects from everyone else's on the shared host.
var itRunToken = func() string {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}()

// itNames are the names of what one test creates: every domain and image key carries the
// test's token, so leftovers are attributable and cleanup never touches anything else.
type itNames struct{ token string }

func itNewNames(short string) itNames { return itNames{token: "epo-it-" + itRunToken + "-" + short} }

// vm is the name of the test's i-th domain.
func (n itNames) vm(i int) string { return fmt.Sprintf("%s-vm%d", n.token, i) }

// image is the catalogue key of the test's image.
func (n itNames) image() string { return n.token + "-img" }

// itRealEnv is a provider over the real host, with credentials copied into the test's own
// directory so that a test may break and rotate them.
type itRealEnv struct {
	t     testing.TB
	host  itRealHost
	names itNames
	dir   string
	key   string // the provider's sshKeyFile
	known string // the provider's knownHostsFile
	img   *itImageServer
	dials atomic.Int64
}

type itEnvOptions struct {
	typ        string // provider type; kvm2 unless set
	diskSizeGb int
	firmware   string
	format     string             // image format; qcow2 unless set
	hosts      []provider.KVMHost // extra hosts after the real one
	imageURL   string             // catalogue URL of names.image(); the env's image server unless set
	installID  string             // WithInstallID; the provider's default unless set
}

// itNewRealEnv loads the host, snapshots the pool for the leak check, starts an image server
// serving a tiny qcow2 and returns the env; newProvider builds providers on it.
func itNewRealEnv(t testing.TB, short string) *itRealEnv {
	t.Helper()
	h := itLoadRealHost(t)
	e := &itRealEnv{t: t, host: h, names: itNewNames(short), dir: t.TempDir()}
	e.key = filepath.Join(e.dir, "id_ed25519")
	e.known = filepath.Join(e.dir, "known_hosts")
	itCopyFile(t, h.key, e.key)
	itCopyFile(t, h.knownHosts, e.known)
	// Cleanups run last-in first-out: the sweep runs after the leak check, which runs
	// after everything the test registered itself.
	t.Cleanup(func() { e.sweep() })
	before := e.poolVolumes()
	t.Cleanup(func() { e.checkNothingLeft(before) })
	e.img = itNewImageServer(t, itTinyQcow2(t))
	return e
}

func (e *itRealEnv) newProvider(o itEnvOptions) *Provider {
	e.t.Helper()
	if o.typ == "" {
		o.typ = provider.TypeKVM2
	}
	if o.firmware == "" {
		o.firmware = "uefi"
	}
	if o.format == "" {
		o.format = "qcow2"
	}
	if o.imageURL == "" {
		o.imageURL = e.img.URL + "/" + e.names.image() + ".qcow2"
	}
	block := provider.KVMConfig{
		SSHKeyFile: e.key, KnownHostsFile: e.known, DiskSizeGb: o.diskSizeGb,
		Images:       map[string]provider.KVMImage{e.names.image(): {URL: o.imageURL, Format: o.format, Firmware: o.firmware}},
		MachineTypes: map[string]provider.KVMMachineType{"tiny": {VCPUs: 1, MemoryMiB: 256}},
		Hosts:        append([]provider.KVMHost{e.host.kvmHost(integrationHost)}, o.hosts...),
	}
	pc := provider.ProviderConfig{Name: o.typ + "-it", Type: o.typ}
	if o.typ == provider.TypeKVM {
		pc.KVM = &block
	} else {
		pc.KVM2 = &block
	}
	log := logr.Discard() // a benchmark prints its log whether it fails or not
	if _, bench := e.t.(*testing.B); !bench {
		log = itTestLogger(e.t)
	}
	var opts []Option
	if o.installID != "" {
		opts = append(opts, WithInstallID(o.installID))
	}
	p, err := NewOfType(pc, o.typ, log, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { p.Close() })
	dial := p.hosts.dial
	p.hosts.dial = func(ctx context.Context, h provider.KVMHost) (*conn, error) {
		e.dials.Add(1)
		return dial(ctx, h)
	}
	return p
}

// request asks for domain name of the test's image on the real host.
func (e *itRealEnv) request(name, uid string) provider.CreateRequest {
	return provider.CreateRequest{
		Name: name, UID: uid, Port: 3128,
		Placement: provider.Placement{Zone: integrationHost, MachineType: "tiny", Image: e.names.image()},
		CloudInit: []byte("#cloud-config\nhostname: " + name + "\n"),
	}
}

// itTestLogger writes the provider's V(1) lines to the test log, and nothing once the test
// has finished (a connection's watcher may still be winding down).
func itTestLogger(t testing.TB) logr.Logger {
	var done atomic.Bool
	t.Cleanup(func() { done.Store(true) })
	return funcr.New(func(prefix, args string) {
		if !done.Load() {
			t.Log(prefix, args)
		}
	}, funcr.Options{Verbosity: 1})
}

func itCopyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// itVirsh runs virsh against the host's libvirtd (the same daemon the provider reaches
// through sshd) and returns its output.
func itVirsh(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "virsh", append([]string{"-q", "-c", "qemu:///system"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func itMustVirsh(t testing.TB, args ...string) string {
	t.Helper()
	out, err := itVirsh(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// poolVolumes lists the names of the volumes in the test pool.
func (e *itRealEnv) poolVolumes() []string {
	e.t.Helper()
	itMustVirsh(e.t, "pool-refresh", e.host.pool)
	var vols []string
	for _, line := range strings.Split(itMustVirsh(e.t, "vol-list", e.host.pool), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			vols = append(vols, f[0])
		}
	}
	slices.Sort(vols)
	return vols
}

// hasVolume reports whether the pool holds volume name.
func (e *itRealEnv) hasVolume(name string) bool {
	_, err := itVirsh("vol-info", "--pool", e.host.pool, name)
	return err == nil
}

// itDomains lists every domain on the host, running or not.
func itDomains(t testing.TB) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(itMustVirsh(t, "list", "--all", "--name"), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func itHasDomain(name string) bool {
	_, err := itVirsh("dominfo", name)
	return err == nil
}

// checkNothingLeft fails the test when the pool or the host holds anything named after it
// that was not there before. Other users of the shared host may add and remove their own
// volumes meanwhile; those are only logged.
func (e *itRealEnv) checkNothingLeft(before []string) {
	after := e.poolVolumes()
	for _, v := range after {
		if slices.Contains(before, v) {
			continue
		}
		if strings.Contains(v, e.names.token) {
			e.t.Errorf("volume %s was left in pool %s", v, e.host.pool)
		} else {
			e.t.Logf("volume %s appeared in pool %s meanwhile (not this test's)", v, e.host.pool)
		}
	}
	for _, d := range itDomains(e.t) {
		if strings.Contains(d, e.names.token) {
			e.t.Errorf("domain %s was left on the host", d)
		}
	}
}

// sweep removes whatever carries the test's token, so a failed test leaves a clean host.
func (e *itRealEnv) sweep() {
	for _, d := range itDomains(e.t) {
		if strings.Contains(d, e.names.token) {
			_, _ = itVirsh("destroy", d)
			_, _ = itVirsh("undefine", "--nvram", d)
		}
	}
	for _, v := range e.poolVolumes() {
		if strings.Contains(v, e.names.token) {
			_, _ = itVirsh("vol-delete", "--pool", e.host.pool, v)
		}
	}
}

// removeImage deletes the test's cached base and its marker, in either format.
func (e *itRealEnv) removeImage() {
	for _, v := range []string{imagecache.BaseVolName(e.names.image(), "qcow2"), imagecache.MarkerVolName(e.names.image(), "qcow2"),
		imagecache.BaseVolName(e.names.image(), "raw"), imagecache.MarkerVolName(e.names.image(), "raw")} {
		if e.hasVolume(v) {
			itMustVirsh(e.t, "vol-delete", "--pool", e.host.pool, v)
		}
	}
}

// itPoll is how often the tier's waits (testutil.WaitFor) look at the real host: each
// look is a virsh call or more.
const itPoll = 200 * time.Millisecond

// hostScript runs one of the host script's fault commands (stop-sshd, start-libvirtd...).
func (h itRealHost) hostScript(t testing.TB, cmd string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, h.script, cmd).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", h.script, cmd, err, out)
	}
}

// itCheckOne runs the provider's health check and returns the real host's target.
func itCheckOne(t testing.TB, p *Provider) provider.TargetStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, st := range p.Check(ctx) {
		if st.Target == integrationHost {
			return st
		}
	}
	t.Fatalf("the check returned no target %s", integrationHost)
	return provider.TargetStatus{}
}

// itWantErr fails unless err carries class and its message holds every part.
func itWantErr(t testing.TB, err, class error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %s error mentioning %q", provider.ClassName(provider.WithClass(class, fmt.Errorf("x"))), parts)
	}
	if provider.Class(err) != class {
		t.Fatalf("error class %s, want %v: %v", provider.ClassName(err), class, err)
	}
	for _, s := range parts {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not mention %q", err, s)
		}
	}
}

// itCtxFor is a context for one provider call with a deadline far beyond what it needs on a
// loaded machine: a hang fails the test instead of the whole binary.
func itCtxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var itTinyOnce sync.Once
var itTinyBytes []byte

// itTinyQcow2 is a small empty qcow2 made by qemu-img: it does not boot, but a domain on it
// runs (the firmware finds nothing to boot and waits), which is all these tests need.
func itTinyQcow2(t testing.TB) []byte {
	t.Helper()
	itTinyOnce.Do(func() {
		dir, err := os.MkdirTemp("", "epo-it-img")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		f := filepath.Join(dir, "tiny.qcow2")
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", f, "64M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img create: %v: %s", err, out)
		}
		if itTinyBytes, err = os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
	})
	if itTinyBytes == nil {
		t.Fatal("no tiny image (qemu-img failed earlier)")
	}
	return itTinyBytes
}

// itExecOutput runs a command with a generous deadline and returns its combined output.
func itExecOutput(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}
