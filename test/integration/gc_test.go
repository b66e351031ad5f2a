//go:build integration

// Package integration drives manager code against the local libvirt host that
// hack/libvirt-host.sh runs (see make test-integration-kvm2).
package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/orphangc"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// TestOrphanGC_realHost runs one sweep of the manager's orphan GC over the kvm2 provider
// on the real host: the domain whose owner UID matches no Proxy goes, with its volumes;
// the one whose Proxy exists stays.
func TestOrphanGC_realHost(t *testing.T) {
	env := loadEnv(t)
	token := "epo-it-" + randomHex(t) + "-gc"
	imgKey := token + "-img"
	t.Cleanup(func() { sweep(t, env, token) })

	p := newProvider(t, env, imgKey)

	owned := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "owned", UID: types.UID(token + "-owned")}}
	orphan := createTiny(t, p, imgKey, token+"-orphan", token+"-gone", "")
	kept := createTiny(t, p, imgKey, token+"-kept", string(owned.UID), "")

	res := sweepScoped(t, p, token, owned)
	if got := res.Deleted["kvm2-it"]; !slices.Equal(got, []string{orphan.ProviderID}) || len(res.Skipped) != 0 {
		t.Fatalf("sweep deleted %v (skipped %v), want exactly %s", res.Deleted, res.Skipped, orphan.ProviderID)
	}
	if _, err := virsh("dominfo", orphan.Name); err == nil {
		t.Errorf("orphaned domain %s is still on the host", orphan.Name)
	}
	vols := volumes(t, env["KVM2_TEST_POOL"])
	for _, v := range []string{orphan.Name + ".qcow2", orphan.Name + "-seed.iso"} {
		if slices.Contains(vols, v) {
			t.Errorf("the orphan's volume %s is still in the pool", v)
		}
	}
	if out, err := virsh("domstate", kept.Name); err != nil || strings.TrimSpace(out) != "running" {
		t.Errorf("the owned domain %s after the sweep: %q %v, want running", kept.Name, out, err)
	}

	if err := p.Delete(ctx(t), kept.ProviderID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	for _, v := range []string{"base-" + imgKey + ".qcow2.sha256", "base-" + imgKey + ".qcow2"} {
		if _, err := virsh("vol-delete", "--pool", env["KVM2_TEST_POOL"], v); err != nil {
			t.Errorf("removing the cached image: %v", err)
		}
	}
	for _, v := range volumes(t, env["KVM2_TEST_POOL"]) {
		if strings.Contains(v, token) {
			t.Errorf("volume %s left in the pool", v)
		}
	}
}

// createTiny creates, and waits out any pending result of, a domain of the tiny image
// under imgKey named name for uid, built from specHash.
func createTiny(t *testing.T, p provider.Provider, imgKey, name, uid, specHash string) provider.Instance {
	t.Helper()
	inst, err := providertest.CreateSettled(ctx(t), p, provider.CreateRequest{Name: name, UID: uid, Port: 3128, SpecHash: specHash,
		Placement: provider.Placement{MachineType: "tiny", Image: imgKey}, CloudInit: []byte("#cloud-config\n")}, time.Second)
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return inst
}

// sweepScoped runs one orphan GC sweep over p with owned as the only Proxy. The host is
// shared: GC sees only the domains whose names carry token, so a sweep can never touch
// anyone else's.
func sweepScoped(t *testing.T, p provider.Provider, token string, owned *v1alpha1.Proxy) orphangc.SweepResult {
	t.Helper()
	gc := &orphangc.OrphanGC{
		Client:    proxyLister{items: []v1alpha1.Proxy{*owned}},
		Providers: map[string]provider.Provider{"kvm2-it": scoped{Provider: p, token: token}},
		Grace:     time.Nanosecond,
		Log:       testLogger(t),
	}
	res, err := gc.Sweep(ctx(t))
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	return res
}

