package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// A pick for a pool at zero (the ProxyPool exists, no proxy of it serves) answers 503
// with Retry-After and a JSON error naming the pool, with or without ?namespace=, and
// wakes the pool: the manager's demand Lease for it (source kind discovery) carries held
// 1 at once, in the demand namespace (not the pool's). A pick for a pool that does not exist keeps the plain 503; once a child
// serves, pick answers it and counts the pick as the pool's demand.
func TestPickAtZeroAnswers503AndWakes(t *testing.T) {
	ctx := testContext(t)
	ns := newNamespace(t, ctx)
	c := shared.Client(t)
	pool := testbuild.Pool(ns, "news", 0, testbuild.Managed(), testbuild.WithProvider("fake"))
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	mgr := shared.Env(t).NewManager(t, ns, nil)
	src, err := NewCacheSource(ctx, mgr.GetCache())
	if err != nil {
		t.Fatal(err)
	}
	const source = "discovery-manager-0"
	demandNS := newNamespace(t, ctx)
	picks := &PickDemand{Reporter: demand.NewReporter(c, demandNS, demand.KindDiscovery, source), Interval: time.Hour} // no interval resets the counts
	srv := newTestServer(t, src, Options{Pools: mgr.GetClient(), Demand: picks})
	rctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	testenv.StartManager(t, rctx, mgr)
	go picks.Start(rctx)
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	h := srv.Handler()

	for _, q := range []string{"namespace=" + ns + "&pool=news&key=k", "pool=news&key=k"} {
		var res *http.Response
		var body string
		testutil.WaitFor(t, waitLong, "pick?"+q+" to answer for the pool at zero", func() (bool, error) {
			res, body = get(t, h, "/v1/proxies/pick?"+q)
			return res.Header.Get("Retry-After") != "", fmt.Errorf("%d %s", res.StatusCode, body)
		})
		var e struct{ Error, Parameter string }
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Fatalf("pick?%s: %v: %s", q, err, body)
		}
		want := fmt.Sprintf("pool %s/news has no serving proxy yet; retry after 10s", ns)
		if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") != "10" || e.Error != want || e.Parameter != "pool" {
			t.Errorf("pick?%s: %d, Retry-After %q, %+v; want 503, 10, %q naming parameter pool", q, res.StatusCode, res.Header.Get("Retry-After"), e, want)
		}
	}

	leaseName := demand.LeaseName(keyOf(ns, "news"), source)
	testutil.WaitFor(t, waitLong, "the wake: Lease "+leaseName+" with held > 0", func() (bool, error) {
		var l coordinationv1.Lease
		if err := c.Get(ctx, keyOf(demandNS, leaseName), &l); err != nil {
			return false, err
		}
		return l.Annotations[demand.AnnotationHeld] != "0" && l.Annotations[demand.AnnotationHeld] != "" &&
				l.Labels[demand.LabelSource] == demand.KindDiscovery && l.Labels[demand.LabelFor] == "news" && l.Labels[demand.LabelNamespace] == ns,
			fmt.Errorf("%v %v", l.Labels, l.Annotations)
	})

	res, body := get(t, h, "/v1/proxies/pick?pool=nope&key=k")
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") != "" || !strings.Contains(body, "no healthy proxy matches") {
		t.Errorf("pick for a pool that does not exist: %d, Retry-After %q, %s; want the plain 503", res.StatusCode, res.Header.Get("Retry-After"), body)
	}

	child := testbuild.Proxy(ns, "news-0", testbuild.External("192.0.2.40"), testbuild.WithPort(3128),
		testbuild.WithOwners(metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: "news",
			UID: pool.UID, Controller: ptr.To(true)}))
	if err := c.Create(ctx, child); err != nil {
		t.Fatal(err)
	}
	child.Status = v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, IP: "192.0.2.40", Healthy: true}
	if err := c.Status().Update(ctx, child); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, waitLong, "pick?pool=news to answer its child", func() (bool, error) {
		res, body := get(t, h, "/v1/proxies/pick?pool=news&key=k")
		return res.StatusCode == http.StatusOK && strings.Contains(body, `"name":"news-0"`), fmt.Errorf("%d %s", res.StatusCode, body)
	})
	picks.mu.Lock()
	counts := *picks.pools[keyOf(ns, "news")]
	picks.mu.Unlock()
	if counts.wakes < 2 || counts.picks <= counts.wakes {
		t.Errorf("pick counts of the pool %+v: want the two wakes and the answered pick", counts)
	}
}
