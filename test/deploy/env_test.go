//go:build deploy

package deploy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

const repoRoot = "../.."

// env is what hack/libvirt-host.sh and hack/cluster.sh describe in their env files.
type env struct {
	// the libvirt host
	hostAddress, hostUser, hostKey, hostKnownHosts, socket, pool, poolPath string
	bridge, bridgeIP, domainType                                           string
	// the cluster
	kubeconfig, kubectl, gateway string
}

func loadEnv(t *testing.T) env {
	t.Helper()
	get := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			t.Fatalf("%s is not set: run `make test-deploy` (it sources hack/libvirt-host.sh's and hack/cluster.sh's env files)", name)
		}
		return v
	}
	return env{
		hostAddress: get("KVM2_TEST_ADDRESS"), hostUser: get("KVM2_TEST_USER"), hostKey: get("KVM2_TEST_KEY"),
		hostKnownHosts: get("KVM2_TEST_KNOWN_HOSTS"), socket: get("KVM2_TEST_SOCKET"), pool: get("KVM2_TEST_POOL"),
		poolPath: get("KVM2_TEST_POOL_PATH"), bridge: get("KVM2_TEST_BRIDGE"), bridgeIP: get("KVM2_TEST_BRIDGE_IP"),
		domainType: get("KVM2_TEST_DOMAIN_TYPE"),
		kubeconfig: get("KUBECONFIG"), kubectl: get("CLUSTER_KUBECTL"), gateway: get("CLUSTER_GATEWAY"),
	}
}

// podHostAddress is the libvirt host's sshd as the pods reach it: the host's address on
// the pod bridge, whose port hack/cluster.sh forwards to the sshd on loopback.
func (e env) podHostAddress(t *testing.T) string {
	_, port, err := net.SplitHostPort(e.hostAddress)
	if err != nil {
		t.Fatalf("KVM2_TEST_ADDRESS %q: %v", e.hostAddress, err)
	}
	return net.JoinHostPort(e.gateway, port)
}

// knownHostsForPods is the libvirt host's known_hosts with its key listed under the
// address the pods dial.
func (e env) knownHostsForPods(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(e.hostKnownHosts)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(e.hostAddress)
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(line); len(f) >= 3 {
			out = append(out, fmt.Sprintf("[%s]:%s %s", e.gateway, port, strings.Join(f[1:], " ")))
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s lists no host key", e.hostKnownHosts)
	}
	p := filepath.Join(t.TempDir(), "known_hosts")
	if err := os.WriteFile(p, []byte(strings.Join(out, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func newClient(t *testing.T, e env) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", e.kubeconfig, err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// run runs a command from the repository root with kubectl first on PATH (the Makefile's
// targets call kubectl by name) and the cluster's kubeconfig, and returns its output.
func (e env) run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(e.kubectl)+":"+os.Getenv("PATH"), "KUBECONFIG="+e.kubeconfig)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

func (e env) mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	out, err := e.run(ctx, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// virsh runs virsh against the local libvirtd as root: the host is this machine.
func virsh(args ...string) (string, error) {
	out, err := exec.Command("virsh", append([]string{"-q", "-c", "qemu:///system"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh %s: %w (%s)", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// domainsCarrying lists the domains whose XML names uid (the ownership mark).
func domainsCarrying(t *testing.T, uid string) []string {
	t.Helper()
	out, err := virsh("list", "--all", "--name")
	if err != nil {
		t.Fatal(err)
	}
	var doms []string
	for _, d := range strings.Fields(out) {
		x, err := virsh("dumpxml", d)
		if err != nil {
			continue // gone meanwhile
		}
		if strings.Contains(x, uid) {
			doms = append(doms, d)
		}
	}
	return doms
}

// leftovers lists what is left of instance vm on the host: its domain, volumes, files in
// the pool directory and its NVRAM copy.
func leftovers(t *testing.T, e env, vm string) []string {
	t.Helper()
	var left []string
	doms, err := virsh("list", "--all", "--name")
	if err != nil {
		left = append(left, err.Error())
	}
	for _, d := range strings.Fields(doms) {
		if d == vm {
			left = append(left, "domain "+d)
		}
	}
	vols, err := virsh("vol-list", "--pool", e.pool)
	if err != nil {
		left = append(left, err.Error())
	}
	for _, line := range strings.Split(vols, "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], vm) {
			left = append(left, "volume "+f[0])
		}
	}
	for _, pattern := range []string{filepath.Join(e.poolPath, vm+"*"), filepath.Join("/var/lib/libvirt/qemu/nvram", vm+"*")} {
		files, _ := filepath.Glob(pattern)
		for _, f := range files {
			left = append(left, "file "+f)
		}
	}
	return left
}

// serveOn runs h on a free port of host until the test ends and returns its host:port.
func serveOn(t *testing.T, host string, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("listening on %s: %v", host, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// callers answers {"ip": "<caller>"} and counts requests per caller address: the
// probe target the guests reach on the bridge.
type callers struct {
	mu   sync.Mutex
	seen map[string]int
}

func (c *callers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ip, _, _ := net.SplitHostPort(r.RemoteAddr)
	c.mu.Lock()
	if c.seen == nil {
		c.seen = map[string]int{}
	}
	c.seen[ip]++
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, "{\"ip\": %q}\n", ip)
}

func (c *callers) from(ip string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[ip]
}

// guestImage builds (or finds cached) the test guest and returns its path and sha256.
func guestImage(t *testing.T) (string, string) {
	t.Helper()
	out, err := exec.Command(filepath.Join(repoRoot, "hack", "guest-image.sh")).Output()
	if err != nil {
		t.Fatalf("hack/guest-image.sh: %v", err)
	}
	path := strings.TrimSpace(string(out))
	if b, err := os.ReadFile(path + ".sha256"); err == nil {
		return path, strings.Fields(string(b))[0]
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return path, hex.EncodeToString(h.Sum(nil))
}

// fileServer serves one file at any path.
func fileServer(path string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, path) })
}

// httpGet GETs url with an optional bearer token; status 0 is a transport error.
func httpGet(c *http.Client, url, token string) (int, string) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// waitFor polls cond every poll until it holds, failing the test after timeout with what
// it waited for and the last error; it returns how long it took.
func waitFor(t *testing.T, what string, timeout, poll time.Duration, cond func() (bool, error)) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	var last error
	for {
		ok, err := cond()
		if ok {
			return time.Since(start)
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting for %s (last error: %v)", timeout, what, last)
		}
		time.Sleep(poll)
	}
}
