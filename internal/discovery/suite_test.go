package discovery

import (
	"net/http"
	"os"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// One kube-apiserver and etcd for the package, with the project's CRDs, for the tests of
// the cache-backed source and the benchmarks with 1,000 Proxies, started by the first
// test that needs it (shared.Env skips a test without the envtest binaries).
var (
	apiCalls atomic.Int64 // requests the test process sent to the API server
	shared   = testenv.NewShared(func(c *rest.Config) {
		c.QPS, c.Burst = 500, 1000
		c.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				apiCalls.Add(1)
				return rt.RoundTrip(r)
			})
		})
	})
)

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(shared.Run(m))
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

var testContext = testenv.Context

// waitLong is the deadline of a wait (testutil.WaitFor): one only a broken test reaches.
const waitLong = testutil.WaitLong

func keyOf(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }
