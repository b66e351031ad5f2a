package sshtest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func echo(c net.Conn) { _, _ = io.Copy(c, c) }

// waitLong is the deadline of a wait on the server's counters: one only a broken test
// reaches.
const waitLong = testutil.WaitLong

func dial(t *testing.T, e *Env) *ssh.Client {
	t.Helper()
	c, err := e.Dial()
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestForwardsUnixSocketToHandler(t *testing.T) {
	e := NewEnv(t, echo)
	c := dial(t, e)
	conn, err := c.Dial("unix", e.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q, %v", buf, err)
	}
	if s := e.Stats(); s.SSHConns != 1 || s.Channels != 1 || s.OpenChannels != 1 {
		t.Fatalf("stats with one channel open: %+v", s)
	}
	_ = conn.Close()
	testutil.WaitFor(t, waitLong, "the channel to be counted closed", func() (bool, error) {
		st := e.Stats()
		return st.OpenChannels == 0, fmt.Errorf("stats %+v", st)
	})
}

func TestRejectsForwardingItCannotServe(t *testing.T) {
	e := NewEnv(t, echo)
	c := dial(t, e)
	if _, err := c.Dial("unix", "/run/other.sock"); err == nil || !strings.Contains(err.Error(), "No such file") {
		t.Fatalf("unknown socket: %v", err)
	}
	e.RefuseForwarding(true)
	if _, err := c.Dial("unix", e.Socket); err == nil || !strings.Contains(err.Error(), "administratively prohibited") {
		t.Fatalf("refused forwarding: %v", err)
	}
	e.RefuseForwarding(false)
	conn, err := c.Dial("unix", e.Socket)
	if err != nil {
		t.Fatalf("after allowing again: %v", err)
	}
	_ = conn.Close()
	if s := e.Stats(); s.RefusedOpens != 2 || s.Channels != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestRejectsUnauthorizedKeyAndWrongUser(t *testing.T) {
	e := NewEnv(t, echo)
	e.Revoke(e.Signer().PublicKey())
	if _, err := e.Dial(); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("revoked key: %v", err)
	}
	e.Authorize(e.Signer().PublicKey())
	e.User = "someone-else"
	if _, err := e.Dial(); err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("wrong user: %v", err)
	}
	testutil.WaitFor(t, waitLong, "two failed handshakes", func() (bool, error) {
		st := e.Stats()
		return st.AuthFailures == 2, fmt.Errorf("stats %+v", st)
	})
	if s := e.Stats(); s.SSHConns != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestHostKeyChangeIsDetected(t *testing.T) {
	e := NewEnv(t, echo)
	if _, err := e.RotateHostKey(); err != nil {
		t.Fatal(err)
	}
	_, err := e.Dial()
	var ke *knownhosts.KeyError
	if !errors.As(err, &ke) || len(ke.Want) == 0 {
		t.Fatalf("dial after host key change: %v, want a knownhosts.KeyError with the old key", err)
	}
	if err := e.RewriteKnownHosts(); err != nil {
		t.Fatal(err)
	}
	dial(t, e)
}

func TestClientKeyRotation(t *testing.T) {
	e := NewEnv(t, echo)
	old := e.Signer()
	if err := e.RotateClientKey(PEM); err != nil {
		t.Fatal(err)
	}
	dial(t, e) // reads the new PEM key from KeyFile
	cfg := &ssh.ClientConfig{User: e.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(old)},
		HostKeyCallback: ssh.FixedHostKey(e.HostKey())}
	if _, err := ssh.Dial("tcp", e.Addr, cfg); err == nil {
		t.Fatal("the revoked key still logs in")
	}
}

func TestKeepaliveReplies(t *testing.T) {
	e := NewEnv(t, echo)
	c := dial(t, e)
	if _, _, err := c.SendRequest("keepalive@openssh.com", true, nil); err != nil {
		t.Fatalf("keepalive: %v", err)
	}
	e.AnswerKeepalives(false)
	res := make(chan error, 1)
	go func() {
		_, _, err := c.SendRequest("keepalive@openssh.com", true, nil)
		res <- err
	}()
	testutil.WaitFor(t, waitLong, "the second keepalive to arrive", func() (bool, error) {
		st := e.Stats()
		return st.Keepalives == 2, fmt.Errorf("stats %+v", st)
	})
	select {
	case err := <-res:
		t.Fatalf("a swallowed keepalive was answered: %v", err)
	default:
	}
	e.KillConnections()
	if err := <-res; err == nil {
		t.Fatal("keepalive on a killed connection succeeded")
	}
}

