package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
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
	for _, want := range []string{"KUBEBUILDER_ASSETS", "hack/envtest-assets.sh", "make envtest", "make test-unit"} {
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
	if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "make envtest") {
		t.Errorf("%q does not name %s and make envtest", err, dir)
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

// endTB records how a test would have ended (Skip or Fatal), standing in for the
// testing.TB a test receives so that the outcome can be checked without skipping or
// failing this test.
type endTB struct {
	testing.TB
	how, msg string
}

func (e *endTB) Helper() {}
func (e *endTB) Skipf(format string, args ...any) {
	e.how, e.msg = "skip", fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (e *endTB) Fatalf(format string, args ...any) {
	e.how, e.msg = "fatal", fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (e *endTB) Fatal(args ...any) {
	e.how, e.msg = "fatal", fmt.Sprint(args...)
	runtime.Goexit()
}

// runEnding calls f with an endTB in a goroutine of its own (Skip and Fatal end it) and
// returns how it ended: "skip", "fatal" or "" when f returned.
func runEnding(t *testing.T, f func(testing.TB)) *endTB {
	e := &endTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(e)
	}()
	<-done
	return e
}

// A plain go test ./... on a machine without the binaries skips the API-server tests
// with how to get them; under RequireVar (make test-unit) the same is a failure.
func TestSharedWithoutAssetsSkipsOrFails(t *testing.T) {
	t.Setenv("KUBEBUILDER_ASSETS", "")
	for _, tc := range []struct {
		require, how string
	}{{"", "skip"}, {"0", "skip"}, {"1", "fatal"}} {
		t.Run("require="+tc.require, func(t *testing.T) {
			t.Setenv(RequireVar, tc.require)
			s := NewShared()
			for range 2 { // the second test asking gets the same answer
				got := runEnding(t, func(tb testing.TB) { s.Env(tb) })
				if got.how != tc.how {
					t.Fatalf("Env ended with %q (%s), want %q", got.how, got.msg, tc.how)
				}
				for _, want := range []string{"make envtest", "KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh)"} {
					if !strings.Contains(got.msg, want) {
						t.Errorf("%q does not say %s", got.msg, want)
					}
				}
				if tc.how == "fatal" && !strings.Contains(got.msg, RequireVar) {
					t.Errorf("%q does not name %s", got.msg, RequireVar)
				}
			}
			if s.env != nil {
				t.Error("Shared holds an Env after a failed start")
			}
		})
	}
}

// StartT, as used for a test of its own server, ends the same way.
func TestStartTWithoutAssetsSkipsOrFails(t *testing.T) {
	t.Setenv("KUBEBUILDER_ASSETS", "")
	t.Setenv(RequireVar, "")
	if got := runEnding(t, func(tb testing.TB) { StartT(tb) }); got.how != "skip" {
		t.Errorf("StartT ended with %q (%s), want skip", got.how, got.msg)
	}
	t.Setenv(RequireVar, "1")
	if got := runEnding(t, func(tb testing.TB) { StartT(tb) }); got.how != "fatal" {
		t.Errorf("StartT ended with %q (%s), want fatal", got.how, got.msg)
	}
}

// Binaries that are named but do not start are a failure even without RequireVar: the
// user asked for the API-server tests.
func TestSharedWithBrokenAssetsFails(t *testing.T) {
	t.Setenv("KUBEBUILDER_ASSETS", t.TempDir())
	t.Setenv(RequireVar, "")
	got := runEnding(t, func(tb testing.TB) { NewShared().Env(tb) })
	if got.how != "fatal" {
		t.Errorf("Env ended with %q (%s), want fatal", got.how, got.msg)
	}
}
