package health

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// One kube-apiserver and etcd for the package, with the project's CRDs, started by the
// first test that needs it (shared.Env skips the test without the envtest binaries).
var shared = testenv.NewShared(func(c *rest.Config) {
	c.QPS, c.Burst = 500, 1000 // the benchmark writes 1,000 statuses per round
})

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(shared.Run(m))
}

var (
	testContext = testenv.Context
	waitFor     = testutil.WaitFor
)
