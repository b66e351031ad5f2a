package proxyconfig

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// secret is an opted-in Secret of namespace crawl.
func secret(name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: name,
		Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}}, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func proxyWithAuth(mode v1alpha1.ProxyMode, secretName string) *v1alpha1.Proxy {
	return &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "p"}, Spec: v1alpha1.ProxySpec{Mode: mode,
		Proxy: &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"},
			BasicAuth: &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: v1alpha1.SecretName(secretName)}}}}}
}

func TestSecretCredentials(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		secret("good", map[string]string{"username": "crawler", "password": "Xk9-q.Tr_22"}),
		secret("no-password", map[string]string{"username": "crawler"}),
		secret("empty-username", map[string]string{"username": "", "password": "x"}),
		secret("newline", map[string]string{"username": "crawler", "password": "Xk9\n"}),
		secret("squid", map[string]string{"username": "crawler", "password": "with space & quote\""}),
		secret("colon", map[string]string{"username": "a:b", "password": "x"}),
	).Build()
	sc := SecretCredentials{Reader: c}
	ctx := context.Background()

	got, err := sc.Credentials(ctx, proxyWithAuth(v1alpha1.ProxyModeManaged, "good"))
	if err != nil || got == nil || *got != (Credentials{Username: "crawler", Password: "Xk9-q.Tr_22"}) {
		t.Fatalf("good: %+v, %v", got, err)
	}
	if got, err := sc.Credentials(ctx, &v1alpha1.Proxy{}); got != nil || err != nil {
		t.Errorf("no spec.proxy: %+v, %v", got, err)
	}
	noAuth := proxyWithAuth(v1alpha1.ProxyModeManaged, "x")
	noAuth.Spec.Proxy.BasicAuth = nil
	if got, err := sc.Credentials(ctx, noAuth); got != nil || err != nil {
		t.Errorf("no basicAuth: %+v, %v", got, err)
	}
	// An External proxy's credentials are sent as they are: tinyproxy's limits do not apply.
	if got, err := sc.Credentials(ctx, proxyWithAuth(v1alpha1.ProxyModeExternal, "squid")); err != nil || got.Password != "with space & quote\"" {
		t.Errorf("external: %+v, %v", got, err)
	}

	for _, tc := range []struct {
		name   string
		mode   v1alpha1.ProxyMode
		secret string
		is     error
		want   string
	}{
		{"missing", v1alpha1.ProxyModeManaged, "nope", ErrSecretMissing, "secret crawl/nope (spec.proxy.basicAuth.secretRef) does not exist"},
		{"no password", v1alpha1.ProxyModeManaged, "no-password", ErrSecretKeyMissing, `secret crawl/no-password (spec.proxy.basicAuth.secretRef) has no key "password"`},
		{"empty username", v1alpha1.ProxyModeExternal, "empty-username", ErrSecretKeyMissing, `has no key "username", or it is empty`},
		{"a newline for tinyproxy", v1alpha1.ProxyModeManaged, "newline", ErrBadCredentials,
			"secret crawl/newline (spec.proxy.basicAuth.secretRef): credentials cannot be written into tinyproxy's configuration: password holds a character other than letters"},
		{"spaces for tinyproxy", v1alpha1.ProxyModeManaged, "squid", ErrBadCredentials, "password holds a character other than"},
		{"colon for basic auth", v1alpha1.ProxyModeExternal, "colon", ErrBadCredentials, "username holds a ':'"},
	} {
		_, err := sc.Credentials(ctx, proxyWithAuth(tc.mode, tc.secret))
		if err == nil || !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %v saying %q", tc.name, err, tc.is, tc.want)
		}
		if err != nil && (strings.Contains(err.Error(), "Xk9") || strings.Contains(err.Error(), "quote")) {
			t.Errorf("%s: the error holds a value: %v", tc.name, err)
		}
	}

	// A failed read is neither "missing" class: the reconciler retries it.
	broken := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return errors.New("connection refused")
		},
	}).Build()
	_, err = SecretCredentials{Reader: broken}.Credentials(ctx, proxyWithAuth(v1alpha1.ProxyModeManaged, "good"))
	if err == nil || errors.Is(err, ErrSecretMissing) || errors.Is(err, ErrSecretKeyMissing) ||
		!strings.Contains(err.Error(), "reading secret crawl/good (spec.proxy.basicAuth.secretRef): connection refused") {
		t.Errorf("failed read: %v", err)
	}
}

