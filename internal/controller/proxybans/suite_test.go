package proxybans

import (
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// The package's tests share one API server, with the CRDs from config/crd/bases, started
// by the first test that needs it (controllertest.Main); each test works in a namespace
// of its own, and those that call t.Parallel run up to 4 at once (-parallel overrides).
var shared = testenv.NewShared()

func TestMain(m *testing.M) {
	controllertest.Parallel(4)
	controllertest.Main(m, shared)
}
