package discovery

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// replica is one manager replica's part in feedback: its own manager and cache, the
// feedback recorder and the discovery server over that cache, as cmd/manager wires them.
type replica struct {
	mgr  ctrl.Manager
	h    http.Handler
	stop context.CancelFunc
}

// startReplica starts a replica watching ns; with elect, its manager takes part in
// leader election on a lease in ns (the recorder and the server run on every replica,
// elected or not).
func startReplica(t *testing.T, ctx context.Context, ns string, elect bool) *replica {
	t.Helper()
	env := shared.Env(t)
	mgr := env.NewManager(t, ns, func(o *ctrl.Options) {
		if elect {
			o.LeaderElection, o.LeaderElectionID, o.LeaderElectionNamespace = true, "feedback-test", ns
			o.LeaderElectionReleaseOnCancel = true
		}
	})
	src, err := NewCacheSource(ctx, mgr.GetCache())
	if err != nil {
		t.Fatal(err)
	}
	rec := &bans.Recorder{Client: mgr.GetClient(), Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Policy: bans.DefaultPolicy}
	if err := mgr.Add(rec); err != nil {
		t.Fatal(err)
	}
	srv := newTestServer(t, src, Options{Feedback: rec})
	rctx, stop := context.WithCancel(ctx)
	testenv.StartManager(t, rctx, mgr)
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	return &replica{mgr: mgr, h: srv.Handler(), stop: stop}
}

// createReadyProxies creates n Ready, healthy Proxies p0... in ns.
func createReadyProxies(t *testing.T, ctx context.Context, ns string, n int) {
	t.Helper()
	var specs []proxySpec
	for i := range n {
		specs = append(specs, proxySpec{name: fmt.Sprintf("p%d", i), ip: fmt.Sprintf("192.0.2.%d", 10+i), zone: "a",
			phase: v1alpha1.PhaseReady, healthy: true})
	}
	createProxies(t, ctx, ns, specs)
}

// waitListing waits for every replica to list n proxies for the query q.
func waitListing(t *testing.T, q string, n int, replicas ...*replica) {
	t.Helper()
	testutil.WaitFor(t, waitLong, fmt.Sprintf("the replicas listing the %d proxies", n), func() (bool, error) {
		for _, r := range replicas {
			_, body := get(t, r.h, "/v1/proxies?"+q)
			if got := names(decodeList(t, body)); strings.Count(got, ",") != n-1 {
				return false, fmt.Errorf("listed %s", got)
			}
		}
		return true, nil
	})
}

func elected(m ctrl.Manager) bool {
	select {
	case <-m.Elected():
		return true
	default:
		return false
	}
}

// A ban reported to the follower removes the proxy from the leader's pick?domain= (and
// its list?domain=) within 2 s, for that site alone; a manager started afresh finds the
// cooldown in the Proxy's status.
func TestBanReportedToOneReplicaReachesAnother(t *testing.T) {
	ctx := testContext(t)
	ns := newNamespace(t, ctx)
	createReadyProxies(t, ctx, ns, 4)
	leader := startReplica(t, ctx, ns, true)
	testutil.WaitFor(t, waitLong, "the first replica elected", func() (bool, error) { return elected(leader.mgr), nil })
	follower := startReplica(t, ctx, ns, true)
	if elected(follower.mgr) {
		t.Fatal("both replicas elected")
	}
	q := "namespace=" + ns + "&domain=www.shop.example"
	waitListing(t, q, 4, leader, follower)
	victim := pickName(t, leader.h, q)
	if other := pickName(t, follower.h, q); other != victim {
		t.Fatalf("the replicas pick %s and %s for the site; want the same", victim, other)
	}
	other := pickName(t, leader.h, "namespace="+ns+"&domain=news.example&key=k") // another site's pick, to stay put

	start := time.Now()
	res, body := post(t, follower.h, "/v1/feedback",
		fmt.Sprintf(`{"reports":[{"proxy":%q,"domain":"shop.example","outcome":"banned"}]}`, victim))
	if res.StatusCode != http.StatusOK {
		t.Fatalf("feedback to the follower: %d %s", res.StatusCode, body)
	}
	testutil.WaitFor(t, waitLong, "the leader's pick to leave "+victim, func() (bool, error) {
		got := pickName(t, leader.h, q)
		return got != victim, fmt.Errorf("picked %s", got)
	})
	took := time.Since(start)
	t.Logf("the leader's pick moved %v after the follower took the report", took)
	if took > 2*time.Second {
		t.Errorf("the leader's pick moved after %v, want within 2s", took)
	}
	_, body = get(t, leader.h, "/v1/proxies?"+q)
	if got := names(decodeList(t, body)); strings.Contains(got, victim) {
		t.Errorf("the leader still lists %s for the site: %s", victim, got)
	}
	if got := pickName(t, leader.h, "namespace="+ns+"&domain=news.example&key=k"); got != other {
		t.Errorf("another site's pick moved from %s to %s", other, got)
	}

	// Both replicas stop; one started afresh leaves the proxy out from its first answer.
	leader.stop()
	follower.stop()
	restarted := startReplica(t, ctx, ns, false)
	_, body = get(t, restarted.h, "/v1/proxies?"+q)
	if got := names(decodeList(t, body)); strings.Count(got, ",") != 2 || strings.Contains(got, victim) {
		t.Errorf("after a restart the site's list is %s; want the 3 proxies other than %s", got, victim)
	}
}
