package discovery

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

func pooled(name, pool string) Entry {
	e := entry("crawl", name, true, "kvm2-home", "eu", "eu-1", nil)
	e.Pool = pool
	return e
}

// ?pool=NAME keeps the proxies of one ProxyPool, in list and pick.
func TestPoolFilter(t *testing.T) {
	src := newStaticSource(pooled("news-a1b2c", "news"), pooled("news-d3e4f", "news"), pooled("shop-g5h6i", "shop"), pooled("lone", ""))
	h := newTestServer(t, src, Options{}).Handler()
	for query, want := range map[string]string{
		"?pool=news":                 "crawl/news-a1b2c,crawl/news-d3e4f",
		"?pool=shop&namespace=crawl": "crawl/shop-g5h6i",
		"?pool=nowhere":              "",
		"":                           "crawl/lone,crawl/news-a1b2c,crawl/news-d3e4f,crawl/shop-g5h6i",
	} {
		res, body := get(t, h, "/v1/proxies"+query)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", query, res.StatusCode, body)
		}
		if got := names(decodeList(t, body)); got != want {
			t.Errorf("%s: got %q, want %q", query, got, want)
		}
	}
	for i := 0; i < 20; i++ {
		res, body := get(t, h, fmt.Sprintf("/v1/proxies/pick?pool=shop&key=session-%d", i))
		var picked Entry
		if err := json.Unmarshal([]byte(body), &picked); err != nil || res.StatusCode != http.StatusOK || picked.Name != "shop-g5h6i" || picked.Pool != "shop" {
			t.Fatalf("pick in pool shop: %d %s, want shop-g5h6i", res.StatusCode, body)
		}
	}
	if res, body := get(t, h, "/v1/proxies/pick?pool=nowhere&key=k"); res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("pick in an empty pool: %d %s", res.StatusCode, body)
	}
}

// A Proxy's pool is its ProxyPool controller, not its label; a cordoned Proxy is not
// healthy, and cordoning it changes its entry (so the snapshot is rebuilt).
func TestEntryForPoolAndCordon(t *testing.T) {
	px := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: "news-a1b2c", Namespace: "crawl", Labels: map[string]string{v1alpha1.PoolLabel: "news"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: "news", UID: "u1", Controller: ptr.To(true)}}},
		Spec:   v1alpha1.ProxySpec{Provider: "kvm2-home", Port: 3128},
		Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, Healthy: true, IP: "192.0.2.7"},
	}
	e, ok := EntryFor(px)
	if !ok || e.Pool != "news" || !e.Healthy {
		t.Fatalf("entry %+v, %v: want pool news, healthy", e, ok)
	}
	labelled := px.DeepCopy()
	labelled.OwnerReferences = nil
	if e, _ := EntryFor(labelled); e.Pool != "" {
		t.Errorf("a pool label without a controller reference gave pool %q", e.Pool)
	}
	notController := px.DeepCopy()
	notController.OwnerReferences[0].Controller = nil
	if e, _ := EntryFor(notController); e.Pool != "" {
		t.Errorf("an owner that is not the controller gave pool %q", e.Pool)
	}
	cordoned := px.DeepCopy()
	cordoned.Annotations = map[string]string{v1alpha1.CordonAnnotation: "true"}
	if e, _ := EntryFor(cordoned); e.Healthy {
		t.Error("a cordoned proxy is handed out as healthy")
	}
	if sameEntry(px, cordoned) {
		t.Error("cordoning does not change the entry: the snapshot would keep handing it out")
	}
	uncordoned := px.DeepCopy()
	uncordoned.Annotations = map[string]string{v1alpha1.CordonAnnotation: "false"}
	if e, _ := EntryFor(uncordoned); !e.Healthy {
		t.Error(`cordon "false" took the proxy out`)
	}
}
