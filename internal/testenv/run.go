package testenv

import (
	"fmt"
	"os"
	"testing"

	"k8s.io/client-go/rest"
)

// Main runs a package's tests against one API server, for TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m, func(e *testenv.Env) { env = e })) }
//
// use receives the Env before any test runs. Main returns the exit code: 1, with the
// reason on stderr, when the server does not start.
func Main(m *testing.M, use func(*Env), tune ...func(*rest.Config)) int {
	e, err := Start(tune...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := e.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	use(e)
	return m.Run()
}

// StartT starts an API server for one test and stops it when the test ends.
func StartT(t testing.TB) *Env {
	t.Helper()
	e, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Error(err)
		}
	})
	return e
}
