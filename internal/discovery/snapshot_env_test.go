package discovery

import (
	"fmt"
	"net/url"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// ?credentials=true hands out, for a Managed Proxy, the password of its snapshot (what
// its instance demands), not the rotated one of the Secret it references; and for an
// External Proxy the referenced Secret's as they are, by the External mode's rules
// (a password tinyproxy could not take is fine for a proxy the operator does not build).
func TestCredentialsFromSnapshotAndRealMode(t *testing.T) {
	ctx := testContext(t)
	ns := newNamespace(t, ctx)
	c := shared.Client(t)
	secret := func(name string, cr proxyconfig.Credentials, owner *v1alpha1.Proxy) {
		t.Helper()
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}}, Data: proxyconfig.SnapshotData(cr)}
		if owner != nil {
			sec.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Proxy",
				Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}
		}
		if err := c.Create(ctx, sec); err != nil {
			t.Fatal(err)
		}
	}
	auth := &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "source"}}
	secret("source", proxyconfig.Credentials{Username: "crawler", Password: "Rotated.since_2"}, nil)
	secret("ext-auth", proxyconfig.Credentials{Username: "vendor", Password: "s3cr3t!with#marks"}, nil)

	managed := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "managed"},
		Spec: v1alpha1.ProxySpec{Provider: "kvm2-home", Proxy: &v1alpha1.ProxyConfig{
			AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"}, BasicAuth: auth}}}
	external := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "external"},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "192.0.2.20", Proxy: &v1alpha1.ProxyConfig{
			BasicAuth: &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "ext-auth"}}}}}
	for i, px := range []*v1alpha1.Proxy{managed, external} {
		if err := c.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
		px.Status = v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, Healthy: true, IP: fmt.Sprintf("192.0.2.%d", 10+i)}
		if px == managed {
			px.Status.CredentialsSecret = proxyconfig.SnapshotName(px)
			secret(px.Status.CredentialsSecret, proxyconfig.Credentials{Username: "crawler", Password: "Built-with_1"}, px)
		}
		if err := c.Status().Update(ctx, px); err != nil {
			t.Fatal(err)
		}
	}
	mgr := shared.Env(t).NewManager(t, ns, nil)
	src, err := NewCacheSource(ctx, mgr.GetCache())
	if err != nil {
		t.Fatal(err)
	}
	testenv.StartManager(t, ctx, mgr)
	h := tokenServer(t, src, proxyconfig.SnapshotCredentials{Reader: mgr.GetClient()}.Credentials)
	want := map[string]string{"managed": "crawler:Built-with_1", "external": "vendor:s3cr3t!with#marks"}
	testutil.WaitFor(t, testutil.WaitLong, "both proxies handed out with the credentials they demand", func() (bool, error) {
		res, body := get(t, h, "/v1/proxies?credentials=true", "Authorization", bearer)
		if res.StatusCode != 200 {
			return false, fmt.Errorf("%d %s", res.StatusCode, body)
		}
		l := decodeList(t, body)
		if len(l.Proxies) != 2 {
			return false, fmt.Errorf("proxies %s", names(l))
		}
		for _, p := range l.Proxies {
			u, err := url.Parse(p.URL)
			if err != nil {
				return false, err
			}
			pw, _ := u.User.Password()
			if got := u.User.Username() + ":" + pw; got != want[p.Name] {
				return false, fmt.Errorf("%s handed out with %q, want %q", p.Name, got, want[p.Name])
			}
		}
		return true, nil
	})
}
