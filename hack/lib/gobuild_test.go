package lib_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

type goMod struct {
	Module  struct{ Path string }
	Require []struct{ Path, Version string }
}

func readGoMod(t *testing.T, path string) goMod {
	t.Helper()
	out, err := exec.Command("go", "mod", "edit", "-json", path).Output()
	if err != nil {
		t.Fatalf("go mod edit -json %s: %v", path, err)
	}
	var m goMod
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

func emptyModule(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module local/wrapper\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The wrapper modules hack/envtest-assets.sh and hack/helm.sh build in require every
// module the operator's go.mod requires, at the same version: a version that differs
// anywhere below k8s.io/api compiles it (and everything above it) a second time.
func TestWrapperModulesTakeTheOperatorsVersions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kubernetes")
	if out, err := exec.Command("bash", "-c", `source ./gobuild.sh && wrapper_module "$1" kubernetes`, "bash", dir).CombinedOutput(); err != nil {
		t.Fatalf("wrapper_module: %v\n%s", err, out)
	}
	wrapper := readGoMod(t, filepath.Join(dir, "go.mod"))
	if wrapper.Module.Path != "local/kubernetes" {
		t.Errorf("wrapper module path %q, want local/kubernetes", wrapper.Module.Path)
	}
	want := readGoMod(t, "../../go.mod").Require
	got := map[string]string{}
	for _, r := range wrapper.Require {
		got[r.Path] = r.Version
	}
	if len(want) < 10 {
		t.Fatalf("the operator's go.mod has %d requirements; expected its whole list", len(want))
	}
	for _, r := range want {
		if got[r.Path] != r.Version {
			t.Errorf("wrapper requires %s at %q, the operator at %q", r.Path, got[r.Path], r.Version)
		}
	}
	if len(got) != len(want) {
		t.Errorf("wrapper requires %d modules, the operator %d", len(got), len(want))
	}
}

func TestWrapperModulesRefuseAGoModWithoutRequirements(t *testing.T) {
	bare := filepath.Join(emptyModule(t), "go.mod")
	cmd := exec.Command("bash", "-c", `source ./gobuild.sh && require_operator_versions "$1"`, "bash", emptyModule(t))
	cmd.Env = append(os.Environ(), "OPERATOR_GO_MOD="+bare)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("require_operator_versions over %s succeeded; want an error", bare)
	}
	if !strings.Contains(string(out), "no require lines in "+bare) {
		t.Errorf("error %q does not name %s", out, bare)
	}
}
