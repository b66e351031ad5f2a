package gce

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/gcefake"
)

const (
	testProject  = "epo-test-project"
	testZone     = "europe-west1-b"
	testZone2    = "europe-west4-a"
	testInstall  = "install-a"
	testUserData = "#cloud-config\nwrite_files:\n- path: /etc/secret\n  content: SECRET-PROXY-PASSWORD\n"
)

// env is a provider over a fresh fake.
type env struct {
	fake *gcefake.Server
	p    *Provider
	logs *logSink
}

// logSink keeps every line a funcr logger writes.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (s *logSink) add(prefix, args string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, prefix+" "+args)
}

func (s *logSink) all() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

func (s *logSink) logger(verbosity int) logr.Logger {
	return funcr.New(s.add, funcr.Options{Verbosity: verbosity})
}

// testConfig is a gce block pointed at endpoint.
func testConfig(endpoint string) *provider.GCEConfig {
	return &provider.GCEConfig{
		Project:               testProject,
		Zones:                 []string{testZone, testZone2},
		MachineTypes:          map[string]string{"small": "e2-small"},
		Images:                map[string]string{"ubuntu-2404": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
		Endpoint:              endpoint,
		WithoutAuthentication: true,
	}
}

type envOption func(*provider.GCEConfig)

func newEnv(t *testing.T, opts ...envOption) *env {
	return newEnvV(t, 1, opts...)
}

// newEnvB is newEnv for a benchmark, logging nothing.
func newEnvB(b *testing.B) *env { return newEnvV(b, 0) }

// newEnvV builds the env with a logger at verbosity v.
func newEnvV(t testing.TB, v int, opts ...envOption) *env {
	t.Helper()
	fake := gcefake.New(testProject, testZone, testZone2, "us-central1-a")
	t.Cleanup(fake.Close)
	cfg := testConfig(fake.URL)
	for _, o := range opts {
		o(cfg)
	}
	logs := &logSink{}
	p, err := New(provider.ProviderConfig{Name: "gcp-test", Type: provider.TypeGCE, GCE: cfg}, logs.logger(v),
		WithInstallID(testInstall), WithPollInterval(time.Millisecond, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &env{fake: fake, p: p, logs: logs}
}

// request is a valid CreateRequest in testZone.
func request(name, uid string) provider.CreateRequest {
	return provider.CreateRequest{
		Name: name, UID: uid, Port: 3128, SpecHash: "hash-1", CloudInit: []byte(testUserData),
		Placement: provider.Placement{Zone: testZone, MachineType: "small", Image: "ubuntu-2404"},
	}
}
