package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
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
		buildErr = testutil.BuildManager(binPath)
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// managerProc is the manager binary running as a process of its own against an envtest
// API server.
type managerProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stderr syncBuffer
	exited chan error
}

// startManager runs the manager against env with args after --kubeconfig; the process is
// killed at the end of the test if it is still running.
func startManager(t *testing.T, env *testenv.Env, args ...string) *managerProc {
	t.Helper()
	return startManagerWith(t, env.KubeConfig, args...)
}

// startManagerWith is startManager with a kubeconfig of the test's own.
func startManagerWith(t *testing.T, kubeconfigData []byte, args ...string) *managerProc {
	t.Helper()
	kubeconfig := writeFile(t, "kubeconfig", string(kubeconfigData))
	m := &managerProc{t: t, exited: make(chan error, 1)}
	m.cmd = exec.Command(managerBinary(t), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	m.cmd.Stderr = &m.stderr
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { m.exited <- m.cmd.Wait() }()
	t.Cleanup(func() {
		if m.cmd.ProcessState == nil {
			_ = m.cmd.Process.Kill()
		}
	})
	return m
}

// waitUntil waits (testutil.WaitFor) up to a minute for cond, failing the test with the
// manager's stderr when it runs out of time or the manager exits meanwhile.
func (m *managerProc) waitUntil(what string, cond func() (bool, error)) {
	m.t.Helper()
	testutil.WaitFor(m.t, time.Minute, what, func() (bool, error) {
		select {
		case err := <-m.exited:
			m.t.Fatalf("manager exited (%v) while waiting for %s; stderr:\n%s", err, what, m.stderr.String())
		default:
		}
		return cond()
	}, testutil.Every(100*time.Millisecond), testutil.OnTimeout(func() string { return "stderr:\n" + m.stderr.String() }))
}

// stop sends SIGTERM and fails the test unless the manager exits 0 within a minute.
func (m *managerProc) stop() {
	m.t.Helper()
	if err := m.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		m.t.Fatal(err)
	}
	select {
	case err := <-m.exited:
		if err != nil {
			m.t.Fatalf("manager exited with %v after SIGTERM, want 0; stderr:\n%s", err, m.stderr.String())
		}
	case <-time.After(60 * time.Second):
		m.t.Fatalf("manager still running 60s after SIGTERM; stderr:\n%s", m.stderr.String())
	}
}

func freeAddr(t *testing.T) string { return testutil.FreeAddr(t) }

// syncBuffer is a bytes.Buffer safe for the process's writer and the test's reader.
type syncBuffer = testutil.SyncBuffer
