package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Without KUBEBUILDER_ASSETS, Start fails at once with a message that says how to get
// the binaries, instead of envtest's search for a default directory.
func TestStartWithoutAssetsNamesTheFix(t *testing.T) {
	t.Setenv("KUBEBUILDER_ASSETS", "")
	_, err := Start()
	if !errors.Is(err, ErrNoAssets) {
		t.Fatalf("Start() = %v, want ErrNoAssets", err)
	}
	for _, want := range []string{"KUBEBUILDER_ASSETS", "hack/envtest-assets.sh", "make test-unit"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not mention %s", err, want)
		}
	}
}

// A missing binary is named with where it was looked for.
func TestStartWithEmptyAssetsDirSaysWhere(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("KUBEBUILDER_ASSETS", dir)
	e, err := Start()
	if err == nil {
		_ = e.Stop()
		t.Fatal("Start succeeded with an empty KUBEBUILDER_ASSETS directory")
	}
	if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "make test-unit") {
		t.Errorf("%q does not name %s and make test-unit", err, dir)
	}
}

func TestCRDDirHoldsTheProjectsCRDs(t *testing.T) {
	dir, err := CRDDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"egress.hrajfrisbee.cz_proxies.yaml", "egress.hrajfrisbee.cz_providerhealths.yaml"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
}
