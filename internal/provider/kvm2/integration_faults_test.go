//go:build integration

package kvm2

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
)

// missingID names a domain that does not exist: a Get of it that answers NotFound proves
// the whole path (SSH, the forwarded socket, libvirt) works without creating anything.
func (e *itRealEnv) missingID() string {
	return ident.ProviderID(integrationHost, e.names.token+"-absent")
}

// reachable fails unless a Get over p's pooled connection gets as far as libvirt.
func (e *itRealEnv) reachable(t *testing.T, p *Provider, when string) {
	t.Helper()
	_, err := p.Get(itCtxFor(t), e.missingID())
	if !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("%s: get of a missing domain: %v, want NotFound (the host answering)", when, err)
	}
}

// TestKVM2Credentials_realHost: a missing key file is CredentialsUnavailable and
// transient, a public key in its place permanent; a key the host refuses and a changed
// host key are Unauthorized and permanent, each call dials once and gives up; writing the
// right files makes the next call work without a restart.
func TestKVM2Credentials_realHost(t *testing.T) {
	e := itNewRealEnv(t, "creds")
	p := e.newProvider(itEnvOptions{})

	// The Secret has not landed: transient, and the check says where to look.
	if err := os.Remove(e.key); err != nil {
		t.Fatal(err)
	}
	if st := itCheckOne(t, p); st.Ready || st.Reason != reasonCredentialsUnavailable || !strings.Contains(st.Message, e.key) {
		t.Fatalf("check without the key file: %+v, want CredentialsUnavailable naming %s", st, e.key)
	}
	_, err := p.Get(itCtxFor(t), e.missingID())
	itWantErr(t, err, provider.ErrTransient, "reading ssh key file "+e.key)
	// The public key in place of the private one: permanent.
	itCopyFile(t, e.host.key+".pub", e.key)
	_, err = p.Get(itCtxFor(t), e.missingID())
	itWantErr(t, err, provider.ErrPermanent, "parsing ssh key file "+e.key)

	itWriteFile(t, e.key, itStrangerKey(t))

	st := itCheckOne(t, p)
	if st.Ready || st.Reason != reasonUnauthorized || !itContainsAll(st.Message, "unable to authenticate", e.host.addr) {
		t.Fatalf("check with a key the host does not know: %+v, want Unauthorized", st)
	}
	dials := e.dials.Load()
	_, err = createSettled(itCtxFor(t), p, e.request(e.names.vm(1), "uid-creds"))
	itWantErr(t, err, provider.ErrPermanent, "unable to authenticate", "connecting to libvirt host "+integrationHost)
	_, err = p.Get(itCtxFor(t), e.missingID())
	itWantErr(t, err, provider.ErrPermanent, "unable to authenticate")
	if n := e.dials.Load() - dials; n != 2 {
		t.Errorf("a Create and a Get with a refused key dialled %d times, want once each (no retries)", n)
	}
	if n := e.img.gets.Load() + e.img.heads.Load(); n != 0 {
		t.Errorf("the image server was asked %d times before the host was reachable", n)
	}

	// The Secret is fixed: the same provider picks up the key on its next dial.
	itCopyFile(t, e.host.key, e.key)
	e.reachable(t, p, "after the key was rotated")
	if st := itCheckOne(t, p); !st.Ready {
		t.Fatalf("check after the key was rotated: %+v", st)
	}

	// The host key in known_hosts changes. The open connection stays in use; every new
	// dial refuses the host.
	itWriteFile(t, e.known, itStrangerKnownHosts(t, e.host.addr))
	dials = e.dials.Load()
	e.reachable(t, p, "on the connection opened before known_hosts changed")
	if n := e.dials.Load() - dials; n != 0 {
		t.Errorf("the pooled connection was redialled %d times", n)
	}
	st = itCheckOne(t, p)
	if st.Ready || st.Reason != reasonUnauthorized || !itContainsAll(st.Message, "key mismatch") {
		t.Fatalf("check with a changed host key: %+v, want Unauthorized (key mismatch)", st)
	}
	p2 := e.newProvider(itEnvOptions{})
	_, err = p2.Get(itCtxFor(t), e.missingID())
	itWantErr(t, err, provider.ErrPermanent, "key mismatch")

	itCopyFile(t, e.host.knownHosts, e.known)
	e.reachable(t, p2, "after known_hosts was fixed")
	if st := itCheckOne(t, p2); !st.Ready {
		t.Fatalf("check after known_hosts was fixed: %+v", st)
	}
}

