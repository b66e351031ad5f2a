// Package testenv starts the real kube-apiserver and etcd (controller-runtime's envtest)
// that the project's API-server tests run against, with the CRDs from config/crd/bases,
// and holds the set-up those tests share: a namespace per test, a manager whose cache
// watches only it, and waiting on a condition.
//
// The binaries are built once per machine by hack/envtest-assets.sh (make envtest);
// KUBEBUILDER_ASSETS names their directory (make test-unit sets it). A package's tests
// share one server started on first need (Shared), so its tests that need none run
// without the binaries.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// ErrNoAssets is returned when KUBEBUILDER_ASSETS is not set. Shared.Env and StartT skip
// the test on it, unless RequireVar is set (make test-unit sets it): there it fails, since
// a skipped envtest tier would pass without testing anything.
var ErrNoAssets = errors.New("KUBEBUILDER_ASSETS is not set: build the envtest binaries with make envtest, " +
	"then run with KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh) (make test-unit does both)")

// Env is a running API server with the project's CRDs installed.
type Env struct {
	// Config reaches the API server as its administrator.
	Config *rest.Config
	// Scheme holds client-go's types and the project's.
	Scheme *runtime.Scheme
	// Client is uncached, for setting up and reading back.
	Client client.Client
	// KubeConfig is a kubeconfig file's content for Config, for a process of its own.
	KubeConfig []byte

	env *envtest.Environment
}

// Start starts an API server and etcd. Each tune function may change the rest.Config
// (rate limits, a wrapped transport) before Client is built from it.
func Start(tune ...func(*rest.Config)) (*Env, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return nil, ErrNoAssets
	}
	crds, err := CRDDir()
	if err != nil {
		return nil, err
	}
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{crds}, ErrorIfCRDPathMissing: true}
	// envtest's default of 20 s per try is too short for kube-apiserver on a loaded
	// 2-core machine (five tries of 20 s each failed at a load of 17); a slow start is not
	// a failure. KUBEBUILDER_CONTROLPLANE_START_TIMEOUT still overrides it.
	if os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") == "" {
		env.ControlPlaneStartTimeout = 2 * time.Minute
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting envtest from KUBEBUILDER_ASSETS=%s (make envtest builds the binaries): %w",
			os.Getenv("KUBEBUILDER_ASSETS"), err)
	}
	e := &Env{Config: cfg, Scheme: scheme, KubeConfig: env.KubeConfig, env: env}
	for _, f := range tune {
		f(cfg)
	}
	if e.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return nil, errors.Join(fmt.Errorf("client for envtest: %w", err), e.Stop())
	}
	return e, nil
}

// Scheme returns a scheme with client-go's types and the project's.
func Scheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

// FakeClient returns controller-runtime's fake client (no API server) holding objs, with
// the status subresource of the project's types, its calls going through funcs first:
// for tests that need object reads and writes with injected conflicts or errors only.
func FakeClient(t testing.TB, funcs interceptor.Funcs, objs ...client.Object) client.WithWatch {
	t.Helper()
	scheme, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.Proxy{}, &v1alpha1.ProviderHealth{}).
		WithInterceptorFuncs(funcs).Build()
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error {
	if err := e.env.Stop(); err != nil {
		return fmt.Errorf("stopping envtest: %w", err)
	}
	return nil
}

// CRDDir is config/crd/bases of the module holding the working directory (a test runs in
// its package's directory).
func CRDDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "config", "crd", "bases"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: cannot find config/crd/bases")
		}
		dir = parent
	}
}
