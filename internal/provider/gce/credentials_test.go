package gce

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/gcefake"
)

// writeKey writes a service-account key file whose token_uri is the fake's OAuth endpoint.
func writeKey(t *testing.T, tokenURI string) string {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: must(x509.MarshalPKCS8PrivateKey(k))})
	b, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": testProject, "private_key_id": "k1", "private_key": string(pemKey),
		"client_email": "epo@" + testProject + ".iam.gserviceaccount.com", "client_id": "1", "token_uri": tokenURI,
	})
	path := filepath.Join(t.TempDir(), "key.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestCredentialsFile: with a service-account key file the provider signs a JWT, gets an
// access token from the key's token endpoint and sends it with every call, and the V(5)
// log shows neither the token nor the key.
func TestCredentialsFile(t *testing.T) {
	fake := gcefake.New(testProject, testZone, testZone2)
	t.Cleanup(fake.Close)
	cfg := testConfig(fake.URL)
	cfg.WithoutAuthentication = false
	cfg.CredentialsFile = writeKey(t, fake.URL+"/token")
	logs := &logSink{}
	p, err := New(provider.ProviderConfig{Name: "gcp-test", Type: provider.TypeGCE, GCE: cfg}, logs.logger(5),
		WithInstallID(testInstall), WithPollInterval(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if _, err := p.Create(t.Context(), request("proxy-00000000000000f1", "uid-f1")); err != nil {
		t.Fatal(err)
	}
	if fake.TokenRequests() == 0 {
		t.Fatal("no token was asked for")
	}
	for _, c := range fake.Calls() {
		if c.Authorization != "Bearer "+gcefake.Token {
			t.Fatalf("%s %s sent Authorization %q", c.Method, c.Path, c.Authorization)
		}
	}
	if log := logs.all(); strings.Contains(log, gcefake.Token) || strings.Contains(log, "PRIVATE KEY") {
		t.Error("the log shows the token or the key")
	}
}

// TestMissingCredentialsFile: an unreadable key file makes calls transient, naming the
// file, and Check says CredentialsUnavailable; nothing reached the API.
func TestMissingCredentialsFile(t *testing.T) {
	fake := gcefake.New(testProject, testZone, testZone2)
	t.Cleanup(fake.Close)
	cfg := testConfig(fake.URL)
	cfg.WithoutAuthentication = false
	cfg.CredentialsFile = filepath.Join(t.TempDir(), "absent.json")
	p, err := New(provider.ProviderConfig{Name: "gcp-test", Type: provider.TypeGCE, GCE: cfg}, (&logSink{}).logger(1))
	if err != nil {
		t.Fatalf("New read the credentials: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	_, err = p.Create(t.Context(), request("proxy-00000000000000f2", "u"))
	if provider.Class(err) != provider.ErrTransient || !strings.Contains(err.Error(), "absent.json") {
		t.Errorf("create: %v", err)
	}
	st := p.Check(t.Context())
	if len(st) != 2 || st[0].Ready || st[0].Reason != "CredentialsUnavailable" {
		t.Errorf("check: %+v", st)
	}
	if n := len(fake.Calls()); n != 0 {
		t.Errorf("%d calls reached the API", n)
	}
}