// itStrangerKey is an OpenSSH private key no host knows.
func itStrangerKey(t *testing.T) []byte {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(block)
}

// itStrangerKnownHosts is a known_hosts file giving addr a host key it does not have.
func itStrangerKnownHosts(t *testing.T, addr string) []byte {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return []byte(knownhosts.Line([]string{knownhosts.Normalize(addr)}, key) + "\n")
}

func itWriteFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func itContainsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// TestKVM2HostDown_realHost: with sshd stopped, and with libvirtd stopped behind a
// running sshd, the host is Unreachable and calls fail transiently; once both are back
// the next call succeeds on a new connection.
func TestKVM2HostDown_realHost(t *testing.T) {
	e := itNewRealEnv(t, "down")
	p := e.newProvider(itEnvOptions{})
	// Whatever happens below, the host is left running.
	t.Cleanup(func() {
		e.host.hostScript(t, "start-sshd")
		e.host.hostScript(t, "start-libvirtd")
		itEnsurePoolRunning(t, e.host.pool)
	})
	e.reachable(t, p, "before the faults")

	t.Run("sshd stopped", func(t *testing.T) {
		e.host.hostScript(t, "stop-sshd")
		st := itCheckOne(t, p)
		if st.Ready || st.Reason != reasonUnreachable || !itContainsAll(st.Message, e.host.addr, "connection refused") {
			t.Fatalf("check with sshd stopped: %+v, want Unreachable (connection refused)", st)
		}
		_, err := p.Get(itCtxFor(t), e.missingID())
		itWantErr(t, err, provider.ErrTransient)
		_, err = p.Get(itCtxFor(t), e.missingID())
		itWantErr(t, err, provider.ErrTransient, "connection refused")

		e.host.hostScript(t, "start-sshd")
		dials := e.dials.Load()
		e.reachable(t, p, "the first call after sshd came back")
		if e.dials.Load() == dials {
			t.Errorf("the call after sshd came back did not redial")
		}
	})

	t.Run("libvirtd stopped", func(t *testing.T) {
		e.host.hostScript(t, "stop-libvirtd")
		st := itCheckOne(t, p)
		if st.Ready || st.Reason != reasonUnreachable || !itContainsAll(st.Message, "forwarding libvirt socket "+e.host.socket) {
			t.Fatalf("check with libvirtd stopped: %+v, want Unreachable (socket refused)", st)
		}
		if st.Details["libvirtVersion"] != "" {
			t.Errorf("details claim a libvirt version from a stopped libvirtd: %v", st.Details)
		}
		_, err := p.Get(itCtxFor(t), e.missingID())
		itWantErr(t, err, provider.ErrTransient)
		_, err = p.Get(itCtxFor(t), e.missingID())
		itWantErr(t, err, provider.ErrTransient, "forwarding libvirt socket "+e.host.socket)

		e.host.hostScript(t, "start-libvirtd")
		dials := e.dials.Load()
		e.reachable(t, p, "the first call after libvirtd came back")
		if e.dials.Load() == dials {
			t.Errorf("the call after libvirtd came back did not redial")
		}
		itEnsurePoolRunning(t, e.host.pool)
		if st := itCheckOne(t, p); !st.Ready {
			t.Fatalf("check after libvirtd came back: %+v", st)
		}
	})
}
