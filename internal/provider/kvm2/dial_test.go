package kvm2

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/sshtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// dialErr dials once and returns the failure, which must carry a dialError.
func (e *testEnv) dialErr(t *testing.T, ctx context.Context) (*dialError, error) {
	t.Helper()
	_, closeFn, err := e.hs.dialFresh(ctx, e.host)
	if err == nil {
		closeFn()
		t.Fatal("dial succeeded")
	}
	var de *dialError
	if !errors.As(err, &de) {
		t.Fatalf("error %v is not a dialError", err)
	}
	return de, err
}

func TestDialOverSSH(t *testing.T) {
	start := time.Now() // the span recorder is shared: earlier runs' dial spans are older
	e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(1))
	b, err := e.hs.pooled(context.Background(), e.host)
	if err != nil {
		t.Fatal(err)
	}
	name, err := b.ConnectGetHostname()
	if err != nil || name != libvirtfake.DefaultHostname {
		t.Fatalf("hostname %q, %v", name, err)
	}
	lines := e.logs.find(`"msg":"libvirt host connected"`)
	if len(lines) != 1 {
		t.Fatalf("want one connected line, got %q", e.logs.all())
	}
	for _, want := range []string{`"address":"` + e.ssh.Addr, `"user":"` + e.ssh.User, `"duration"`, `"host":"` + e.host} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("line %s lacks %s", lines[0], want)
		}
	}
	var found bool
	for _, s := range spansFor(e.host) {
		if s.Name() != "kvm2.dial" || s.StartTime().Before(start) {
			continue
		}
		found = true
		if v, _ := attr(s, "kvm2.address"); v.AsString() != e.ssh.Addr {
			t.Errorf("kvm2.address = %q", v.AsString())
		}
		if v, _ := attr(s, "kvm2.user"); v.AsString() != e.ssh.User {
			t.Errorf("kvm2.user = %q", v.AsString())
		}
	}
	if !found {
		t.Error("no kvm2.dial span")
	}
}

func TestDialFailureStages(t *testing.T) {
	tests := []struct {
		name    string
		arrange func(t *testing.T, e *testEnv)
		stage   string
		class   error
	}{
		{"key file missing", func(t *testing.T, e *testEnv) { os.Remove(e.ssh.KeyFile) }, stageCredentials, provider.ErrTransient},
		{"key file is the public key", func(t *testing.T, e *testEnv) {
			writeFile(t, e.ssh.KeyFile, []byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ8= op@laptop\n"))
		}, stageCredentials, provider.ErrPermanent},
		{"nothing listening", func(t *testing.T, e *testEnv) { e.hs.cfg.Hosts[0].Address = closedPort(t) }, stageTCP, provider.ErrTransient},
		{"key not authorized", func(t *testing.T, e *testEnv) { e.ssh.Revoke(e.ssh.Signer().PublicKey()) }, stageSSH, provider.ErrPermanent},
		{"host key changed", func(t *testing.T, e *testEnv) { must(e.ssh.RotateHostKey()) }, stageSSH, provider.ErrPermanent},
		{"host not in known_hosts", func(t *testing.T, e *testEnv) {
			if err := sshtest.WriteKnownHosts(e.ssh.KnownHostsFile, "elsewhere:22", e.ssh.HostKey()); err != nil {
				t.Fatal(err)
			}
		}, stageSSH, provider.ErrPermanent},
		{"forwarding refused", func(t *testing.T, e *testEnv) { e.ssh.RefuseForwarding(true) }, stageSocket, provider.ErrTransient},
		{"no libvirt socket", func(t *testing.T, e *testEnv) { e.hs.cfg.Hosts[0].Socket = "/run/nothing-here" }, stageSocket, provider.ErrTransient},
		{"handshake stalls past the dial budget", func(t *testing.T, e *testEnv) {
			e.ssh.StallHandshakes(true)
			// The stall never ends, so the budget only has to outlast the TCP connect on
			// loopback, which a loaded machine can hold past 100 ms (the stage was then
			// "tcp").
			e.hs.budgets.dial = 2 * time.Second
		}, stageSSH, provider.ErrTransient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(1))
			tt.arrange(t, e)
			de, err := e.dialErr(t, context.Background())
			if de.stage != tt.stage {
				t.Errorf("stage %q, want %q (error: %v)", de.stage, tt.stage, de)
			}
			if provider.Class(err) != tt.class {
				t.Errorf("class %v, want %v (error: %v)", provider.Class(err), tt.class, err)
			}
			if !strings.Contains(err.Error(), e.host) {
				t.Errorf("error %q does not name the host", err)
			}
			lines := e.logs.find(`"msg":"libvirt host connect failed"`, `"stage":"`+tt.stage+`"`)
			if len(lines) == 0 {
				t.Fatalf("no connect failed line with stage %s: %q", tt.stage, e.logs.all())
			}
			if !strings.Contains(lines[0], `"error":`) || !strings.Contains(lines[0], `"address":`) {
				t.Errorf("connect failed line lacks error or address: %s", lines[0])
			}
		})
	}
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestCredentialRotationWithoutRestart(t *testing.T) {
	e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(0))
	ctx := context.Background()
	if _, err := must(e.hs.pooled(ctx, e.host)).ConnectGetHostname(); err != nil {
		t.Fatal(err)
	}
	// The operator's key is rotated (to a PEM key, to cover both formats) on the host
	// and in the Secret, and the host is reinstalled with a new host key.
	if err := e.ssh.RotateClientKey(sshtest.PEM); err != nil {
		t.Fatal(err)
	}
	must(e.ssh.RotateHostKey())
	if err := e.ssh.RewriteKnownHosts(); err != nil {
		t.Fatal(err)
	}
	// A fresh connection picks the new files up at once.
	b, closeFn, err := e.hs.dialFresh(ctx, e.host)
	if err != nil {
		t.Fatalf("fresh dial after rotation: %v", err)
	}
	must(b.ConnectGetHostname())
	closeFn()
	// The pooled connection stays up until it drops; its replacement uses the new key.
	e.ssh.KillConnections()
	testutil.WaitFor(t, waitLong, "the pooled connection to be noticed dead", func() (bool, error) {
		return !e.pooledConn().alive(), errors.New("the pooled connection is alive")
	})
	if _, err := must(e.hs.pooled(ctx, e.host)).ConnectGetHostname(); err != nil {
		t.Fatalf("redial after rotation: %v", err)
	}
	if st := e.ssh.Stats(); st.SSHConns != 3 {
		t.Errorf("%d SSH connections, want 3 (first pooled, fresh, redialled pooled)", st.SSHConns)
	}
}

