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
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// managerBinary builds the manager once per test run.
func managerBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "manager-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "manager")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

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
	env := testenv.StartT(t)
	bin := managerBinary(t)
	c := env.Client

	kubeconfig := writeFile(t, "kubeconfig", string(env.KubeConfig))
	providers := writeFile(t, "providers.yaml", fmt.Sprintf(goodConfig, t.TempDir()))
	probe := freeAddr(t)
	cmd := exec.Command(bin, "--providers-config", providers, "--kubeconfig", kubeconfig,
		"--health-probe-bind-address", probe, "--metrics-bind-address", "0", "--discovery-bind-address", freeAddr(t),
		"--leader-elect", "--leader-election-namespace", "default")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	})

	waitUntil(t, "the manager's /readyz to answer 200", &stderr, exited, func() bool {
		resp, err := http.Get("http://" + probe + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if !strings.Contains(stderr.String(), "WARNING") {
		t.Errorf("no WARNING: line about the missing SSH files:\n%s", stderr.String())
	}

	ctx := context.Background()
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere", Namespace: "default"},
		Spec: v1alpha1.ProxySpec{Provider: "gcp-europe"}}
	if err := c.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the Proxy naming an unconfigured provider to be Failed", &stderr, exited, func() bool {
		got := &v1alpha1.Proxy{}
		return c.Get(ctx, client.ObjectKeyFromObject(px), got) == nil && got.Status.Phase == v1alpha1.PhaseFailed &&
			strings.Contains(got.Status.Message, `"gcp-europe" is not configured (configured: kvm2-home)`)
	})

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("manager exited with %v after SIGTERM, want 0; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("manager still running 60s after SIGTERM; stderr:\n%s", stderr.String())
	}
}

func waitUntil(t *testing.T, what string, stderr *syncBuffer, exited <-chan error, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		select {
		case err := <-exited:
			t.Fatalf("manager exited (%v) while waiting for %s; stderr:\n%s", err, what, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s; stderr:\n%s", what, stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// syncBuffer is a bytes.Buffer safe for the process's writer and the test's reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
