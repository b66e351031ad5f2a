package testutil

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// update is the -update flag of every test binary that uses Golden.
var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// Golden compares got with the file testdata/name of the package under test, or, when
// the test runs with -update, rewrites that file with got. A mismatch fails the test
// with the file's name and a line diff (-want is the file, +got the output).
func Golden[T ~string | ~[]byte](t testing.TB, name string, got T) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatalf("rewriting golden file %s: %v", path, err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file %s (run go test -update to create it): %v", path, err)
	}
	if string(want) != string(got) {
		t.Fatalf("%s differs from the output (run go test -update if the change is intended); -want (file) +got (output):\n%s",
			path, cmp.Diff(lines(string(want)), lines(string(got))))
	}
}

// lines splits s after each newline, so that the diff shows whole lines and a missing
// final newline as a difference of the last line.
func lines(s string) []string { return strings.SplitAfter(s, "\n") }
