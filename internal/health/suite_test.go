package health

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// One kube-apiserver and etcd for the package, with the project's CRDs.
var (
	testEnv    *testenv.Env
	testClient client.Client
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(testenv.Main(m, func(e *testenv.Env) { testEnv, testClient = e, e.Client }, func(c *rest.Config) {
		c.QPS, c.Burst = 500, 1000 // the benchmark writes 1,000 statuses per round
	}))
}

var (
	testContext = testenv.Context
	waitFor     = testenv.WaitFor
)
