package controller

import (
	"io"
	"os"
	"testing"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// One real kube-apiserver and etcd for the whole package, with the CRDs from
// config/crd/bases, started by the first test that needs it. Tests isolate themselves
// with a namespace (and a manager) of their own.
var shared = testenv.NewShared()

func TestMain(m *testing.M) {
	// TEST_LOG=1 shows the controllers' log lines.
	logOut := io.Discard
	if os.Getenv("TEST_LOG") != "" {
		logOut = os.Stderr
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logOut), zap.UseDevMode(true)))
	os.Exit(shared.Run(m))
}

// waitFor polls cond until it returns true, failing the test with what it was waiting
// for (and cond's last error) after timeout.
var waitFor = testutil.WaitFor

// testContext is a context cancelled at the end of the test.
var testContext = testenv.Context