// newProvider is a kvm2 provider on the real host whose catalogue serves a tiny image
// under imgKey from a loopback server.
func newProvider(t *testing.T, env map[string]string, imgKey string, opts ...kvm2.Option) *kvm2.Provider {
	t.Helper()
	img := tinyImage(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(img)))
		if r.Method != http.MethodHead {
			_, _ = w.Write(img)
		}
	}))
	t.Cleanup(srv.Close)

	cfg := provider.KVMConfig{
		SSHKeyFile: env["KVM2_TEST_KEY"], KnownHostsFile: env["KVM2_TEST_KNOWN_HOSTS"], DiskSizeGb: 1,
		Images:       map[string]provider.KVMImage{imgKey: {URL: srv.URL + "/tiny.qcow2", Firmware: "bios"}},
		MachineTypes: map[string]provider.KVMMachineType{"tiny": {VCPUs: 1, MemoryMiB: 128}},
		Hosts: []provider.KVMHost{{Name: "local", Address: env["KVM2_TEST_ADDRESS"], User: env["KVM2_TEST_USER"],
			Socket: env["KVM2_TEST_SOCKET"], Pool: env["KVM2_TEST_POOL"], Bridge: env["KVM2_TEST_BRIDGE"],
			DomainType: env["KVM2_TEST_DOMAIN_TYPE"]}},
	}
	p, err := kvm2.New(provider.ProviderConfig{Name: "kvm2-it", Type: provider.TypeKVM2, KVM2: &cfg}, testLogger(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// proxyLister is the cache the GC reads Proxies from, holding a fixed list. The GC only
// lists; any other call is a test bug and panics on the nil Client.
type proxyLister struct {
	client.Client
	items []v1alpha1.Proxy
}

func (l proxyLister) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	list.(*v1alpha1.ProxyList).Items = append([]v1alpha1.Proxy(nil), l.items...)
	return nil
}

// scoped lists only the instances named after the test.
type scoped struct {
	provider.Provider
	token string
}

func (s scoped) ListByTag(ctx context.Context) ([]provider.Instance, error) {
	all, err := s.Provider.ListByTag(ctx)
	var mine []provider.Instance
	for _, in := range all {
		if strings.Contains(in.Name, s.token) {
			mine = append(mine, in)
		}
	}
	return mine, err
}

// loadEnv reads the host's KVM2_TEST_* variables; a missing one fails the test.
func loadEnv(t *testing.T) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, k := range []string{"KVM2_TEST_ADDRESS", "KVM2_TEST_USER", "KVM2_TEST_KEY", "KVM2_TEST_KNOWN_HOSTS",
		"KVM2_TEST_SOCKET", "KVM2_TEST_POOL", "KVM2_TEST_BRIDGE", "KVM2_TEST_DOMAIN_TYPE"} {
		if env[k] = os.Getenv(k); env[k] == "" {
			t.Fatalf("%s is not set: the integration tests need the local libvirt host; run `make test-integration-kvm2` "+
				"(it runs hack/libvirt-host.sh up and sources ~/.cache/egress-proxies-operator/libvirt-host/env)", k)
		}
	}
	return env
}

func randomHex(t *testing.T) string {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return c
}

func testLogger(t *testing.T) logr.Logger {
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	return funcr.New(func(prefix, args string) {
		select {
		case <-done:
		default:
			t.Log(prefix, args)
		}
	}, funcr.Options{Verbosity: 1})
}

func virsh(args ...string) (string, error) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(c, "virsh", append([]string{"-q", "-c", "qemu:///system"}, args...)...).CombinedOutput()
	return string(out), err
}

func volumes(t *testing.T, pool string) []string {
	t.Helper()
	out, err := virsh("vol-list", pool)
	if err != nil {
		t.Fatalf("virsh vol-list %s: %v: %s", pool, err, out)
	}
	var vols []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			vols = append(vols, f[0])
		}
	}
	return vols
}

// sweep removes whatever carries token, so a failed test leaves the host clean.
func sweep(t *testing.T, env map[string]string, token string) {
	out, _ := virsh("list", "--all", "--name")
	for _, d := range strings.Fields(out) {
		if strings.Contains(d, token) {
			_, _ = virsh("destroy", d)
			_, _ = virsh("undefine", "--nvram", d)
		}
	}
	for _, v := range volumes(t, env["KVM2_TEST_POOL"]) {
		if strings.Contains(v, token) {
			_, _ = virsh("vol-delete", "--pool", env["KVM2_TEST_POOL"], v)
		}
	}
}

// tinyImage is an empty qcow2 from qemu-img: enough for a domain to run, not to boot.
func tinyImage(t *testing.T) []byte {
	t.Helper()
	f := filepath.Join(t.TempDir(), "tiny.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", f, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
