package discovery

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// An unreachable report taken by one replica takes the proxy out of every answer of both
// replicas (each its own manager, cache and recorder) within about a second, for every
// site and key; a probe's passing answer (status.unreachableProbe, as the health engine
// writes it) puts it back on both.
func TestUnreachableReportLeavesEveryReplicasAnswers(t *testing.T) {
	ctx := testContext(t)
	ns := newNamespace(t, ctx)
	createReadyProxies(t, ctx, ns, 4)
	a := startReplica(t, ctx, ns, false)
	b := startReplica(t, ctx, ns, false)
	q := "namespace=" + ns
	waitListing(t, q, 4, a, b)
	victim := pickName(t, a.h, q+"&key=k")

	start := time.Now()
	res, body := post(t, a.h, "/v1/feedback", fmt.Sprintf(`{"reports":[{"proxy":%q,"outcome":"unreachable"}]}`, victim))
	if res.StatusCode != http.StatusOK || !strings.Contains(body, `"accepted":1`) {
		t.Fatalf("feedback: %d %s", res.StatusCode, body)
	}
	out := func(r *replica) error {
		if got := pickName(t, r.h, q+"&key=k"); got == victim {
			return fmt.Errorf("pick?key=k still %s", got)
		}
		_, body := get(t, r.h, "/v1/proxies?"+q+"&domain=news.example")
		if got := names(decodeList(t, body)); strings.Contains(got, victim) || strings.Count(got, ",") != 2 {
			return fmt.Errorf("list?domain=news.example %s", got)
		}
		return nil
	}
	testutil.WaitFor(t, waitLong, victim+" out of both replicas' answers", func() (bool, error) {
		for _, r := range []*replica{a, b} {
			if err := out(r); err != nil {
				return false, err
			}
		}
		return true, nil
	})
	took := time.Since(start)
	t.Logf("report -> out of both replicas' answers in %v", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("the proxy left the answers %v after the report, want within about a second (2s at most)", took)
	}
	_, body = get(t, b.h, "/v1/proxies?"+q+"&healthy=any&format=json")
	if !strings.Contains(body, `"name":"`+strings.TrimPrefix(victim, ns+"/")+`","namespace":"`+ns+`","url":"http://192.0.2.`) {
		t.Errorf("healthy=any leaves %s out: %s", victim, body)
	}

	// The health engine's answer: the probe passed.
	key := client.ObjectKey{Namespace: ns, Name: strings.TrimPrefix(victim, ns+"/")}
	c := shared.Client(t)
	px := &v1alpha1.Proxy{}
	if err := c.Get(ctx, key, px); err != nil {
		t.Fatal(err)
	}
	if px.Status.Unreachable == nil || px.Status.Unreachable.Reports != 1 {
		t.Fatalf("status.unreachable %+v, want 1 report", px.Status.Unreachable)
	}
	base := px.DeepCopy()
	px.Status.UnreachableProbe = &v1alpha1.ProxyUnreachableProbe{ReportedAt: px.Status.Unreachable.ReportedAt, ProbedAt: metav1.Now(), Passed: true}
	if err := c.Status().Patch(ctx, px, client.MergeFrom(base), client.FieldOwner(statusapply.ProxyHealth)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, waitLong, victim+" back in both replicas' pick", func() (bool, error) {
		for _, r := range []*replica{a, b} {
			if got := pickName(t, r.h, q+"&key=k"); got != victim {
				return false, fmt.Errorf("picked %s", got)
			}
		}
		return true, nil
	})
}
