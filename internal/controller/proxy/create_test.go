package proxy

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
)

// TestPoolOfNamesTheControllingPool: a Create request names the ProxyPool that controls
// the Proxy (so that gce can share a firewall rule among its children), and nothing for
// a standalone Proxy, an owner that is not the controller, or a controller of another kind.
func TestPoolOfNamesTheControllingPool(t *testing.T) {
	ref := func(kind, apiVersion string, controller bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: "eu", UID: types.UID("pool-uid"), Controller: ptr.To(controller)}
	}
	gv := v1alpha1.GroupVersion.String()
	for _, c := range []struct {
		owners []metav1.OwnerReference
		want   provider.PoolRef
	}{
		{nil, provider.PoolRef{}},
		{[]metav1.OwnerReference{ref("ProxyPool", gv, true)}, provider.PoolRef{Namespace: "crawl", Name: "eu", UID: "pool-uid"}},
		{[]metav1.OwnerReference{ref("ProxyPool", gv, false)}, provider.PoolRef{}},
		{[]metav1.OwnerReference{ref("Deployment", "apps/v1", true)}, provider.PoolRef{}},
		{[]metav1.OwnerReference{ref("ProxyPool", "example.com/v1", true)}, provider.PoolRef{}},
	} {
		px := testbuild.Proxy("crawl", "eu-abc", testbuild.WithOwners(c.owners...))
		if got := poolOf(px); got != c.want {
			t.Errorf("owners %v: %+v, want %+v", c.owners, got, c.want)
		}
	}
}
