package sshtest

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// DefaultSocket is libvirt's socket path on a host, the path NewEnv serves.
const DefaultSocket = "/var/run/libvirt/libvirt-sock"

// KeyFormat selects how WriteKey stores a private key.
type KeyFormat int

const (
	// OpenSSH is an ed25519 key in OpenSSH's own format, what ssh-keygen
	// writes by default.
	OpenSSH KeyFormat = iota
	// PEM is an ECDSA P-256 key in a PEM "EC PRIVATE KEY" block, what
	// ssh-keygen -m PEM -t ecdsa writes.
	PEM
)

// WriteKey generates a client key, writes its private half to path with
// mode 0600 and returns it as a signer.
func WriteKey(path string, format KeyFormat) (ssh.Signer, error) {
	var (
		block *pem.Block
		key   any
	)
	switch format {
	case OpenSSH:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("generating ed25519 key: %w", err)
		}
		if block, err = ssh.MarshalPrivateKey(k, "sshtest"); err != nil {
			return nil, fmt.Errorf("encoding key for %s: %w", path, err)
		}
		key = k
	case PEM:
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("generating ecdsa key: %w", err)
		}
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, fmt.Errorf("encoding key for %s: %w", path, err)
		}
		block, key = &pem.Block{Type: "EC PRIVATE KEY", Bytes: der}, k
	default:
		return nil, fmt.Errorf("unknown key format %d", format)
	}
	signer, err := ssh.NewSignerFromKey(key)
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, err
	}
	return signer, nil
}

// WriteKnownHosts writes a known_hosts file holding keys for addr
// (host:port), in the form ssh-keyscan would print it.
func WriteKnownHosts(path, addr string, keys ...ssh.PublicKey) error {
	var b []byte
	for _, k := range keys {
		b = append(b, knownhosts.Line([]string{knownhosts.Normalize(addr)}, k)...)
		b = append(b, '\n')
	}
	return writeFileAtomic(path, b, 0o644)
}

// writeFileAtomic replaces path in one step, so a reader never sees half a
// file: tests rotate credentials while connections are being dialled.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".sshtest-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// Env is a ready SSH server with credential files for it, the way the
// provider finds them on disk: a private key whose public half the server
// authorizes, and a known_hosts file holding the server's host key under
// its address. The embedded Server's methods change it at run time.
type Env struct {
	*Server
	Addr           string // host:port to dial
	User           string // the user to log in as
	Socket         string // the forwarded socket path served (DefaultSocket)
	Dir            string // temporary directory holding the files
	KeyFile        string // Dir/id_ed25519, OpenSSH format
	KnownHostsFile string // Dir/known_hosts

	mu      sync.Mutex
	signer  ssh.Signer
	servers []*Server // Server first, then AddHost's
}

// NewEnv starts a Server, writes the credential files into a temporary
// directory and routes DefaultSocket to h (nil: no route). Everything is
// torn down with t.Cleanup; handlers must return once their connection is
// closed, or the cleanup waits for them.
func NewEnv(t testing.TB, h Handler) *Env {
	t.Helper()
	s, err := NewServer("")
	if err != nil {
		t.Fatalf("starting ssh server: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	dir := t.TempDir()
	e := &Env{Server: s, Addr: s.Addr(), User: s.User(), Socket: DefaultSocket, Dir: dir,
		KeyFile: filepath.Join(dir, "id_ed25519"), KnownHostsFile: filepath.Join(dir, "known_hosts"),
		servers: []*Server{s}}
	e.signer, err = WriteKey(e.KeyFile, OpenSSH)
	if err != nil {
		t.Fatal(err)
	}
	s.Authorize(e.signer.PublicKey())
	if err := e.RewriteKnownHosts(); err != nil {
		t.Fatal(err)
	}
	if h != nil {
		s.Handle(DefaultSocket, h)
	}
	return e
}

// Signer is the client key currently in KeyFile.
func (e *Env) Signer() ssh.Signer {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.signer
}

// AddHost starts another server for the same credentials, as a second
// hypervisor would be set up: it accepts User with the current key, its host
// key is added to KnownHostsFile, and DefaultSocket is routed to h. Key
// rotation and RewriteKnownHosts cover it from then on; its own switches
// and counters are on the returned Server. It is closed with t.Cleanup.
func (e *Env) AddHost(t testing.TB, h Handler) *Server {
	t.Helper()
	s, err := NewServer(e.User)
	if err != nil {
		t.Fatalf("starting ssh server: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	e.mu.Lock()
	s.Authorize(e.signer.PublicKey())
	e.servers = append(e.servers, s)
	e.mu.Unlock()
	if h != nil {
		s.Handle(DefaultSocket, h)
	}
	if err := e.RewriteKnownHosts(); err != nil {
		t.Fatal(err)
	}
	return s
}

func (e *Env) allServers() []*Server {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*Server(nil), e.servers...)
}

// RewriteKnownHosts writes every server's current host key to
// KnownHostsFile, as re-running ssh-keyscan after RotateHostKey would.
func (e *Env) RewriteKnownHosts() error {
	var b []byte
	for _, s := range e.allServers() {
		b = append(b, knownhosts.Line([]string{knownhosts.Normalize(s.Addr())}, s.HostKey())...)
		b = append(b, '\n')
	}
	return writeFileAtomic(e.KnownHostsFile, b, 0o644)
}

// RotateClientKey writes a new key in format to KeyFile, authorizes it on
// every server and revokes the previous one, as rotating the operator's key
// on every host and in the Secret would.
func (e *Env) RotateClientKey(format KeyFormat) error {
	signer, err := WriteKey(e.KeyFile, format)
	if err != nil {
		return err
	}
	e.mu.Lock()
	old := e.signer
	e.signer = signer
	e.mu.Unlock()
	for _, s := range e.allServers() {
		s.Authorize(signer.PublicKey())
		s.Revoke(old.PublicKey())
	}
	return nil
}

// ClientConfig reads KeyFile and KnownHostsFile now and returns a client
// configuration that logs in as User with that key and verifies the host
// against that file.
func (e *Env) ClientConfig() (*ssh.ClientConfig, error) {
	pemBytes, err := os.ReadFile(e.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("reading ssh key file %s: %w", e.KeyFile, err)
	}
	signer, err := ssh.ParsePrivateKey(pemBytes)
	if err != nil {
		return nil, fmt.Errorf("parsing ssh key file %s: %w", e.KeyFile, err)
	}
	hostKeys, err := knownhosts.New(e.KnownHostsFile)
	if err != nil {
		return nil, fmt.Errorf("reading known_hosts file %s: %w", e.KnownHostsFile, err)
	}
	return &ssh.ClientConfig{User: e.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: hostKeys, Timeout: 10 * time.Second}, nil
}

// Dial opens an SSH connection to the server with ClientConfig.
func (e *Env) Dial() (*ssh.Client, error) {
	cfg, err := e.ClientConfig()
	if err != nil {
		return nil, err
	}
	return ssh.Dial("tcp", e.Addr, cfg)
}