// Only opted-in Secrets are read. A Reader that sees every Secret still gets an
// unlabelled one refused; a Reader that sees only labelled ones (the manager's cache)
// does not find it, and the metadata read tells the user which it is, without ever
// asking for the data of the Secret.
func TestSecretCredentialsOptIn(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	unlabelled := secret("deploy-bot", map[string]string{"username": "bot", "password": "Deploy-Pw.9"})
	unlabelled.Labels = nil
	wrongValue := secret("maybe", map[string]string{"username": "bot", "password": "Deploy-Pw.9"})
	wrongValue.Labels[v1alpha1.CredentialsLabel] = "yes"
	labelled := secret("fresh", map[string]string{"username": "crawler", "password": "Xk9-q.Tr_22"})
	all := fake.NewClientBuilder().WithScheme(scheme).WithObjects(unlabelled, wrongValue, labelled).Build()
	ctx := context.Background()
	wantMsg := func(name string) string {
		return "secret crawl/" + name + " (spec.proxy.basicAuth.secretRef) lacks the label egress.hrajfrisbee.cz/proxy-credentials: \"true\", " +
			"without which the operator does not read it; add it if this Secret is meant for the proxy: " +
			"kubectl label secret -n crawl " + name + " egress.hrajfrisbee.cz/proxy-credentials=true"
	}

	for _, name := range []string{"deploy-bot", "maybe"} {
		for _, mode := range []v1alpha1.ProxyMode{v1alpha1.ProxyModeManaged, v1alpha1.ProxyModeExternal} {
			got, err := SecretCredentials{Reader: all}.Credentials(ctx, proxyWithAuth(mode, name))
			if got != nil || !errors.Is(err, ErrSecretNotOptedIn) || !strings.Contains(err.Error(), wantMsg(name)) {
				t.Errorf("%s, %s, a reader seeing every Secret: %+v, %v, want ErrSecretNotOptedIn saying %q", name, mode, got, err, wantMsg(name))
			}
			if err != nil && strings.Contains(err.Error(), "Deploy-Pw") {
				t.Errorf("the error holds the password: %v", err)
			}
		}
	}

	// A cache of labelled Secrets only, as the manager's: it finds none of these.
	var metaReads []client.Object
	cacheLike := fake.NewClientBuilder().WithScheme(scheme).Build()
	metadata := fake.NewClientBuilder().WithScheme(scheme).WithObjects(unlabelled.DeepCopy(), labelled.DeepCopy()).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			metaReads = append(metaReads, obj)
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
	sc := SecretCredentials{Reader: cacheLike, Metadata: metadata}
	_, err := sc.Credentials(ctx, proxyWithAuth(v1alpha1.ProxyModeExternal, "deploy-bot"))
	if !errors.Is(err, ErrSecretNotOptedIn) || !strings.Contains(err.Error(), wantMsg("deploy-bot")) {
		t.Errorf("unlabelled, through the cache: %v, want ErrSecretNotOptedIn", err)
	}
	_, err = sc.Credentials(ctx, proxyWithAuth(v1alpha1.ProxyModeExternal, "nope"))
	if !errors.Is(err, ErrSecretMissing) || !strings.Contains(err.Error(), "secret crawl/nope (spec.proxy.basicAuth.secretRef) does not exist") {
		t.Errorf("missing, through the cache: %v, want ErrSecretMissing", err)
	}
	// Labelled, but the cache has not seen it yet: a failed read, retried, no "wait" class.
	_, err = sc.Credentials(ctx, proxyWithAuth(v1alpha1.ProxyModeExternal, "fresh"))
	if err == nil || errors.Is(err, ErrSecretMissing) || errors.Is(err, ErrSecretNotOptedIn) ||
		!strings.Contains(err.Error(), "secret crawl/fresh (spec.proxy.basicAuth.secretRef) carries the label egress.hrajfrisbee.cz/proxy-credentials but is not in the operator's cache yet") {
		t.Errorf("labelled, not cached yet: %v", err)
	}
	if len(metaReads) != 3 {
		t.Fatalf("%d metadata reads, want 3", len(metaReads))
	}
	for _, obj := range metaReads {
		if _, ok := obj.(*metav1.PartialObjectMetadata); !ok {
			t.Errorf("the metadata reader was asked for a %T, want only PartialObjectMetadata (never the data)", obj)
		}
	}
	// A failed metadata read is a failed read too.
	brokenMeta := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return errors.New("connection refused")
		},
	}).Build()
	_, err = SecretCredentials{Reader: cacheLike, Metadata: brokenMeta}.Credentials(ctx, proxyWithAuth(v1alpha1.ProxyModeManaged, "deploy-bot"))
	if err == nil || errors.Is(err, ErrSecretMissing) || errors.Is(err, ErrSecretNotOptedIn) ||
		!strings.Contains(err.Error(), "reading the metadata of secret crawl/deploy-bot (spec.proxy.basicAuth.secretRef): connection refused") {
		t.Errorf("failed metadata read: %v", err)
	}
}
