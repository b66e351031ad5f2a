package framework

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// HostEnv is the local libvirt host as hack/libvirt-host.sh describes it in its env file
// (the KVM2_TEST_* variables).
type HostEnv struct {
	Address, User, Key, KnownHosts, Socket, Pool, PoolPath string
	Bridge, BridgeIP, BridgeSubnet, DomainType             string
}

// LoadHostEnv reads the KVM2_TEST_* variables, failing the test on the first one unset
// with its name and how (a sentence such as "run `make test-e2e`") to set them.
func LoadHostEnv(t testing.TB, how string) HostEnv {
	t.Helper()
	get := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			t.Fatalf("%s is not set: %s", name, how)
		}
		return v
	}
	return HostEnv{
		Address: get("KVM2_TEST_ADDRESS"), User: get("KVM2_TEST_USER"), Key: get("KVM2_TEST_KEY"),
		KnownHosts: get("KVM2_TEST_KNOWN_HOSTS"), Socket: get("KVM2_TEST_SOCKET"), Pool: get("KVM2_TEST_POOL"),
		PoolPath: get("KVM2_TEST_POOL_PATH"), Bridge: get("KVM2_TEST_BRIDGE"), BridgeIP: get("KVM2_TEST_BRIDGE_IP"),
		BridgeSubnet: get("KVM2_TEST_BRIDGE_SUBNET"), DomainType: get("KVM2_TEST_DOMAIN_TYPE"),
	}
}

// RepoRoot is the top directory of the module holding the working directory (a test runs
// in its package's directory).
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// GuestImage is the test guest's image and its sha256: E2E_GUEST_IMAGE if set, else what
// hack/guest-image.sh builds (or finds cached).
func GuestImage(t testing.TB) (path, sum string) {
	t.Helper()
	path = os.Getenv("E2E_GUEST_IMAGE")
	if path == "" {
		out, err := exec.Command(filepath.Join(RepoRoot(t), "hack", "guest-image.sh")).Output()
		if err != nil {
			t.Fatalf("hack/guest-image.sh: %v", err)
		}
		path = strings.TrimSpace(string(out))
	}
	sum, err := fileSHA256(path)
	if err != nil {
		t.Fatalf("guest image: %v", err)
	}
	return path, sum
}

// NoNftImage is the image hack/guest-image.sh builds beside guestImage without the nft
// binary, and its sha256: a guest on which the egress fence cannot load.
func NoNftImage(t testing.TB, guestImage string) (path, sum string) {
	t.Helper()
	path = filepath.Join(filepath.Dir(guestImage), "guest-no-nft.qcow2")
	sum, err := fileSHA256(path)
	if err != nil {
		t.Fatalf("the guest image without nft (hack/guest-image.sh builds it beside %s): %v", guestImage, err)
	}
	return path, sum
}

// fileSHA256 is the hex sha256 of path: the first field of path.sha256 when that file
// exists (hack/guest-image.sh writes it), else worked out from the file.
func fileSHA256(path string) (string, error) {
	if b, err := os.ReadFile(path + ".sha256"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			return f[0], nil
		}
		return "", fmt.Errorf("%s.sha256 is empty", path)
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
