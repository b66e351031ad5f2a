package discovery

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
)

// An unreachable report needs no domain; one given is checked like any other and not
// used: the report is about the proxy, for every site.
func TestFeedbackTakesUnreachable(t *testing.T) {
	sk := &sink{}
	h := newTestServer(t, fixture(), Options{Feedback: sk}).Handler()
	body := `{"reports":[
		{"proxy":"http://10.0.5.6:3128","outcome":"unreachable"},
		{"proxy":"other/d","domain":"shop.example.com","outcome":"unreachable"},
		{"proxy":"other/d","domain":"co.uk","outcome":"unreachable"},
		{"proxy":"other/d","outcome":"banned"},
		{"proxy":"other/nope","outcome":"unreachable"}
	]}`
	res, got := post(t, h, "/v1/feedback", body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", res.StatusCode, got)
	}
	var ans feedbackAnswer
	if err := json.Unmarshal([]byte(got), &ans); err != nil {
		t.Fatal(err)
	}
	if ans.Accepted != 2 || len(ans.Rejected) != 3 {
		t.Fatalf("answer %s, want 2 accepted and 3 rejected", got)
	}
	for i, want := range []string{"domain: bad domain \"co.uk\"", "domain: bad domain", "unknown proxy \"other/nope\""} {
		if r := ans.Rejected[i]; r.Index != i+2 || !strings.Contains(r.Error, want) {
			t.Errorf("rejection %d: %+v, want index %d saying %q", i, r, i+2, want)
		}
	}
	wantGot := []string{"crawl/a  unreachable 0s", "other/d  unreachable 0s"}
	if strings.Join(sk.got, "|") != strings.Join(wantGot, "|") {
		t.Errorf("sink got %q, want %q", sk.got, wantGot)
	}
	res, got = post(t, h, "/v1/feedback", `{"reports":[{"proxy":"other/d","outcome":"gone"}]}`)
	if res.StatusCode != http.StatusOK || !strings.Contains(got, "use banned, throttled, ok or unreachable") {
		t.Errorf("an unknown outcome: %d %s, want a rejection listing unreachable", res.StatusCode, got)
	}
}

// A Proxy with an unreachable report no probe has answered is not handed out; once a
// probe has answered it, it is again.
func TestEntryForLeavesOutAnUnansweredUnreachableReport(t *testing.T) {
	reported := metav1.NewMicroTime(time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC))
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
		Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, IP: "192.0.2.1", Healthy: true}}
	if e, _ := EntryFor(px); !e.Healthy {
		t.Fatal("a Ready healthy proxy is not healthy")
	}
	marked := px.DeepCopy()
	marked.Status.Unreachable = &v1alpha1.ProxyUnreachable{ReportedAt: reported, Reports: 1}
	if e, _ := EntryFor(marked); e.Healthy {
		t.Error("a proxy reported unreachable is handed out")
	}
	if sameEntry(px, marked) {
		t.Error("the report does not make a new snapshot")
	}
	answered := marked.DeepCopy()
	answered.Status.UnreachableProbe = &v1alpha1.ProxyUnreachableProbe{ReportedAt: reported, ProbedAt: metav1.Now(), Passed: true}
	if e, _ := EntryFor(answered); !e.Healthy {
		t.Error("a proxy whose report a probe answered is left out")
	}
	again := answered.DeepCopy()
	again.Status.Unreachable.ReportedAt = metav1.NewMicroTime(reported.Add(time.Microsecond))
	if e, _ := EntryFor(again); e.Healthy || !bans.UnreachableOpen(&again.Status) {
		t.Error("a report after the answered one is not open")
	}
}

// rendezvousFixture is n healthy proxies with distinct addresses, crawl/p00...
func rendezvousFixture(n int) *staticSource {
	var es []Entry
	for i := range n {
		es = append(es, Entry{Namespace: "crawl", Name: fmt.Sprintf("p%02d", i), URL: fmt.Sprintf("http://10.1.0.%d:3128", i+1),
			Healthy: true, EgressIP: fmt.Sprintf("198.51.100.%d", i+1)})
	}
	return newStaticSource(es...)
}

