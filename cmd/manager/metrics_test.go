package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// saToken creates the ServiceAccount name in default and returns a token of it.
func saToken(t *testing.T, env *testenv.Env, name string) string {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	if err := env.Client.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(600))}}
	if err := env.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("a token for ServiceAccount %s: %v", name, err)
	}
	return tr.Status.Token
}

// The metrics endpoint serves HTTPS to callers the API server authenticates and allows to
// GET /metrics, through config/rbac's metrics-reader ClusterRole, and refuses everyone
// else; HTTP/2 is not offered.
func TestManagerMetricsNeedAnAuthorisedToken(t *testing.T) {
	t.Parallel()
	env := testenv.StartT(t)
	ctx := context.Background()

	var reader rbacv1.ClusterRole
	b, err := os.ReadFile("../../config/rbac/metrics_reader_role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &reader); err != nil {
		t.Fatalf("config/rbac/metrics_reader_role.yaml: %v", err)
	}
	if err := env.Client.Create(ctx, &reader); err != nil {
		t.Fatal(err)
	}
	allowed, denied := saToken(t, env, "prometheus"), saToken(t, env, "someone-else")
	if err := env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: "default"}},
	}); err != nil {
		t.Fatal(err)
	}

	providers := writeFile(t, "providers.yaml", fmt.Sprintf(goodConfig, t.TempDir()))
	metrics := freeAddr(t)
	mgr := startManager(t, env, "--providers-config", providers, "--health-probe-bind-address", freeAddr(t),
		"--metrics-bind-address", metrics, "--discovery-bind-address", "0")

	// The certificate is self-signed (no --metrics-cert-dir); the client offers h2 too.
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // self-signed by design
		ForceAttemptHTTP2: true,
	}}
	get := func(token string) (int, string, string) {
		req, _ := http.NewRequest(http.MethodGet, "https://"+metrics+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := c.Do(req)
		if err != nil {
			return 0, err.Error(), ""
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body), res.Proto
	}
	var code int
	var body, proto string
	mgr.waitUntil("the metrics endpoint to answer over HTTPS", func() (bool, error) {
		code, body, proto = get(allowed)
		return code != 0, fmt.Errorf("no answer: %s", body)
	})
	if code != http.StatusOK || !strings.Contains(body, "controller_runtime_") {
		t.Errorf("an authorised ServiceAccount's token: %d, body %.200q", code, body)
	}
	if proto != "HTTP/1.1" {
		t.Errorf("protocol %s, want HTTP/1.1 (HTTP/2 is off unless --enable-http2)", proto)
	}
	if code, body, _ := get(""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d %.200q, want 401", code, body)
	}
	if code, body, _ := get(denied); code != http.StatusForbidden {
		t.Errorf("a ServiceAccount without metrics-reader: %d %.200q, want 403", code, body)
	}
	// controller-runtime's filter answers 500 "Authentication failed" when the
	// TokenReview itself reports an error, as it does for a token that is no JWT at all.
	if code, body, _ := get("not-a-token"); code == http.StatusOK || strings.Contains(body, "controller_runtime_") {
		t.Errorf("a forged token: %d %.200q, want it refused", code, body)
	}
	plain, err := http.Get("http://" + metrics + "/metrics")
	if err == nil {
		plain.Body.Close()
		if plain.StatusCode == http.StatusOK {
			t.Error("plain HTTP served the metrics")
		}
	}
	mgr.stop()
}
