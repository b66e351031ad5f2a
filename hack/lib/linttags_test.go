package lib_test

import (
	"bufio"
	"go/build/constraint"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLintTagsCoverEveryFile checks what `make lint` rests on: vet and staticcheck run
// once, with every tag of the Makefile's BUILD_TAGS set, and that one run must read every
// Go file of the module. A file whose build constraint is false with those tags (a tag
// missing from BUILD_TAGS, or a "!tag" that one of them turns off) would never be linted.
func TestLintTagsCoverEveryFile(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^BUILD_TAGS := (.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile has no BUILD_TAGS := line")
	}
	set := map[string]bool{"linux": true, "amd64": true, "unix": true, "gc": true}
	for _, tag := range strings.Fields(string(m[1])) {
		set[tag] = true
	}
	out, err := exec.Command("git", "-C", "../..", "ls-files", "*.go").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	files := strings.Fields(string(out))
	if len(files) < 100 {
		t.Fatalf("git ls-files found %d Go files; want the module's", len(files))
	}
	for _, f := range files {
		expr := buildConstraint(t, filepath.Join("../..", f))
		if expr == nil {
			continue
		}
		onLinux := expr.Eval(func(tag string) bool { return set[tag] || strings.HasPrefix(tag, "go1.") })
		// The other operating systems' side of a split by GOOS (pump_other.go beside
		// pump_linux.go): no lint on this machine reads it, and no tag would make it.
		otherOS := expr.Eval(func(tag string) bool {
			return tag != "linux" && (set[tag] || tag == "darwin" || strings.HasPrefix(tag, "go1."))
		})
		if !onLinux && !otherOS {
			t.Errorf("%s: //go:build %s is false with BUILD_TAGS (%s): lint would never read it; add its tag to BUILD_TAGS", f, expr, m[1])
		}
	}
}

// buildConstraint is the //go:build line of a Go file's header, or nil.
func buildConstraint(t *testing.T, path string) constraint.Expr {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "package ") {
			return nil
		}
		if constraint.IsGoBuild(line) {
			expr, err := constraint.Parse(line)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			return expr
		}
	}
	return nil
}
