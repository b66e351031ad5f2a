package lib_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestEveryFuzzTargetHasACount checks in the unit tests what hack/fuzz-smoke.sh refuses at
// the end of `make test`: a Fuzz function of the default build without its
// //fuzzsmoke:count line right above it. Found here, it costs seconds instead of a CI run.
func TestEveryFuzzTargetHasACount(t *testing.T) {
	out, err := exec.Command("git", "-C", "../..", "ls-files", "*_test.go").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	fuzz := regexp.MustCompile(`^func (Fuzz[A-Za-z0-9_]*)\(.*\*testing\.F\)`)
	count := regexp.MustCompile(`^//fuzzsmoke:count [0-9]+$`)
	targets := 0
	for _, f := range strings.Fields(string(out)) {
		if strings.Contains(f, "/testdata/") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("../..", f))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		if regexp.MustCompile(`(?m)^//go:build`).Match(b) {
			continue // the script skips these too: not part of the default build
		}
		for i, l := range lines {
			m := fuzz.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			targets++
			if i == 0 || !count.MatchString(lines[i-1]) {
				t.Errorf("%s:%d: %s has no //fuzzsmoke:count N line right above it; hack/fuzz-smoke.sh would fail", f, i+1, m[1])
			}
		}
	}
	if targets == 0 {
		t.Fatal("found no fuzz targets; want the module's")
	}
}
