package discovery

import (
	"context"
	"fmt"
	"github.com/go-logr/logr"
	"net/http"
	"os"
	"path/filepath"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// One kube-apiserver and etcd for the package, with the project's CRDs, for the tests of
// the cache-backed source and the benchmarks with 1,000 Proxies.
var (
	testCfg    *rest.Config
	apiCalls   atomic.Int64 // requests the test process sent to the API server
	testScheme = runtime.NewScheme()
	testClient client.Client
)

func TestMain(m *testing.M) { os.Exit(runSuite(m)) }

func runSuite(m *testing.M) int {
	if err := clientgoscheme.AddToScheme(testScheme); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(testScheme); err != nil {
		panic(err)
	}
	ctrllog.SetLogger(logr.Discard())
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set: run with KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh) (or make test-unit)")
		return 1
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	var err error
	if testCfg, err = env.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest: %v\n", err)
		return 1
	}
	testCfg.QPS, testCfg.Burst = 500, 1000
	testCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			apiCalls.Add(1)
			return rt.RoundTrip(r)
		})
	})
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()
	if testClient, err = client.New(testCfg, client.Options{Scheme: testScheme}); err != nil {
		fmt.Fprintf(os.Stderr, "client for envtest: %v\n", err)
		return 1
	}
	return m.Run()
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

func keyOf(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }
