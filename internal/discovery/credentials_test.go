package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

func authRef(secret string) *v1alpha1.ProxyBasicAuth {
	return &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: v1alpha1.SecretName(secret)}}
}

// authFor is what EntryFor keeps for e's Proxy with basic auth from secret.
func authFor(e Entry, secret string) *v1alpha1.Proxy {
	return authOf(&v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: e.Namespace, Name: e.Name},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyMode(e.Mode), Proxy: &v1alpha1.ProxyConfig{BasicAuth: authRef(secret)}}})
}

// credsFixture: crawl/a and crawl/b carry basic auth (b with a password that needs
// escaping in a URL), other/d has none.
func credsFixture() *staticSource {
	a := entry("crawl", "a", true, "kvm2-home", "eu", "eu-1", nil)
	a.auth = authFor(a, "auth-a")
	b := entry("crawl", "b", true, "kvm2-home", "eu", "eu-2", map[string]string{"only": "b"})
	b.auth = authFor(b, "auth-b")
	return newStaticSource(a, b, entry("other", "d", true, "ext", "us", "us-1", nil))
}

// secretLookup hands out credentials by Secret name, as the Secret reader does.
func secretLookup(secrets map[string]*proxyconfig.Credentials) proxyconfig.CredentialsFunc {
	return func(_ context.Context, px *v1alpha1.Proxy) (*proxyconfig.Credentials, error) {
		if px.Spec.Proxy == nil || px.Spec.Proxy.BasicAuth == nil {
			return nil, nil
		}
		name := px.Namespace + "/" + string(px.Spec.Proxy.BasicAuth.SecretRef.Name)
		if c, ok := secrets[name]; ok {
			return c, nil
		}
		return nil, errors.New("secret " + name + " not found")
	}
}

var testSecrets = map[string]*proxyconfig.Credentials{
	"crawl/auth-a": {Username: "crawler", Password: "Xk9-q.Tr_22"},
	"crawl/auth-b": {Username: "user@corp", Password: "p@ss:w/rd%20?"},
}

func tokenServer(t *testing.T, src Source, lookup proxyconfig.CredentialsFunc) http.Handler {
	path := filepath.Join(t.TempDir(), "token")
	writeToken(t, path, "s3cret-token\n")
	return newTestServer(t, src, Options{TokenFile: path, Credentials: lookup}).Handler()
}

const bearer = "Bearer s3cret-token"

func TestCredentialsServedWithToken(t *testing.T) {
	h := tokenServer(t, credsFixture(), secretLookup(testSecrets))
	res, body := get(t, h, "/v1/proxies?credentials=true", "Authorization", bearer)
	if res.StatusCode != http.StatusOK || res.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("status %d, Cache-Control %q: %s", res.StatusCode, res.Header.Get("Cache-Control"), body)
	}
	l := decodeList(t, body)
	if names(l) != "crawl/a,crawl/b,other/d" {
		t.Fatalf("proxies %s", names(l))
	}
	for i, want := range []*proxyconfig.Credentials{testSecrets["crawl/auth-a"], testSecrets["crawl/auth-b"], nil} {
		u, err := url.Parse(l.Proxies[i].URL)
		if err != nil {
			t.Fatalf("%s: %v", l.Proxies[i].URL, err)
		}
		pw, _ := u.User.Password()
		switch {
		case want == nil && u.User != nil:
			t.Errorf("%s has no basic auth but its URL carries %q", l.Proxies[i].Name, u.User)
		case want != nil && (u.User.Username() != want.Username || pw != want.Password):
			t.Errorf("%s: URL %s gives %q/%q, want %q/%q", l.Proxies[i].Name, l.Proxies[i].URL, u.User.Username(), pw, want.Username, want.Password)
		}
		if want != nil && u.Host != strings.TrimPrefix(entry(l.Proxies[i].Namespace, l.Proxies[i].Name, true, "", "", "", nil).URL, "http://") {
			t.Errorf("%s: host %q changed", l.Proxies[i].Name, u.Host)
		}
	}
	if !strings.Contains(body, `"url":"http://user%40corp:p%40ss%3Aw%2Frd%2520%3F@`) {
		t.Errorf("user and password are not escaped for a URL: %s", body)
	}

	// The text format: the same URLs, one per line.
	_, text := get(t, h, "/v1/proxies?credentials=true&format=text", "Authorization", bearer)
	var urls []string
	for _, p := range l.Proxies {
		urls = append(urls, p.URL)
	}
	if text != strings.Join(urls, "\n")+"\n" {
		t.Errorf("text %q, want the JSON's URLs %q", text, urls)
	}

	// pick, JSON and text, for a key that lands on a proxy with credentials.
	for i := 0; i < 50; i++ {
		target := "/v1/proxies/pick?namespace=crawl&credentials=true&key=k" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		_, pj := get(t, h, target, "Authorization", bearer)
		var e Entry
		if err := json.Unmarshal([]byte(pj), &e); err != nil {
			t.Fatalf("%s: %v (%s)", target, err, pj)
		}
		if !strings.Contains(e.URL, "@") {
			t.Fatalf("%s: picked URL %s without credentials", target, e.URL)
		}
		if _, pt := get(t, h, target+"&format=text", "Authorization", bearer); pt != e.URL+"\n" {
			t.Fatalf("%s&format=text = %q, want %q", target, pt, e.URL)
		}
	}
}

func TestCredentialsNotServedByDefault(t *testing.T) {
	h := tokenServer(t, credsFixture(), secretLookup(testSecrets))
	for _, target := range []string{"/v1/proxies", "/v1/proxies?credentials=false", "/v1/proxies?format=text", "/v1/proxies/pick?key=k"} {
		res, body := get(t, h, target, "Authorization", bearer)
		if res.StatusCode != http.StatusOK || strings.Contains(body, "@") || strings.Contains(body, "Xk9") {
			t.Errorf("%s: %d %s, want URLs without credentials", target, res.StatusCode, body)
		}
	}
}

func TestCredentialsRefused(t *testing.T) {
	noToken := newTestServer(t, credsFixture(), Options{Credentials: secretLookup(testSecrets)}).Handler()
	withToken := tokenServer(t, credsFixture(), secretLookup(testSecrets))
	failing := tokenServer(t, credsFixture(), secretLookup(map[string]*proxyconfig.Credentials{"crawl/auth-a": testSecrets["crawl/auth-a"]}))
	noLookup := tokenServer(t, credsFixture(), nil)
	bad := Entry{Name: "bad", Namespace: "crawl", URL: "http://[::1", Healthy: true}
	bad.auth = authFor(bad, "auth-a")
	badURL := tokenServer(t, newStaticSource(bad), secretLookup(testSecrets))
	for _, tc := range []struct {
		name   string
		h      http.Handler
		target string
		auth   string
		status int
		want   string
	}{
		{"no token configured", noToken, "/v1/proxies?credentials=true", "", 403,
			"credentials are served only to authenticated callers, and this server has no authentication configured (--discovery-kubernetes-auth or --discovery-token-file)"},
		{"no token configured, text", noToken, "/v1/proxies?credentials=true&format=text", "", 403, "no authentication configured"},
		{"no token configured, pick", noToken, "/v1/proxies/pick?key=k&credentials=true", "", 403, "no authentication configured"},
		{"no bearer token sent", withToken, "/v1/proxies?credentials=true", "", 401, "missing bearer token"},
		{"wrong bearer token", withToken, "/v1/proxies/pick?key=k&credentials=true", "Bearer nope", 401, "invalid bearer token"},
		{"bad value", withToken, "/v1/proxies?credentials=yes", bearer, 400, `invalid value \"yes\" for credentials: use true or false`},
		// Left out of a list (TestCredentialsUnreadableLeftOut); a pick with nothing left is a 503.
		{"a Secret missing, pick", failing, "/v1/proxies/pick?key=k&credentials=true&labelSelector=only%3Db", bearer, 503,
			"no healthy proxy matches the request with readable credentials (1 left out: credentials of proxy crawl/b: secret crawl/auth-b not found)"},
		{"an unparsable URL", badURL, "/v1/proxies/pick?key=k&credentials=true", bearer, 503, "credentials of proxy crawl/bad: parsing its url"},
		{"no lookup", noLookup, "/v1/proxies/pick?key=k&credentials=true&namespace=crawl", bearer, 503, "(2 left out: credentials of proxy crawl/"},
	} {
		res, body := get(t, tc.h, tc.target, "Authorization", tc.auth)
		if res.StatusCode != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want %d saying %q", tc.name, res.StatusCode, body, tc.status, tc.want)
		}
		if strings.Contains(body, "Xk9") || strings.Contains(body, "p@ss") {
			t.Errorf("%s: the error holds a password: %s", tc.name, body)
		}
	}
	// Proxies without basic auth need no lookup.
	if res, body := get(t, noLookup, "/v1/proxies?credentials=true&namespace=other", "Authorization", bearer); res.StatusCode != 200 {
		t.Errorf("no lookup, no proxy with basic auth: %d %s", res.StatusCode, body)
	}
}

