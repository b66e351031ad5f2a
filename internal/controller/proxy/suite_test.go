package proxy

import (
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// One real kube-apiserver and etcd for the whole package, with the CRDs from
// config/crd/bases, started by the first test that needs it. Tests isolate themselves
// with a namespace (and a manager) of their own.
var shared = testenv.NewShared()

func TestMain(m *testing.M) { controllertest.Main(m, shared) }

// waitFor polls cond until it returns true, failing the test with what it was waiting
// for (and cond's last error) after timeout.
var waitFor = testutil.WaitFor

// testContext is a context cancelled at the end of the test.
var testContext = testenv.Context
