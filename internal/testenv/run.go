package testenv

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// RequireVar names the environment variable that turns missing envtest binaries from a
// skip into a failure. make test-unit and make test-e2e set it, so a run meant to test
// everything cannot pass by skipping the API-server tests.
const RequireVar = "EPO_REQUIRE_ENVTEST"

// Shared is one API server for a package's tests, started by the first test that asks
// for it (Env) and stopped after the package's tests have run (Run). Tests that need no
// API server run without it, and without the binaries at all.
//
//	var shared = testenv.NewShared()
//	func TestMain(m *testing.M) { os.Exit(shared.Run(m)) }
//	func TestX(t *testing.T) { env := shared.Env(t); ... }
type Shared struct {
	tune []func(*rest.Config)
	once sync.Once
	env  *Env
	err  error
}

// NewShared returns a Shared whose server is started with tune (see Start).
func NewShared(tune ...func(*rest.Config)) *Shared { return &Shared{tune: tune} }

// Env returns the package's API server, starting it on the first call. Without the
// binaries the test is skipped with how to get them, or fails when RequireVar is set;
// any other start failure fails the test.
func (s *Shared) Env(t testing.TB) *Env {
	t.Helper()
	s.once.Do(func() { s.env, s.err = Start(s.tune...) })
	if s.err != nil {
		unavailable(t, s.err)
	}
	return s.env
}

// Client is Env's uncached client, for setting up and reading back.
func (s *Shared) Client(t testing.TB) client.Client {
	t.Helper()
	return s.Env(t).Client
}

// Run runs the package's tests and then stops the server, if a test started it. It
// returns the exit code for TestMain: 1 when the tests passed but the server would not stop.
func (s *Shared) Run(m *testing.M) int {
	code := m.Run()
	if s.env != nil {
		if err := s.env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// StartT starts an API server for one test and stops it when the test ends. Without the
// binaries the test is skipped or fails, as with Shared.Env.
func StartT(t testing.TB) *Env {
	t.Helper()
	e, err := Start()
	if err != nil {
		unavailable(t, err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Error(err)
		}
	})
	return e
}

// unavailable ends a test whose API server did not start: a skip when the binaries were
// never pointed at (a plain go test ./...), a failure when RequireVar is set or the
// binaries named by KUBEBUILDER_ASSETS would not start.
func unavailable(t testing.TB, err error) {
	t.Helper()
	if !errors.Is(err, ErrNoAssets) {
		t.Fatal(err)
	}
	if v := os.Getenv(RequireVar); v != "" && v != "0" {
		t.Fatalf("%v (%s=%s: a missing envtest binary is a failure here, not a skip)", err, RequireVar, v)
	}
	t.Skipf("skipping, this test needs a real API server: %v", err)
}
