package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const badConfig = `providers:
  - name: kvm2-home
    type: kvm2
    kvm2:
      sshKeyFile: /etc/proxy-operator/kvm/id_ed25519
      knownHostsFile: /etc/proxy-operator/kvm/known_hosts
      images:
        debian-12: {url: "http://192.0.2.1/debian-12.qcow2"}
      machineTypes:
        small: {vcpus: 1, memoryMiB: 1024}
      hosts:
        - name: beelink
          address: beelink.example:22
          user: proxyop
`

// A broken providers config stops the manager with exit code 1 and the config's own
// message, before any API server is contacted (there is none here).
func TestBadProvidersConfigExits1(t *testing.T) {
	t.Parallel()
	bin := managerBinary(t)
	for _, tc := range []struct{ name, path, want string }{
		{"missing bridge", writeFile(t, "providers.yaml", badConfig), "kvm2.hosts[0]: bridge is required"},
		{"no such file", filepath.Join(t.TempDir(), "absent.yaml"), "absent.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, "--providers-config", tc.path)
			cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(t.TempDir(), "no-kubeconfig"), "KUBERNETES_SERVICE_HOST=")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("exit: %v, want exit code 1; stderr:\n%s", err, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr does not name the problem %q:\n%s", tc.want, stderr.String())
			}
			if strings.Contains(stderr.String(), "kubeconfig") {
				t.Errorf("the manager looked for the API server before checking its config:\n%s", stderr.String())
			}
		})
	}
}

// A taken listen address stops the manager with exit code 1 and a message naming the
// flag, before any API server is contacted: it was once found only after /readyz had
// answered 200, since the metrics listener starts beside the health probes.
func TestTakenListenAddressExits1(t *testing.T) {
	t.Parallel()
	bin := managerBinary(t)
	for _, flagName := range []string{"--metrics-bind-address", "--health-probe-bind-address", "--discovery-bind-address"} {
		t.Run(flagName, func(t *testing.T) {
			held, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			args := map[string]string{"--metrics-bind-address": "0", "--health-probe-bind-address": "127.0.0.1:0", "--discovery-bind-address": "0"}
			args[flagName] = held.Addr().String()
			cmd := exec.Command(bin, "--providers-config=")
			for f, v := range args {
				cmd.Args = append(cmd.Args, f+"="+v)
			}
			cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(t.TempDir(), "no-kubeconfig"), "KUBERNETES_SERVICE_HOST=")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err = cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("exit: %v, want exit code 1; stderr:\n%s", err, stderr.String())
			}
			want := flagName + " " + held.Addr().String() + ": listen tcp " + held.Addr().String() + ": bind: address already in use"
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("stderr does not say %q:\n%s", want, stderr.String())
			}
			if strings.Contains(stderr.String(), "kubeconfig") {
				t.Errorf("the manager looked for the API server before checking its addresses:\n%s", stderr.String())
			}
		})
	}
}

const goodConfig = `providers:
  - name: kvm2-home
    type: kvm2
    kvm2:
      sshKeyFile: %[1]s/id_ed25519
      knownHostsFile: %[1]s/known_hosts
      images:
        debian-12: {url: "http://192.0.2.1/debian-12.qcow2"}
      machineTypes:
        small: {vcpus: 1, memoryMiB: 1024}
      hosts:
        - name: beelink
          address: 192.0.2.1:22
          user: proxyop
          bridge: br0
`

// Against a real API server: the manager starts without the SSH Secret, elects itself,
// answers its probes, reconciles a Proxy, and exits 0 on SIGTERM.
func TestManagerRunsAndStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	env := testenv.StartT(t)
	c := env.Client

	providers := writeFile(t, "providers.yaml", fmt.Sprintf(goodConfig, t.TempDir()))
	probe := freeAddr(t)
	mgr := startManager(t, env, "--providers-config", providers,
		"--health-probe-bind-address", probe, "--metrics-bind-address", "0", "--discovery-bind-address", freeAddr(t),
		"--leader-elect", "--leader-election-namespace", "default")

	mgr.waitUntil("the manager's /readyz to answer 200", func() (bool, error) {
		resp, err := http.Get("http://" + probe + "/readyz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Errorf("/readyz answered %d", resp.StatusCode)
	})
	if !strings.Contains(mgr.stderr.String(), "WARNING") {
		t.Errorf("no WARNING: line about the missing SSH files:\n%s", mgr.stderr.String())
	}

	ctx := context.Background()
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere", Namespace: "default"},
		Spec: v1alpha1.ProxySpec{Provider: "gcp-europe"}}
	if err := c.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	mgr.waitUntil("the Proxy naming an unconfigured provider to be Failed", func() (bool, error) {
		got := &v1alpha1.Proxy{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(px), got); err != nil {
			return false, err
		}
		return got.Status.Phase == v1alpha1.PhaseFailed &&
				strings.Contains(got.Status.Message, `"gcp-europe" is not configured (configured: kvm2-home)`),
			fmt.Errorf("phase %q, message %q", got.Status.Phase, got.Status.Message)
	})

	mgr.stop()
}