// The entry keeps what the credentials lookup needs of the Proxy (its identity, its real
// mode, its Secret reference and its snapshot), never shown, and a change of any of them
// is a change of the entry.
func TestEntryForCarriesBasicAuth(t *testing.T) {
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "a", UID: "uid-a"},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeManaged, Port: 3128,
			Proxy: &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"}, BasicAuth: authRef("auth-a")}},
		Status: v1alpha1.ProxyStatus{IP: "192.0.2.7", CredentialsSecret: "proxy-0123456789abcdef-credentials"}}
	e, ok := EntryFor(px)
	if !ok || e.auth == nil || e.auth.Spec.Proxy.BasicAuth.SecretRef.Name != "auth-a" || e.auth.UID != "uid-a" ||
		e.auth.Spec.Mode != v1alpha1.ProxyModeManaged || e.auth.Status.CredentialsSecret != px.Status.CredentialsSecret {
		t.Fatalf("entry %+v, auth %+v", e, e.auth)
	}
	if b, _ := json.Marshal(e); strings.Contains(string(b), "auth-a") || strings.Contains(string(b), "credentials") {
		t.Errorf("the entry's JSON shows the Secret: %s", b)
	}
	for name, change := range map[string]func(*v1alpha1.Proxy){
		"secret reference": func(p *v1alpha1.Proxy) { p.Spec.Proxy.BasicAuth.SecretRef.Name = "auth-b" },
		"snapshot":         func(p *v1alpha1.Proxy) { p.Status.CredentialsSecret = "" },
	} {
		other := px.DeepCopy()
		change(other)
		if sameEntry(px, other) {
			t.Errorf("a changed %s leaves the snapshot as it was", name)
		}
	}
	// A Proxy whose spec no longer names a Secret but whose instance was built with one
	// still demands it.
	noRef := px.DeepCopy()
	noRef.Spec.Proxy.BasicAuth = nil
	if e, _ := EntryFor(noRef); e.auth == nil || e.auth.Status.CredentialsSecret == "" {
		t.Errorf("entry of a Proxy with a snapshot and no basicAuth: auth %+v", e.auth)
	}
}