// ?exclude= leaves the named proxies out of one pick: the answer is the next in the key's
// rendezvous order, never an excluded one, by URL (with or without credentials) or by
// namespace/name, repeated or comma-separated; an entry naming no proxy is ignored.
func TestPickExcludeGivesTheNextRendezvousChoice(t *testing.T) {
	src := rendezvousFixture(8)
	h := newTestServer(t, src, Options{}).Handler()
	snap, _ := src.Snapshot(t.Context())
	urlOf := func(name string) string { return snap.byName[name].URL }
	for k := range 20 {
		key := fmt.Sprintf("session-%d", k)
		// The key's rendezvous order: each pick with everything before it excluded.
		var order []string
		skip := map[*item]bool{}
		for range 8 {
			it := snap.pick(key, &filter{}, skip)
			order = append(order, it.Namespace+"/"+it.Name)
			skip[it] = true
		}
		if got := pickName(t, h, "key="+key); got != order[0] {
			t.Fatalf("%s: pick %s, want %s", key, got, order[0])
		}
		if got := pickName(t, h, "key="+key+"&exclude="+order[0]); got != order[1] {
			t.Errorf("%s: excluding %s picked %s, want the next, %s", key, order[0], got, order[1])
		}
		withCreds := strings.Replace(urlOf(order[0]), "http://", "http://user:pw@", 1)
		q := "key=" + key + "&exclude=" + withCreds + "," + order[1] + "&exclude=" + urlOf(order[2]) + "&exclude=nowhere/none,http://10.9.9.9:3128"
		if got := pickName(t, h, q); got != order[3] {
			t.Errorf("%s: excluding the first three picked %s, want %s", key, got, order[3])
		}
	}
	// Everything excluded: no proxy.
	var all []string
	for _, it := range snap.all {
		all = append(all, it.Namespace+"/"+it.Name)
	}
	if res, body := get(t, h, "/v1/proxies/pick?key=k&exclude="+strings.Join(all, ",")); res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("every proxy excluded: %d %s, want 503", res.StatusCode, body)
	}
	// The listing leaves them out too.
	_, body := get(t, h, "/v1/proxies?exclude="+all[0]+"&exclude="+urlOf(all[1]))
	if got := names(decodeList(t, body)); strings.Contains(got, all[0]) || strings.Contains(got, all[1]) || strings.Count(got, ",") != 5 {
		t.Errorf("list with two excluded: %s", got)
	}
}

// A malformed exclude entry is a 400 naming the parameter; so is a parameter the
// endpoint does not know, whose message lists exclude among the accepted ones.
func TestExcludeRefusesMalformedEntries(t *testing.T) {
	h := newTestServer(t, rendezvousFixture(3), Options{}).Handler()
	for _, tc := range []struct{ query, param, mention string }{
		{"key=k&exclude=", "exclude", "empty"},
		{"key=k&exclude=crawl/p00,,crawl/p01", "exclude", "empty"},
		{"key=k&exclude=p00", "exclude", "neither a URL nor namespace/name"},
		{"key=k&exclude=a/b/c", "exclude", "neither a URL nor namespace/name"},
		{"key=k&exclude=http://", "exclude", "without a host"},
		{"key=k&exclude=http://%5B::1", "exclude", "not a URL"},
		{"key=k&exclude=" + strings.Repeat("a/b,", maxExclude) + "a/b", "exclude", "more than 100 entries"},
		{"key=k&excludes=crawl/p00", "excludes", "key, namespace, provider, zone, region, labelSelector, format, credentials, pool, domain, ipFamily, exclude"},
	} {
		res, body := get(t, h, "/v1/proxies/pick?"+tc.query)
		var e struct{ Error, Parameter string }
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Fatalf("%s: error body %q is not JSON: %v", tc.query, body, err)
		}
		if res.StatusCode != http.StatusBadRequest || e.Parameter != tc.param || !strings.Contains(e.Error, tc.mention) {
			t.Errorf("%s: %d %+v, want 400 naming %q and saying %q", tc.query, res.StatusCode, e, tc.param, tc.mention)
		}
	}
	res, body := get(t, h, "/v1/proxies?excludes=x")
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "pool, domain, distinctEgress, ipFamily, exclude") {
		t.Errorf("list with an unknown parameter: %d %s", res.StatusCode, body)
	}
}
