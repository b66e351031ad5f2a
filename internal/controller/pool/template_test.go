package pool

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// A pool's template hash covers every field of the template's spec.proxy, and the
// children it makes carry the field, so their intent differs from the old children's.
func TestPoolTemplateCoversEveryProxyConfigField(t *testing.T) {
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	r := &ProxyPoolReconciler{Scheme: scheme}
	pool := &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Name: "crawlers", Namespace: "crawl", UID: "pool-uid"}}
	pool.Spec.Template.Spec = controllertest.IntentTestProxy(&v1alpha1.ProxyConfig{}).Spec
	child := func(cfg *v1alpha1.ProxyConfig) (templateHash, intent string) {
		p := pool.DeepCopy()
		p.Spec.Template.Spec.Proxy = cfg
		s := &poolScope{pool: p, now: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), hash: TemplateHash(&p.Spec.Template)}
		px, err := r.newChild(s, placement{provider: "home", zone: "beelink"})
		if err != nil {
			t.Fatal(err)
		}
		px.Name = "crawlers-abcde"
		return s.hash, childIntent(t, px)
	}
	unsetTemplate, unsetIntent := child(&v1alpha1.ProxyConfig{})
	for _, l := range controllertest.ProxyConfigLeaves(t) {
		t.Run(l.Path, func(t *testing.T) {
			one, two := &v1alpha1.ProxyConfig{}, &v1alpha1.ProxyConfig{}
			l.Set(t, one, 1)
			l.Set(t, two, 2)
			t1, i1 := child(one)
			t2, i2 := child(two)
			if t1 == unsetTemplate || t1 == t2 {
				t.Errorf("template hashes %s (unset), %s, %s: the pool would not roll its children for %s", unsetTemplate, t1, t2, l.Path)
			}
			if i1 == unsetIntent || i1 == i2 {
				t.Errorf("children's intent hashes %s (unset), %s, %s: a child would not carry %s", unsetIntent, i1, i2, l.Path)
			}
		})
	}
}

// childIntent is the intent hash the Proxy reconciler computes for a child, with Secrets
// whose contents follow from their names (controllertest.SecretsFor).
func childIntent(t *testing.T, px *v1alpha1.Proxy) string {
	t.Helper()
	creds, wg := controllertest.SecretsFor(px)
	h, err := proxy.IntentHash(px, creds, wg)
	if err != nil {
		t.Fatalf("intent hash: %v", err)
	}
	return h
}