// A proxy whose credentials cannot be read is left out of a ?credentials=true list, alone:
// the others are listed with theirs, the JSON counts it in credentialsUnavailable and
// gives its reason (naming it alone) in credentialErrors, both formats carry the count in
// X-Credentials-Unavailable, and the metric counts it. A pick passes it over to the next
// proxy of the key's order.
func TestCredentialsUnreadableLeftOut(t *testing.T) {
	failing := tokenServer(t, credsFixture(), secretLookup(map[string]*proxyconfig.Credentials{"crawl/auth-a": testSecrets["crawl/auth-a"]}))
	before := promtestutil.ToFloat64(credentialsUnavailable.WithLabelValues(endpointList))
	res, body := get(t, failing, "/v1/proxies?credentials=true", "Authorization", bearer)
	if res.StatusCode != http.StatusOK || res.Header.Get("X-Credentials-Unavailable") != "1" {
		t.Fatalf("%d (X-Credentials-Unavailable %q) %s, want 200 with one left out", res.StatusCode, res.Header.Get("X-Credentials-Unavailable"), body)
	}
	l := decodeList(t, body)
	if names(l) != "crawl/a,other/d" || !strings.Contains(l.Proxies[0].URL, "crawler:Xk9-q.Tr_22@") {
		t.Errorf("listed %s (%s), want crawl/a with its credentials and other/d", names(l), body)
	}
	wantErr := "credentials of proxy crawl/b: secret crawl/auth-b not found"
	if l.CredentialsUnavailable == nil || *l.CredentialsUnavailable != 1 || len(l.CredentialErrors) != 1 || l.CredentialErrors[0] != wantErr {
		t.Errorf("credentialsUnavailable %v, credentialErrors %q, want 1 and [%q]", l.CredentialsUnavailable, l.CredentialErrors, wantErr)
	}
	if got := promtestutil.ToFloat64(credentialsUnavailable.WithLabelValues(endpointList)) - before; got != 1 {
		t.Errorf("metric advanced by %v, want 1", got)
	}
	res, text := get(t, failing, "/v1/proxies?credentials=true&format=text", "Authorization", bearer)
	if res.StatusCode != http.StatusOK || res.Header.Get("X-Credentials-Unavailable") != "1" || strings.Count(text, "\n") != 2 ||
		!strings.HasPrefix(text, "http://crawler:Xk9-q.Tr_22@") || strings.Contains(text, "corp") {
		t.Errorf("text: %d (X-Credentials-Unavailable %q) %q, want crawl/a and other/d", res.StatusCode, res.Header.Get("X-Credentials-Unavailable"), text)
	}
	// All readable: the field says 0, no errors.
	ok := tokenServer(t, credsFixture(), secretLookup(testSecrets))
	if l := decodeList(t, func() string { _, b := get(t, ok, "/v1/proxies?credentials=true", "Authorization", bearer); return b }()); l.CredentialsUnavailable == nil ||
		*l.CredentialsUnavailable != 0 || l.CredentialErrors != nil || l.Count != 3 {
		t.Errorf("all readable: %+v", l)
	}

	// pick: every key of crawl goes to crawl/a while crawl/b cannot be read; without the
	// credentials, some of them go to crawl/b.
	pickBefore := promtestutil.ToFloat64(credentialsUnavailable.WithLabelValues(endpointPick))
	movedToA := 0
	for i := 0; i < 40; i++ {
		key := fmt.Sprintf("session-%d", i)
		_, plain := get(t, failing, "/v1/proxies/pick?namespace=crawl&key="+key, "Authorization", bearer)
		res, body := get(t, failing, "/v1/proxies/pick?namespace=crawl&credentials=true&key="+key, "Authorization", bearer)
		var e Entry
		if err := json.Unmarshal([]byte(body), &e); err != nil || res.StatusCode != http.StatusOK || e.Name != "a" || !strings.Contains(e.URL, "@") {
			t.Fatalf("pick %s: %d %s, want crawl/a with its credentials", key, res.StatusCode, body)
		}
		if strings.Contains(plain, `"name":"b"`) {
			movedToA++
			if res.Header.Get("X-Credentials-Unavailable") != "1" {
				t.Errorf("pick %s passed over crawl/b: X-Credentials-Unavailable %q, want 1", key, res.Header.Get("X-Credentials-Unavailable"))
			}
		}
	}
	if movedToA == 0 {
		t.Fatal("no key picks crawl/b without credentials: the test proves nothing")
	}
	if got := promtestutil.ToFloat64(credentialsUnavailable.WithLabelValues(endpointPick)) - pickBefore; got != float64(movedToA) {
		t.Errorf("pick metric advanced by %v, want %d", got, movedToA)
	}
}

