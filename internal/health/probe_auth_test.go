package health

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

var (
	rightCreds = &proxyconfig.Credentials{Username: "crawler", Password: "Xk9-q.Tr_22"}
	wrongCreds = &proxyconfig.Credentials{Username: "crawler", Password: "not-the-one"}
)

// httpsWhoami is an https probe target the prober trusts, reached through CONNECT.
func httpsWhoami(t *testing.T, pr *prober) *httptest.Server {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"ip":"` + r.RemoteAddr[:strings.LastIndex(r.RemoteAddr, ":")] + `"}`))
	}))
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	pr.client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: pool}
	return srv
}

// probersFor are a prober of a plain-http target (credentials on the GET) and one of an
// https target (credentials on the CONNECT).
func probersFor(t *testing.T) map[string]*prober {
	plain, err := newProber(whoamiTarget(t, "json").URL + "/v1/whoami")
	if err != nil {
		t.Fatal(err)
	}
	tlsPr, _ := newProber("https://placeholder/")
	tlsPr.target.Host = strings.TrimPrefix(httpsWhoami(t, tlsPr).URL, "https://")
	return map[string]*prober{"http": plain, "https via CONNECT": tlsPr}
}

func TestProbeWithBasicAuth(t *testing.T) {
	for name, pr := range probersFor(t) {
		fp := healthtest.New(t, "127.0.0.8")
		fp.RequireAuth(&healthtest.Auth{Username: rightCreds.Username, Password: rightCreds.Password})
		for _, tc := range []struct {
			name  string
			creds *proxyconfig.Credentials
			wrong int
			want  string // "" = healthy
		}{
			{"right credentials", rightCreds, 0, ""},
			{"none sent", nil, 0, "the proxy requires credentials (407 Proxy Authentication Required) and the Proxy has none: set spec.proxy.basicAuth"},
			{"wrong, answered 401 like tinyproxy", wrongCreds, 0, "the proxy refused the credentials (401 Unauthorized)"},
			{"wrong, answered 407 like squid", wrongCreds, http.StatusProxyAuthRequired, "the proxy refused the credentials (407 Proxy Authentication Required): the Secret named by spec.proxy.basicAuth.secretRef"},
		} {
			fp.RequireAuth(&healthtest.Auth{Username: rightCreds.Username, Password: rightCreds.Password, WrongStatus: tc.wrong})
			r := pr.probe(context.Background(), fpURL(fp), tc.creds, 5*time.Second)
			switch {
			case tc.want == "" && r.err != nil:
				t.Errorf("%s, %s: %v", name, tc.name, r.err)
			case tc.want == "" && r.egressIP != "127.0.0.8":
				t.Errorf("%s, %s: egress IP %q; the probe did not go through the proxy", name, tc.name, r.egressIP)
			case tc.want != "" && (r.err == nil || !strings.Contains(r.err.Error(), tc.want) || !strings.Contains(r.err.Error(), fp.Host)):
				t.Errorf("%s, %s: error %v, want one naming the proxy and saying %q", name, tc.name, r.err, tc.want)
			}
			if r.err != nil && tc.creds != nil && strings.Contains(r.err.Error(), tc.creds.Password) {
				t.Errorf("%s, %s: the error holds the password: %v", name, tc.name, r.err)
			}
		}
	}
}

func TestProbeSourceRefused(t *testing.T) {
	for name, pr := range probersFor(t) {
		fp := healthtest.New(t, "")
		fp.AllowSources(netip.MustParsePrefix("192.0.2.0/24")) // the probe comes from 127.0.0.1
		r := pr.probe(context.Background(), fpURL(fp), nil, 5*time.Second)
		want := "the proxy refused the probe's source address (403 Forbidden): add the network the operator's probes come from to spec.proxy.allowedSourceRanges"
		if r.err == nil || !strings.Contains(r.err.Error(), want) {
			t.Errorf("%s: error %v, want one saying %q", name, r.err, want)
		}
		fp.AllowSources(netip.MustParsePrefix("127.0.0.0/8"))
		if r := pr.probe(context.Background(), fpURL(fp), nil, 5*time.Second); r.err != nil {
			t.Errorf("%s: from an allowed source: %v", name, r.err)
		}
	}
}

// A 403 on the CONNECT to an https probe url on another port than 443 may be tinyproxy's
// ConnectPort: the message says so.
func TestProbeRefusalNamesConnectPort(t *testing.T) {
	pr, _ := newProber("https://127.0.0.1:8443/v1/whoami")
	err := pr.refusal(http.StatusForbidden, "403 Access violation", false)
	if err == nil || !strings.Contains(err.Error(), "allows CONNECT to port 443 only, and the probe url uses port 8443") {
		t.Errorf("%v", err)
	}
	pr, _ = newProber("https://whoami.example.net/")
	if err := pr.refusal(http.StatusForbidden, "403 Forbidden", false); err == nil || strings.Contains(err.Error(), "CONNECT") {
		t.Errorf("a probe url on port 443: %v", err)
	}
	for _, code := range []int{http.StatusOK, http.StatusNotFound, http.StatusBadGateway} {
		if err := pr.refusal(code, strconv.Itoa(code), true); err != nil {
			t.Errorf("%d taken for a refusal: %v", code, err)
		}
	}
	if err := pr.refusal(http.StatusUnauthorized, "401 Unauthorized", false); err != nil {
		t.Errorf("a 401 without credentials sent is the target's answer, not the proxy's: %v", err)
	}
}

// The engine sends what Options.Credentials returns, and a failed lookup fails the probe.
func TestEngineProbeUsesCredentials(t *testing.T) {
	target := whoamiTarget(t, "json")
	fp := healthtest.New(t, "")
	fp.RequireAuth(&healthtest.Auth{Username: rightCreds.Username, Password: rightCreds.Password})
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "p1"},
		Spec: v1alpha1.ProxySpec{Port: fp.Port}, Status: v1alpha1.ProxyStatus{IP: fp.Host}}
	lookupErr := errors.New(`secret crawl/auth has no key "password"`)
	for _, tc := range []struct {
		name   string
		lookup proxyconfig.CredentialsFunc
		want   string
	}{
		{"no lookup", nil, "requires credentials"},
		{"right", func(context.Context, *v1alpha1.Proxy) (*proxyconfig.Credentials, error) { return rightCreds, nil }, ""},
		{"none for this proxy", func(context.Context, *v1alpha1.Proxy) (*proxyconfig.Credentials, error) { return nil, nil }, "requires credentials"},
		{"lookup failed", func(context.Context, *v1alpha1.Proxy) (*proxyconfig.Credentials, error) { return nil, lookupErr },
			`credentials for the probe of crawl/p1: secret crawl/auth has no key "password"`},
	} {
		e, err := New(nil, nil, nil, Options{ProbeURL: target.URL, Timeout: 5 * time.Second, Credentials: tc.lookup}, logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		r := e.probeOne(context.Background(), px)
		if (tc.want == "") != (r.err == nil) || (r.err != nil && !strings.Contains(r.err.Error(), tc.want)) {
			t.Errorf("%s: error %v, want %q", tc.name, r.err, tc.want)
		}
	}
}
