package kvm2

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"slices"

	"github.com/go-logr/logr"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// credentials is the SSH material for one dial, read from the files the kvm-ssh Secret is
// mounted as.
type credentials struct {
	signer ssh.Signer
	// hostKey verifies the server's key; nil when insecureIgnoreHostKey is on.
	hostKey ssh.HostKeyCallback
}

// loadCredentials reads and parses the private key and known_hosts. It runs on every dial
// and caches nothing, so a rotated Secret is picked up by the next connection without a
// restart. A file that is missing is transient (the Secret may not have landed yet); a
// file that exists but does not parse is permanent, and its error names the path and
// never quotes the key.
func loadCredentials(cfg provider.KVMConfig) (credentials, error) {
	keyBytes, err := readCredentialFile("ssh key", cfg.SSHKeyFile)
	if err != nil {
		return credentials{}, err
	}
	signer, err := ssh.ParsePrivateKey(keyBytes)
	if err != nil {
		return credentials{}, provider.Permanent(fmt.Errorf("parsing ssh key file %s: %w", cfg.SSHKeyFile, err))
	}
	cr := credentials{signer: signer}
	if cfg.InsecureIgnoreHostKey {
		return cr, nil
	}
	if _, err := readCredentialFile("known_hosts", cfg.KnownHostsFile); err != nil {
		return credentials{}, err
	}
	cb, err := knownhosts.New(cfg.KnownHostsFile)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return credentials{}, provider.Transient(fmt.Errorf("reading known_hosts file %s: %w", cfg.KnownHostsFile, err))
		}
		return credentials{}, provider.Permanent(fmt.Errorf("parsing known_hosts file %s: %w", cfg.KnownHostsFile, err))
	}
	cr.hostKey = cb
	return cr, nil
}

// readCredentialFile reads one credential file. Only the error's wording names what kind of
// file it is; the content is never part of an error.
func readCredentialFile(kind, path string) ([]byte, error) {
	if path == "" {
		return nil, provider.Permanent(fmt.Errorf("no %s file configured", kind))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		// Missing or unreadable: both are what a Secret that has not been mounted (yet)
		// looks like, so a retry may succeed.
		return nil, provider.Transient(fmt.Errorf("reading %s file %s: %w", kind, path, err))
	}
	return b, nil
}

// checkCredentialFiles is what New does with the credentials: it only looks whether the
// files exist and warns when they do not, so the manager starts before the Secret lands.
func checkCredentialFiles(cfg provider.KVMConfig, log logr.Logger) {
	if cfg.InsecureIgnoreHostKey {
		log.Info("WARNING: insecureIgnoreHostKey is on; SSH host keys are not verified and a man in the middle could pose as a hypervisor")
	}
	files := []struct{ kind, path string }{{"ssh key", cfg.SSHKeyFile}}
	if !cfg.InsecureIgnoreHostKey {
		files = append(files, struct{ kind, path string }{"known_hosts", cfg.KnownHostsFile})
	}
	for _, f := range files {
		if _, err := os.Stat(f.path); err != nil {
			log.Info("WARNING: credential file not readable yet; connections to hosts fail until it appears",
				"file", f.kind, "path", f.path, "error", err.Error())
		}
	}
}

// clientConfig is the SSH client configuration for user at address, whose TCP peer is
// remote.
func (cr credentials) clientConfig(user, address string, remote net.Addr) *ssh.ClientConfig {
	cfg := &ssh.ClientConfig{
		User: user,
		Auth: []ssh.AuthMethod{ssh.PublicKeys(cr.signer)},
	}
	if cr.hostKey == nil {
		cfg.HostKeyCallback = ssh.InsecureIgnoreHostKey()
		return cfg
	}
	cfg.HostKeyCallback = cr.hostKey
	cfg.HostKeyAlgorithms = knownHostAlgorithms(cr.hostKey, address, remote)
	return cfg
}

// probeKey is a key no host has; asking known_hosts about it lists the keys it does hold.
var probeKey, _ = ssh.NewPublicKey(ed25519.PublicKey(make([]byte, ed25519.PublicKeySize)))

// knownHostAlgorithms returns the host key algorithms known_hosts holds a key of for
// address, so the handshake asks the server for a key it can verify. Without this a server
// offering several key types may present one known_hosts has no line for (ssh-keyscan -t
// ed25519, say), which would read as a changed host key. nil leaves the default list.
func knownHostAlgorithms(cb ssh.HostKeyCallback, address string, remote net.Addr) []string {
	var keyErr *knownhosts.KeyError
	if err := cb(address, remote, probeKey); !errors.As(err, &keyErr) || len(keyErr.Want) == 0 {
		return nil
	}
	var algos []string
	for _, k := range keyErr.Want {
		typ := k.Key.Type()
		if typ == ssh.KeyAlgoRSA {
			algos = append(algos, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256)
		}
		algos = append(algos, typ)
	}
	slices.Sort(algos)
	return slices.Compact(algos)
}
