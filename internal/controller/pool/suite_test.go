package pool

import (
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// The package's tests share one API server, with the CRDs from config/crd/bases, started
// by the first test that needs it (controllertest.Main); each test works in a namespace
// of its own, and those that call t.Parallel run up to 4 at once (-parallel overrides).
var shared = testenv.NewShared()

func TestMain(m *testing.M) {
	controllertest.Parallel(4)
	controllertest.Main(m, shared)
}

const (
	testProvider = controllertest.TestProvider
	waitLong     = testutil.WaitLong
)

// waitFor polls cond until it returns true, failing the test with what it was waiting
// for (and cond's last error) after timeout; testContext is cancelled at the test's end.
var (
	waitFor     = testutil.WaitFor
	testContext = testenv.Context
)
