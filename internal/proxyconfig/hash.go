package proxyconfig

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"

	"golang.org/x/crypto/scrypt"
)

// SpecHashInput is what the spec hash covers, in place of spec.cloudInit, for a Proxy with
// spec.proxy: the user-data UserData renders for c and user, but with the BasicAuth line
// left out, followed by the user name and a slow salted digest (scrypt) of the password.
// A changed range list, port, user cloud-init or a rotated password changes it, so the
// instance is replaced as after any other spec change; yet the spec hash, which status
// and the instance's labels show, offers no fast way to test guesses of the password.
func SpecHashInput(c Config, user string) (string, error) {
	if _, _, err := c.validate(); err != nil {
		return "", err
	}
	creds := c.Credentials
	c.Credentials = nil
	if c.WireGuard != nil {
		c.WireGuard = c.WireGuard.redacted()
	}
	doc, err := UserData(c, user)
	if err != nil {
		return "", err
	}
	if creds == nil {
		return string(doc), nil
	}
	digest, err := passwordDigest(*creds)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s\nbasic-auth %s %s\n", doc, creds.Username, digest), nil
}

// The digest's cost: 16 MiB and some tens of milliseconds, paid once per distinct
// credential per process thanks to digestCache, one at a time.
const (
	scryptN   = 1 << 14
	scryptR   = 8
	scryptP   = 1
	digestLen = 32
	// maxCachedDigests bounds the cache; it is emptied when full.
	maxCachedDigests = 4096
)

var digestCache = struct {
	sync.Mutex
	m map[[sha256.Size]byte]string
}{m: map[[sha256.Size]byte]string{}}

func passwordDigest(c Credentials) (string, error) {
	key := sha256.Sum256([]byte(c.Username + "\x00" + c.Password))
	// Held while computing too: one digest at a time bounds the memory scrypt takes.
	digestCache.Lock()
	defer digestCache.Unlock()
	if d, ok := digestCache.m[key]; ok {
		return d, nil
	}
	salt := []byte("egress-proxies-operator spec hash\x00" + c.Username)
	raw, err := scrypt.Key([]byte(c.Password), salt, scryptN, scryptR, scryptP, digestLen)
	if err != nil {
		return "", fmt.Errorf("digest of the proxy password for the spec hash: %w", err)
	}
	if len(digestCache.m) >= maxCachedDigests {
		clear(digestCache.m)
	}
	d := hex.EncodeToString(raw)
	digestCache.m[key] = d
	return d, nil
}

// CredentialsDigest is a slow salted digest (scrypt) of c, the same the spec hash holds:
// what a hash of the Proxy's intent, or a pool's template hash, may carry in place of the
// password. Computed once per distinct credential per process.
func CredentialsDigest(c Credentials) (string, error) {
	return passwordDigest(c)
}
