package hcloud

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	hc "github.com/hetznercloud/hcloud-go/v2/hcloud"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud/hcloudfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

const (
	testName     = "hcloud-test"
	testInstall  = "install-a"
	testLocation = "fsn1"
	testUserData = "#cloud-config\nwrite_files:\n- path: /etc/secret\n  content: SECRET-PROXY-PASSWORD\n"
)

// env is a provider over a fresh fake.
type env struct {
	fake      *hcloudfake.Server
	p         *Provider
	tokenFile string
	// logs holds every line the provider logs (up to V(1)).
	logs *testutil.SyncBuffer
}

type envOption func(*provider.HCloudConfig)

// withFirewall makes the provider manage a firewall per Proxy, admitting 192.0.2.0/24
// when the request names no sources.
func withFirewall(c *provider.HCloudConfig) {
	c.Firewall = &provider.HCloudFirewall{SourceRanges: []string{"192.0.2.0/24"}}
}

// withoutIPv6 turns the servers' IPv6 off.
func withoutIPv6(c *provider.HCloudConfig) { c.IPv6 = hc.Ptr(false) }

// newEnv builds a provider over a fresh fake, its token in a file of the test's own, the
// client retrying nothing itself (so that each injected answer reaches the provider),
// polls of a millisecond.
func newEnv(t *testing.T, opts ...envOption) *env {
	t.Helper()
	fake := hcloudfake.New()
	t.Cleanup(fake.Close)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(hcloudfake.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &provider.HCloudConfig{
		TokenFile: tokenFile, Locations: []string{testLocation, "nbg1"},
		ServerTypes: []string{"cx23", "cax11"}, Images: []string{"ubuntu-24.04", "debian-13"},
		Endpoint: fake.URL,
	}
	for _, o := range opts {
		o(cfg)
	}
	logs := &testutil.SyncBuffer{}
	log := funcr.New(func(prefix, args string) { _, _ = logs.Write([]byte(prefix + " " + args + "\n")) }, funcr.Options{Verbosity: 1})
	p, err := New(provider.ProviderConfig{Name: testName, Type: provider.TypeHCloud, HCloud: cfg}, log,
		WithInstallID(testInstall), WithPollInterval(time.Millisecond, 5*time.Millisecond),
		WithClientOptions(hc.WithRetryOpts(hc.RetryOpts{BackoffFunc: hc.ConstantBackoff(time.Millisecond), MaxRetries: 0})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &env{fake: fake, p: p, tokenFile: tokenFile, logs: logs}
}

// request is a valid CreateRequest in testLocation.
func request(name, uid string) provider.CreateRequest {
	return provider.CreateRequest{
		Name: name, UID: uid, Port: 3128, SpecHash: "hash-1", CloudInit: []byte(testUserData),
		Placement: provider.Placement{Zone: testLocation, MachineType: "cx23", Image: "ubuntu-24.04"},
	}
}

// serverID is the fake's ID of the server of a name, 0 when there is none.
func (e *env) serverID(name string) int64 {
	s, ok := e.fake.ServerByName(name)
	if !ok {
		return 0
	}
	return s.ID
}
