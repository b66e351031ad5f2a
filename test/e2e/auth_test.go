//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/manifest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

// sampleSubnet is the bridge subnet the sample's allowedSourceRanges lists; the test puts
// the host's own in its place.
const sampleSubnet = "10.123.0.0/24"

// discoveryToken is the bearer token the test's manager requires on its discovery API;
// credentials=true is served only with one.
const discoveryToken = "e2e-discovery-token"

// readSample decodes config/samples/proxy_kvm2.yaml: its basic-auth Secret and its Proxy,
// which must name that Secret and list the bridge subnet.
func readSample(t *testing.T) (*v1alpha1.Proxy, *corev1.Secret) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(framework.RepoRoot(t), samplePath))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifest.Decode(data)
	if err != nil {
		t.Fatalf("%s: %v", samplePath, err)
	}
	var px *v1alpha1.Proxy
	var sec *corev1.Secret
	for _, o := range objs {
		switch o := o.(type) {
		case *v1alpha1.Proxy:
			px = o
		case *corev1.Secret:
			sec = o
		}
	}
	switch {
	case px == nil || sec == nil:
		t.Fatalf("%s: want a Secret and a Proxy", samplePath)
	case px.Spec.Proxy == nil || px.Spec.Proxy.BasicAuth == nil || string(px.Spec.Proxy.BasicAuth.SecretRef.Name) != sec.Name:
		t.Fatalf("%s: the Proxy does not name the Secret %s in spec.proxy.basicAuth", samplePath, sec.Name)
	case !slices.Contains(px.Spec.Proxy.AllowedSourceRanges, v1alpha1.CIDR(sampleSubnet)):
		t.Fatalf("%s: spec.proxy.allowedSourceRanges no longer lists the bridge subnet %s", samplePath, sampleSubnet)
	case sec.StringData["username"] == "" || sec.StringData["password"] == "":
		t.Fatalf("%s: the Secret has no stringData username and password", samplePath)
	}
	return px, sec
}

// writeDiscoveryToken writes discoveryToken to a file in dir for --discovery-token-file.
func writeDiscoveryToken(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "discovery-token")
	if err := os.WriteFile(path, []byte(discoveryToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// bearer adds the discovery token to each request.
type bearer struct{}

func (bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+discoveryToken)
	return http.DefaultTransport.RoundTrip(r)
}

// discoveryClient is how the test, a crawler holding the token, talks to discovery.
var discoveryClient = &http.Client{Timeout: 30 * time.Second, Transport: bearer{}}

// credentials are the username and password of the proxy's Secret sec, as the API server
// holds it (stringData is write-only: the created object has data).
func (s *story) credentials(sec *corev1.Secret) *url.Userinfo {
	s.t.Helper()
	var live corev1.Secret
	if err := s.c.Get(context.Background(), client.ObjectKeyFromObject(sec), &live); err != nil {
		s.t.Fatalf("reading the sample's Secret: %v", err)
	}
	user, pass := string(live.Data["username"]), string(live.Data["password"])
	if user == "" || pass == "" {
		s.t.Fatalf("the Secret %s holds no username and password", sec.Name)
	}
	return url.UserPassword(user, pass)
}

// checkAuth checks the guest's proxy demands the sample Secret's credentials (a request
// without them gets 407, a wrong password 401, as tinyproxy 1.11 answers) and that
// discovery hands the URL out with exactly those credentials only when asked with the
// token. checkServing has shown the credentialed URL carries traffic and the probe,
// with the credentials, made the Proxy Ready.
func (s *story) checkAuth(px *v1alpha1.Proxy, sec *corev1.Secret, discovery, whoURL string) {
	t := s.t
	ip := s.mustProxy().Status.IP
	creds := s.credentials(sec)
	user := creds.Username()
	pass, _ := creds.Password()
	for _, tc := range []struct {
		name string
		user *url.Userinfo
		want int
	}{
		{"without credentials", nil, http.StatusProxyAuthRequired},
		{"with a wrong password", url.UserPassword(user, pass+"-wrong"), http.StatusUnauthorized},
	} {
		u := &url.URL{Scheme: "http", Host: fmt.Sprintf("%s:%d", ip, px.Spec.Port), User: tc.user}
		code, err := framework.StatusThrough(u, whoURL+"/auth-check")
		if err != nil || code != tc.want {
			t.Errorf("a request through the proxy %s: %d %v, want %d", tc.name, code, err, tc.want)
		} else {
			t.Logf("a request through the proxy %s: %d, as wanted", tc.name, code)
		}
	}

	want := fmt.Sprintf("http://%s:%s@%s:%d\n", user, pass, ip, px.Spec.Port)
	if body, err := framework.Get(discoveryClient, discovery+"/v1/proxies?format=text&credentials=true"); err != nil || body != want {
		t.Errorf("discovery with credentials=true: %q (%v), want %q", body, err, want)
	}
	if body, err := framework.Get(discoveryClient, discovery+"/v1/proxies?format=text"); err != nil || strings.Contains(body, "@") {
		t.Errorf("discovery without credentials=true: %q (%v), want URLs without credentials", body, err)
	}
	resp, err := http.Get(discovery + "/v1/proxies?format=text&credentials=true")
	if err == nil {
		resp.Body.Close()
	}
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("credentials=true without the token: %v %v, want 401", resp, err)
	}
}
