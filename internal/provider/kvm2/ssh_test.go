package kvm2

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// newOpenSSHKey returns a fresh ed25519 private key in OpenSSH format and its signer.
func newOpenSSHKey(t testing.TB) ([]byte, ssh.Signer) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "test")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(block), signer
}

// newPEMKey returns a fresh ECDSA private key in SEC 1 PEM format.
func newPEMKey(t testing.TB) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func knownHostsLine(t testing.TB, address string, key ssh.PublicKey) []byte {
	t.Helper()
	return []byte(knownhosts.Line([]string{knownhosts.Normalize(address)}, key) + "\n")
}

func TestLoadCredentials(t *testing.T) {
	dir := t.TempDir()
	keyPEM, signer := newOpenSSHKey(t)
	okKey := filepath.Join(dir, "id_ed25519")
	writeFile(t, okKey, keyPEM)
	pemKey := filepath.Join(dir, "id_ecdsa")
	writeFile(t, pemKey, newPEMKey(t))
	pubKey := filepath.Join(dir, "id_ed25519.pub")
	writeFile(t, pubKey, ssh.MarshalAuthorizedKey(signer.PublicKey()))
	okKnown := filepath.Join(dir, "known_hosts")
	writeFile(t, okKnown, knownHostsLine(t, "hv1:22", signer.PublicKey()))
	badKnown := filepath.Join(dir, "bad_known_hosts")
	writeFile(t, badKnown, []byte("hv1 ssh-ed25519 AAAA%%%notbase64\n"))
	missing := filepath.Join(dir, "missing")

	tests := []struct {
		name      string
		cfg       provider.KVMConfig
		wantClass error
		wantText  string
	}{
		{"openssh key", provider.KVMConfig{SSHKeyFile: okKey, KnownHostsFile: okKnown}, nil, ""},
		{"pem key", provider.KVMConfig{SSHKeyFile: pemKey, KnownHostsFile: okKnown}, nil, ""},
		{"insecure without known_hosts", provider.KVMConfig{SSHKeyFile: okKey, InsecureIgnoreHostKey: true}, nil, ""},
		{"key missing", provider.KVMConfig{SSHKeyFile: missing, KnownHostsFile: okKnown}, provider.ErrTransient, "reading ssh key file " + missing},
		{"public key instead of private", provider.KVMConfig{SSHKeyFile: pubKey, KnownHostsFile: okKnown}, provider.ErrPermanent, "parsing ssh key file " + pubKey},
		{"known_hosts missing", provider.KVMConfig{SSHKeyFile: okKey, KnownHostsFile: missing}, provider.ErrTransient, "reading known_hosts file " + missing},
		{"known_hosts garbage", provider.KVMConfig{SSHKeyFile: okKey, KnownHostsFile: badKnown}, provider.ErrPermanent, "parsing known_hosts file " + badKnown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cr, err := loadCredentials(tt.cfg)
			if tt.wantClass == nil {
				if err != nil {
					t.Fatalf("loadCredentials: %v", err)
				}
				if cr.signer == nil || (cr.hostKey == nil) != tt.cfg.InsecureIgnoreHostKey {
					t.Fatalf("credentials incomplete: signer %v, host key callback set %v", cr.signer != nil, cr.hostKey != nil)
				}
				return
			}
			if provider.Class(err) != tt.wantClass {
				t.Fatalf("error %v: class %v, want %v", err, provider.Class(err), tt.wantClass)
			}
			if !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("error %q does not name %q", err, tt.wantText)
			}
			if strings.Contains(err.Error(), "AAAA") || strings.Contains(err.Error(), string(keyPEM[40:60])) {
				t.Errorf("error quotes file content: %q", err)
			}
		})
	}
}

func TestLoadCredentialsRereadsEveryTime(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "id")
	first, s1 := newOpenSSHKey(t)
	writeFile(t, key, first)
	cfg := provider.KVMConfig{SSHKeyFile: key, InsecureIgnoreHostKey: true}
	cr, err := loadCredentials(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if string(cr.signer.PublicKey().Marshal()) != string(s1.PublicKey().Marshal()) {
		t.Fatal("first load returned another key")
	}
	second, s2 := newOpenSSHKey(t)
	writeFile(t, key, second)
	cr, err = loadCredentials(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if string(cr.signer.PublicKey().Marshal()) != string(s2.PublicKey().Marshal()) {
		t.Fatal("a rotated key was not picked up: credentials are cached")
	}
}

func TestKnownHostAlgorithms(t *testing.T) {
	dir := t.TempDir()
	_, ed := newOpenSSHKey(t)
	ecKey, err := ssh.ParsePrivateKey(newPEMKey(t))
	if err != nil {
		t.Fatal(err)
	}
	kh := filepath.Join(dir, "known_hosts")
	writeFile(t, kh, append(knownHostsLine(t, "hv1:22", ed.PublicKey()), knownHostsLine(t, "hv2:2222", ecKey.PublicKey())...))
	cb, err := knownhosts.New(kh)
	if err != nil {
		t.Fatal(err)
	}
	remote := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 22}
	if got := knownHostAlgorithms(cb, "hv1:22", remote); strings.Join(got, ",") != ssh.KeyAlgoED25519 {
		t.Errorf("hv1: %v, want only %s", got, ssh.KeyAlgoED25519)
	}
	if got := knownHostAlgorithms(cb, "hv2:2222", remote); strings.Join(got, ",") != ssh.KeyAlgoECDSA256 {
		t.Errorf("hv2: %v, want only %s", got, ssh.KeyAlgoECDSA256)
	}
	if got := knownHostAlgorithms(cb, "unknown:22", remote); got != nil {
		t.Errorf("unknown host: %v, want the default list (nil)", got)
	}
	var keyErr *knownhosts.KeyError
	if err := cb("hv1:22", remote, ecKey.PublicKey()); !errors.As(err, &keyErr) {
		t.Fatalf("a different key for hv1 must be a KeyError, got %v", err)
	}
}

func TestNewHostsOnlyWarnsAboutMissingFiles(t *testing.T) {
	sink, log := newLogSink(0)
	cfg := testHostConfig("h1")
	hs, err := newHosts("warn", cfg, log)
	if err != nil {
		t.Fatalf("missing credential files must not stop the provider: %v", err)
	}
	defer hs.close()
	for _, path := range []string{cfg.SSHKeyFile, cfg.KnownHostsFile} {
		if len(sink.find(`WARNING:`, `"path":"`+path+`"`)) != 1 {
			t.Errorf("no WARNING: line for %s: %q", path, sink.all())
		}
	}

	sink, log = newLogSink(0)
	dir := t.TempDir()
	key, _ := newOpenSSHKey(t)
	cfg = testHostConfig("h1")
	cfg.SSHKeyFile, cfg.KnownHostsFile, cfg.InsecureIgnoreHostKey = filepath.Join(dir, "id"), "", true
	writeFile(t, cfg.SSHKeyFile, key)
	hs2, err := newHosts("insecure", cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer hs2.close()
	lines := sink.find(`WARNING:`)
	if len(lines) != 1 || !strings.Contains(lines[0], "insecureIgnoreHostKey") {
		t.Errorf("want exactly the insecureIgnoreHostKey WARNING: line, got %q", sink.all())
	}
}

func TestNewHostsRejectsDuplicateHosts(t *testing.T) {
	cfg := testHostConfig("h1", "h1")
	_, err := newHosts("dup", cfg, discardLog())
	wantClass(t, err, provider.ErrPermanent, nil)
}
