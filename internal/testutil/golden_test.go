package testutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGoldenMatch(t *testing.T) {
	r := &fakeT{TB: t}
	if r.run(func() { Golden(r, "sample.golden", "line one\nline two\nline three\n") }) {
		t.Fatalf("an equal output failed: %s", r.msg)
	}
	if r.run(func() { Golden(r, "sample.golden", []byte("line one\nline two\nline three\n")) }) {
		t.Fatalf("an equal output as bytes failed: %s", r.msg)
	}
}

// TestGoldenMismatchShowsDiff: the message names the file and shows the changed line as
// removed from the file and added in the output, not both texts whole.
func TestGoldenMismatchShowsDiff(t *testing.T) {
	r := &fakeT{TB: t}
	if !r.run(func() { Golden(r, "sample.golden", "line one\nline 2\nline three\n") }) {
		t.Fatal("a different output passed")
	}
	for _, want := range []string{filepath.Join("testdata", "sample.golden"), "-want (file) +got (output)", `-`, `"line two\n"`, `+`, `"line 2\n"`} {
		if !strings.Contains(r.msg, want) {
			t.Errorf("message lacks %q:\n%s", want, r.msg)
		}
	}
	if strings.Count(r.msg, "line one") > 1 {
		t.Errorf("an unchanged line appears more than once:\n%s", r.msg)
	}
}

func TestGoldenMissingFile(t *testing.T) {
	r := &fakeT{TB: t}
	if !r.run(func() { Golden(r, "no-such.golden", "x") }) || !strings.Contains(r.msg, "no-such.golden") || !strings.Contains(r.msg, "-update") {
		t.Fatalf("a missing golden file gave %q", r.msg)
	}
}

func TestGoldenUpdateRewrites(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.Mkdir("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	*update = true
	t.Cleanup(func() { *update = false })
	Golden(t, "new.golden", "fresh\n")
	got, err := os.ReadFile(filepath.Join("testdata", "new.golden"))
	if err != nil || string(got) != "fresh\n" {
		t.Fatalf("-update wrote %q, %v", got, err)
	}
}
