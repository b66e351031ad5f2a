package proxyconfig

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

func TestForProxy(t *testing.T) {
	ctx := context.Background()
	lookup := func(_ context.Context, px *v1alpha1.Proxy) (*Credentials, error) {
		if px.Spec.Proxy.BasicAuth.SecretRef.Name == "gone" {
			return nil, ErrSecretMissing
		}
		return sampleConfig().Credentials, nil
	}
	user := "#cloud-config\ntimezone: UTC\n"
	plain := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: "p"}, Spec: v1alpha1.ProxySpec{Port: 3128, CloudInit: user}}

	// Without spec.proxy, and for an External Proxy, the cloud-init is left as it is.
	ext := proxyWithAuth(v1alpha1.ProxyModeExternal, "auth")
	ext.Spec.CloudInit = user
	for name, px := range map[string]*v1alpha1.Proxy{"no spec.proxy": plain, "External": ext} {
		r, err := ForProxy(ctx, px, nil)
		if err != nil || string(r.UserData) != user || r.HashInput != user {
			t.Errorf("%s: %q %q %v, want the cloud-init unchanged", name, r.UserData, r.HashInput, err)
		}
	}

	px := proxyWithAuth(v1alpha1.ProxyModeManaged, "auth")
	px.Spec.Port, px.Spec.CloudInit = 3128, user
	r, err := ForProxy(ctx, px, lookup)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ConfigFor(px, sampleConfig().Credentials)
	wantDoc, _ := UserData(cfg, user)
	wantIn, _ := SpecHashInput(cfg, user)
	if string(r.UserData) != string(wantDoc) || r.HashInput != wantIn {
		t.Errorf("ForProxy differs from UserData and SpecHashInput of its Config")
	}
	if !strings.Contains(string(r.UserData), "BasicAuth crawler ") || !strings.Contains(string(r.UserData), "timezone: UTC") {
		t.Errorf("user-data lacks the credentials or the user's part:\n%s", r.UserData)
	}

	noAuth := px.DeepCopy()
	noAuth.Spec.Proxy.BasicAuth = nil
	if r, err := ForProxy(ctx, noAuth, nil); err != nil || strings.Contains(string(r.UserData), "BasicAuth") {
		t.Errorf("without basic auth: %v\n%s", err, r.UserData)
	}

	// Split halves of IPv4 without basic auth: an open proxy, unless allowOpenProxy.
	split := noAuth.DeepCopy()
	split.Spec.Proxy.AllowedSourceRanges = []v1alpha1.CIDR{"0.0.0.0/1", "128.0.0.0/1"}
	if _, err := ForProxy(ctx, split, nil); !errors.Is(err, ErrOpenProxy) {
		t.Errorf("split halves without basic auth: %v, want ErrOpenProxy", err)
	}
	split.Spec.Proxy.AllowOpenProxy = true
	if _, err := ForProxy(ctx, split, nil); err != nil {
		t.Errorf("split halves with allowOpenProxy: %v", err)
	}

	gone := proxyWithAuth(v1alpha1.ProxyModeManaged, "gone")
	if _, err := ForProxy(ctx, gone, lookup); !errors.Is(err, ErrSecretMissing) {
		t.Errorf("a missing Secret: %v", err)
	}
	if _, err := ForProxy(ctx, px, nil); err == nil || !strings.Contains(err.Error(), "no way to read Secrets") {
		t.Errorf("no lookup: %v", err)
	}
	bad := px.DeepCopy()
	bad.Spec.CloudInit = "just text"
	if _, err := ForProxy(ctx, bad, lookup); !errors.Is(err, ErrUserCloudInit) {
		t.Errorf("a user cloud-init of no known kind: %v", err)
	}
	bad = px.DeepCopy()
	bad.Spec.Port = 0
	if _, err := ForProxy(ctx, bad, lookup); err == nil || !strings.Contains(err.Error(), "spec.port 0") {
		t.Errorf("port 0: %v", err)
	}
}
