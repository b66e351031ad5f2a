package gce

import (
	"strconv"
	"strings"
	"testing"

	"golang.org/x/oauth2"
	"google.golang.org/api/option"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/gcefake"
)

const testToken = "ya29.TEST-ACCESS-TOKEN-never-logged"

// newAuthEnv is a provider that authenticates with a bearer token, logging at v.
func newAuthEnv(t *testing.T, v int) *env {
	t.Helper()
	fake := gcefake.New(testProject, testZone, testZone2)
	t.Cleanup(fake.Close)
	cfg := testConfig(fake.URL)
	cfg.WithoutAuthentication = false
	logs := &logSink{}
	p, err := New(provider.ProviderConfig{Name: "gcp-test", Type: provider.TypeGCE, GCE: cfg}, logs.logger(v),
		WithInstallID(testInstall), WithPollInterval(0, 0),
		WithClientOptions(option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: testToken, TokenType: "Bearer"}))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return &env{fake: fake, p: p, logs: logs}
}

// TestWireLogNeverShowsTokenOrUserData: at V(5) every HTTP request and response is
// logged with its body, yet neither the bearer token the API really received nor any
// byte of the user-data appears in the log, in any error, or in what Get returns.
func TestWireLogNeverShowsTokenOrUserData(t *testing.T) {
	e := newAuthEnv(t, 5)
	e.fake.Fail(gcefake.InstancesInsert, gcefake.Failure{Code: 400, Reason: "invalid", Message: "Invalid value for field 'resource.metadata'"})
	req := request("proxy-00000000000000a1", "uid-a1")
	_, err := e.p.Create(t.Context(), req)
	if err == nil {
		t.Fatal("create succeeded with a 400 injected")
	}
	errs := []string{err.Error()}
	inst, err := e.p.Create(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Get(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.ListByTag(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Delete(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}

	// The token and the user-data were on the wire.
	var sawToken, sawUserData bool
	for _, c := range e.fake.Calls() {
		sawToken = sawToken || c.Authorization == "Bearer "+testToken
		sawUserData = sawUserData || strings.Contains(c.Body, "SECRET-PROXY-PASSWORD")
	}
	if !sawToken || !sawUserData {
		t.Fatalf("the API never got the token (%v) or the user-data (%v): the test proves nothing", sawToken, sawUserData)
	}
	log := e.logs.all()
	for _, want := range []string{`"gce http request"`, `"gce http response"`, `"gce call"`, `machineTypes/e2-small`,
		`"Authorization"="[removed]"`, `[removed ` + itoa(len(testUserData)) + ` bytes]`, `"status"="200 OK"`} {
		if !strings.Contains(log, want) {
			t.Errorf("V(5) log lacks %s", want)
		}
	}
	for _, secret := range []string{testToken, "TEST-ACCESS-TOKEN", "SECRET-PROXY-PASSWORD", "cloud-config", "write_files"} {
		if strings.Contains(log, secret) {
			t.Errorf("the log shows %q", secret)
		}
		for _, e := range errs {
			if strings.Contains(e, secret) {
				t.Errorf("an error shows %q: %s", secret, e)
			}
		}
	}
}

// TestWireLogOnlyAtV5: below V(5) no HTTP line is written, and the V(1) lines stay.
func TestWireLogOnlyAtV5(t *testing.T) {
	e := newAuthEnv(t, 4)
	if _, err := e.p.Create(t.Context(), request("proxy-00000000000000a2", "uid-a2")); err != nil {
		t.Fatal(err)
	}
	log := e.logs.all()
	if strings.Contains(log, "gce http") {
		t.Errorf("HTTP lines at V(4):\n%s", log)
	}
	if !strings.Contains(log, `"gce call"`) || !strings.Contains(log, `"method"="instances.insert"`) {
		t.Errorf("no V(1) call lines:\n%s", log)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