// connDead is a WaitFor condition: c has been marked dead.
func connDead(c *conn) func() (bool, error) {
	return func() (bool, error) { return !c.alive(), errors.New("the connection is alive") }
}

// pooledConn is the host's current pooled connection (nil when there is none).
func (e *testEnv) pooledConn() *conn {
	e.hs.mu.Lock()
	defer e.hs.mu.Unlock()
	return e.hs.slots[e.host].conn
}

func TestKeepaliveOverSSH(t *testing.T) {
	e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(1))
	e.hs.budgets.keepaliveInterval = 10 * time.Millisecond
	e.hs.budgets.keepaliveTimeout = 200 * time.Millisecond
	must(e.hs.pooled(context.Background(), e.host))
	c := e.pooledConn()
	testutil.WaitFor(t, waitLong, "three keepalives answered", func() (bool, error) {
		n := e.ssh.Stats().Keepalives
		return n >= 3, fmt.Errorf("%d keepalives answered", n)
	})
	if !c.alive() {
		t.Fatal("answered keepalives killed the connection")
	}
	e.ssh.AnswerKeepalives(false)
	testutil.WaitFor(t, waitLong, "the unanswered keepalive to kill the connection", connDead(c))
	if len(e.logs.find(`"msg":"libvirt host keepalive failed"`)) != 1 {
		t.Errorf("no keepalive failed line: %q", e.logs.all())
	}
	e.ssh.AnswerKeepalives(true)
	if _, err := must(e.hs.pooled(context.Background(), e.host)).ConnectGetHostname(); err != nil {
		t.Fatalf("after the redial: %v", err)
	}
	if e.pooledConn() == c {
		t.Fatal("the dead connection was handed out again")
	}
}

func TestLibvirtDisconnectMarksDead(t *testing.T) {
	e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(0))
	must(e.hs.pooled(context.Background(), e.host))
	c := e.pooledConn()
	e.fake.KillConnections() // libvirtd goes away; the SSH session stays up
	testutil.WaitFor(t, waitLong, "go-libvirt's disconnect to mark the connection dead", connDead(c))
	if _, err := must(e.hs.pooled(context.Background(), e.host)).ConnectGetHostname(); err != nil {
		t.Fatal(err)
	}
}
