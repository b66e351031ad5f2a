package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	b := entry("crawl", "b", true, "kvm2-home", "eu", "eu-2", nil)
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
			"credentials are served only to callers authenticated with the discovery token, and this server has no token configured (--discovery-token-file)"},
		{"no token configured, text", noToken, "/v1/proxies?credentials=true&format=text", "", 403, "no token configured"},
		{"no token configured, pick", noToken, "/v1/proxies/pick?key=k&credentials=true", "", 403, "no token configured"},
		{"no bearer token sent", withToken, "/v1/proxies?credentials=true", "", 401, "missing bearer token"},
		{"wrong bearer token", withToken, "/v1/proxies/pick?key=k&credentials=true", "Bearer nope", 401, "invalid bearer token"},
		{"bad value", withToken, "/v1/proxies?credentials=yes", bearer, 400, `invalid value \"yes\" for credentials: use true or false`},
		{"a Secret missing", failing, "/v1/proxies?credentials=true", bearer, 503, "credentials of proxy crawl/b: secret crawl/auth-b not found"},
		{"an unparsable URL", badURL, "/v1/proxies?credentials=true", bearer, 503, "credentials of proxy crawl/bad: parsing its url"},
		{"no lookup", noLookup, "/v1/proxies?credentials=true&namespace=crawl", bearer, 503, "credentials of proxy crawl/a: this server cannot read proxy credentials"},
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