// Through the real Secret reader and EntryFor: an External Proxy whose password the
// Managed rules would refuse (a space, a quote) is listed with it, as its proxy expects
// it; a Managed Proxy whose Secret lacks the opt-in label and one whose Secret does not
// exist are left out, each named in its own error, and no value of the unlabelled Secret
// appears anywhere in the answer.
func TestCredentialsRealSecretsExternalRulesAndDropOut(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	opted := map[string]string{v1alpha1.CredentialsLabel: "true"}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "squid-auth", Labels: opted},
			Data: map[string][]byte{"username": []byte("crawler"), "password": []byte(`with space & "quote"`)}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "deploy-bot"},
			Data: map[string][]byte{"username": []byte("bot"), "password": []byte("Deploy-Pw.9")}},
	).Build()
	proxy := func(name string, mode v1alpha1.ProxyMode, secret, ip string) Entry {
		px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: name},
			Spec: v1alpha1.ProxySpec{Mode: mode, Port: 3128,
				Proxy: &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"}, BasicAuth: authRef(secret)}},
			Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, Healthy: true, IP: ip}}
		e, ok := EntryFor(px)
		if !ok {
			t.Fatalf("no entry for %s", name)
		}
		return e
	}
	src := newStaticSource(
		proxy("squid", v1alpha1.ProxyModeExternal, "squid-auth", "192.0.2.10"),
		proxy("nosy", v1alpha1.ProxyModeManaged, "deploy-bot", "192.0.2.11"),
		proxy("orphan", v1alpha1.ProxyModeManaged, "gone", "192.0.2.12"),
	)
	h := tokenServer(t, src, proxyconfig.SecretCredentials{Reader: c}.Credentials)
	res, body := get(t, h, "/v1/proxies?credentials=true", "Authorization", bearer)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%d %s, want 200", res.StatusCode, body)
	}
	l := decodeList(t, body)
	if names(l) != "crawl/squid" {
		t.Fatalf("listed %s, want crawl/squid alone: %s", names(l), body)
	}
	u, err := url.Parse(l.Proxies[0].URL)
	if pw, _ := u.User.Password(); err != nil || u.User.Username() != "crawler" || pw != `with space & "quote"` {
		t.Errorf("squid's URL %s: want its Secret's credentials as they are", l.Proxies[0].URL)
	}
	if l.CredentialsUnavailable == nil || *l.CredentialsUnavailable != 2 || len(l.CredentialErrors) != 2 {
		t.Fatalf("credentialsUnavailable %v, errors %q, want 2", l.CredentialsUnavailable, l.CredentialErrors)
	}
	for i, want := range []struct{ name, says, not string }{
		{"nosy", `secret crawl/deploy-bot (spec.proxy.basicAuth.secretRef) lacks the label egress.hrajfrisbee.cz/proxy-credentials: "true"`, "orphan"},
		{"orphan", "secret crawl/gone (spec.proxy.basicAuth.secretRef) does not exist", "nosy"},
	} {
		got := l.CredentialErrors[i]
		if !strings.HasPrefix(got, "credentials of proxy crawl/"+want.name+": ") || !strings.Contains(got, want.says) ||
			strings.Contains(got, want.not) || strings.Contains(got, "squid") {
			t.Errorf("error %d %q, want one naming crawl/%s alone and saying %q", i, got, want.name, want.says)
		}
	}
	if strings.Contains(body, "Deploy-Pw") || strings.Contains(body, "bot@") {
		t.Errorf("the unlabelled Secret's values appear in the answer: %s", body)
	}
}
