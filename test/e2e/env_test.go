//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

// loadHostEnv is the local libvirt host of hack/libvirt-host.sh's env file.
func loadHostEnv(t *testing.T) framework.HostEnv {
	t.Helper()
	return framework.LoadHostEnv(t, "run `make test-e2e`, or `hack/libvirt-host.sh up && source $(hack/libvirt-host.sh env)`")
}

// controlPlane starts kube-apiserver and etcd with the project's CRDs (internal/testenv),
// writes an admin kubeconfig for the manager process and returns a client and the
// kubeconfig's path.
func controlPlane(t *testing.T) (client.Client, string) {
	t.Helper()
	env, err := testenv.Start()
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return env.Client, path
}

// buildManager builds cmd/manager from this tree into a temporary directory.
func buildManager(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "manager")
	if err := testutil.BuildManager(bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// freeAddr returns host:port with a port nobody listens on right now.
func freeAddr(t *testing.T, host string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// manager is the operator running as a process, restartable with the same arguments.
// Its output goes to a log file that survives restarts.
type manager struct {
	t       *testing.T
	bin     string
	args    []string
	logPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited <-chan struct{}
	starts int
}

func (m *manager) start() {
	m.t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	f, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		m.t.Fatal(err)
	}
	m.starts++
	fmt.Fprintf(f, "===== manager start #%d at %s =====\n", m.starts, time.Now().Format(time.RFC3339))
	cmd := exec.Command(m.bin, m.args...)
	exited, err := startTied(cmd, f)
	if err != nil {
		m.t.Fatalf("starting the manager: %v", err)
	}
	m.cmd, m.exited = cmd, exited
}

// startTied starts cmd, its output going to log, tied to the test binary's life: should
// the binary die without its clean-ups (a go test timeout), cmd is killed too. The kernel
// sends Pdeathsig when the thread that started the child ends, not the process, and Go
// ends a thread whenever a goroutine locked to it returns (the edge namespace's listeners
// do so on purpose), which may be the thread cmd was started from. So cmd is started from
// a goroutine locked to its thread until cmd exits, and that thread outlives it. The
// channel closes once cmd has exited and log is closed.
func startTied(cmd *exec.Cmd, log *os.File) (<-chan struct{}, error) {
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := cmd.Start(); err != nil {
			started <- err
			log.Close()
			return
		}
		started <- nil
		_ = cmd.Wait()
		log.Close()
		close(exited)
	}()
	return exited, <-started
}

// kill sends sig and waits (up to a minute) for the process to end.
func (m *manager) kill(sig syscall.Signal) {
	m.mu.Lock()
	cmd, exited := m.cmd, m.exited
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// tail returns the last n lines of the manager's log.
func (m *manager) tail(n int) string {
	data, err := os.ReadFile(m.logPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", m.logPath, err)
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// providersConfig is the manager's providers config for the local host, with imageKey at
// imageURL and any more catalogue entries given in extra (already indented YAML).
func providersConfig(h framework.HostEnv, imageURL, imageSHA string, extra ...string) string {
	return fmt.Sprintf(`providers:
  - name: kvm2-home
    type: kvm2
    kvm2:
      sshKeyFile: %s
      knownHostsFile: %s
      diskSizeGb: 2
      images:
        %s:
          url: %s
          sha256: %s
          format: qcow2
          firmware: uefi
%s      machineTypes:
        small: {vcpus: 2, memoryMiB: 1024}
      hosts:
        - name: local
          address: %s
          user: %s
          socket: %s
          pool: %s
          bridge: %s
          domainType: %s
`, h.Key, h.KnownHosts, imageKey, imageURL, imageSHA, strings.Join(extra, ""), h.Address, h.User, h.Socket, h.Pool, h.Bridge, h.DomainType)
}

// catalogueImage is one more entry of the providers config's image catalogue.
func catalogueImage(key, url, sha string) string {
	return fmt.Sprintf("        %s:\n          url: %s\n          sha256: %s\n          format: qcow2\n          firmware: uefi\n", key, url, sha)
}

// ctxFor is a context that ends with the test or after d.
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
