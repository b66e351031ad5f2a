//go:build deploy

package deploy

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

// env is what hack/libvirt-host.sh and hack/cluster.sh describe in their env files: the
// libvirt host, which is this machine, and the cluster.
type env struct {
	framework.HostEnv
	host                         *framework.Host
	root                         string // the repository's top directory
	kubeconfig, kubectl, gateway string
	helm                         string // hack/helm.sh's binary
}

func loadEnv(t *testing.T) env {
	t.Helper()
	const how = "run `make test-deploy` (it sources hack/libvirt-host.sh's and hack/cluster.sh's env files)"
	get := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			t.Fatalf("%s is not set: %s", name, how)
		}
		return v
	}
	h := framework.LoadHostEnv(t, how)
	return env{HostEnv: h, host: framework.LocalHost(h), root: framework.RepoRoot(t),
		kubeconfig: get("KUBECONFIG"), kubectl: get("CLUSTER_KUBECTL"), gateway: get("CLUSTER_GATEWAY"),
		helm: get("HELM")}
}

// podHostAddress is the libvirt host's sshd as the pods reach it: the host's address on
// the pod bridge, whose port hack/cluster.sh forwards to the sshd on loopback.
func (e env) podHostAddress(t *testing.T) string {
	_, port, err := net.SplitHostPort(e.Address)
	if err != nil {
		t.Fatalf("KVM2_TEST_ADDRESS %q: %v", e.Address, err)
	}
	return net.JoinHostPort(e.gateway, port)
}

// knownHostsForPods is the libvirt host's known_hosts with its key listed under the
// address the pods dial.
func (e env) knownHostsForPods(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(e.KnownHosts)
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(e.Address)
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(line); len(f) >= 3 {
			out = append(out, fmt.Sprintf("[%s]:%s %s", e.gateway, port, strings.Join(f[1:], " ")))
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s lists no host key", e.KnownHosts)
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
	return framework.NewClient(t, cfg)
}

// run runs a command from the repository root with kubectl first on PATH (the Makefile's
// targets call kubectl by name) and the cluster's kubeconfig, and returns its output.
func (e env) run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = e.root
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

// fileServer serves one file at any path.
func fileServer(path string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, path) })
}