func TestStalledHandshake(t *testing.T) {
	e := NewEnv(t, echo)
	e.StallHandshakes(true)
	tcp, err := net.Dial("tcp", e.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	cfg, _ := e.ClientConfig()
	res := make(chan error, 1)
	go func() {
		_, _, _, err := ssh.NewClientConn(tcp, e.Addr, cfg)
		res <- err
	}()
	testutil.WaitFor(t, waitLong, "the stalled TCP connection", func() (bool, error) {
		st := e.Stats()
		return st.TCPConns == 1, fmt.Errorf("stats %+v", st)
	})
	select {
	case err := <-res:
		t.Fatalf("a stalled handshake finished: %v", err)
	default:
	}
	e.KillConnections()
	if err := <-res; err == nil {
		t.Fatal("handshake on a killed connection succeeded")
	}
	e.StallHandshakes(false)
	dial(t, e)
}

func TestKillConnectionsAndPerConnectionCounts(t *testing.T) {
	e := NewEnv(t, echo)
	pooled := dial(t, e)
	pc, err := pooled.Dial("unix", e.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	fresh := dial(t, e)
	for range 2 {
		fc, err := fresh.Dial("unix", e.Socket)
		if err != nil {
			t.Fatal(err)
		}
		_ = fc.Close()
	}
	testutil.WaitFor(t, waitLong, "the fresh connection's channels to close", func() (bool, error) {
		st := e.Stats()
		return st.OpenChannels == 1, fmt.Errorf("stats %+v", st)
	})
	conns := e.Conns()
	if len(conns) != 2 || conns[0].Channels != 1 || conns[0].OpenChannels != 1 || conns[1].Channels != 2 {
		t.Fatalf("conns %+v", conns)
	}
	e.KillConnections()
	if err := pooled.Wait(); err == nil {
		t.Fatal("pooled connection ended cleanly after a kill")
	}
	testutil.WaitFor(t, waitLong, "both connections to be counted closed", func() (bool, error) {
		st := e.Stats()
		return st.OpenSSHConns == 0, fmt.Errorf("stats %+v", st)
	})
	if s := e.Stats(); s.KilledSSHConns != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestKillOneConnection(t *testing.T) {
	e := NewEnv(t, echo)
	a := dial(t, e)
	b := dial(t, e)
	testutil.WaitFor(t, waitLong, "two open connections", func() (bool, error) {
		st := e.Stats()
		return st.OpenSSHConns == 2, fmt.Errorf("stats %+v", st)
	})
	if !e.KillConn(1) {
		t.Fatal("KillConn(1) found no open connection")
	}
	_ = a.Wait()
	if _, _, err := b.SendRequest("keepalive@openssh.com", true, nil); err != nil {
		t.Fatalf("the other connection died too: %v", err)
	}
}

func TestSecondHostSharesTheCredentials(t *testing.T) {
	e := NewEnv(t, echo)
	second := e.AddHost(t, echo)
	dialSecond := func() (*ssh.Client, error) {
		cfg, err := e.ClientConfig()
		if err != nil {
			return nil, err
		}
		return ssh.Dial("tcp", second.Addr(), cfg)
	}
	c, err := dialSecond()
	if err != nil {
		t.Fatalf("second host with the shared files: %v", err)
	}
	_ = c.Close()
	if err := e.RotateClientKey(OpenSSH); err != nil {
		t.Fatal(err)
	}
	if c, err = dialSecond(); err != nil {
		t.Fatalf("second host after key rotation: %v", err)
	}
	_ = c.Close()
	dial(t, e) // the first host still verifies against the rewritten file
}

func TestFrozenServerHoldsTrafficUntilThawedOrKilled(t *testing.T) {
	e := NewEnv(t, echo)
	c := dial(t, e)
	e.Freeze(true)
	keepalive := make(chan error, 1)
	go func() {
		_, _, err := c.SendRequest("keepalive@openssh.com", true, nil)
		keepalive <- err
	}()
	// A frozen server writes nothing, so no reply can have arrived.
	select {
	case err := <-keepalive:
		t.Fatalf("a frozen server answered a keepalive: %v", err)
	default:
	}
	e.Freeze(false)
	if err := <-keepalive; err != nil {
		t.Fatalf("keepalive after thawing: %v", err)
	}

	conn, err := c.Dial("unix", e.Socket)
	if err != nil {
		t.Fatal(err)
	}
	e.Freeze(true)
	res := make(chan error, 1)
	go func() {
		// Far more than the SSH window and the TCP buffers hold.
		_, err := conn.Write(make([]byte, 64<<20))
		res <- err
	}()
	e.KillConnections()
	if err := <-res; err == nil {
		t.Fatal("a write into a frozen, killed connection succeeded")
	}
	e.Freeze(false)
	dial(t, e)
}
