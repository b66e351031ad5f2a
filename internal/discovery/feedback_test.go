package discovery

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
)

// sink records the reports the endpoint took.
type sink struct {
	mu   sync.Mutex
	got  []string
	reps []bans.Report
}

func (s *sink) Add(px types.NamespacedName, r bans.Report) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, fmt.Sprintf("%s %s %s %s", px, r.Site, r.Outcome, r.RetryAfter))
	s.reps = append(s.reps, r)
}

func post(t testing.TB, h http.Handler, target, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testToken)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	res := rec.Result()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func TestFeedbackTakesGoodReportsAndRejectsBadOnes(t *testing.T) {
	sk := &sink{}
	h := newTestServer(t, fixture(), Options{Feedback: sk}).Handler()
	body := `{"reports":[
		{"proxy":"http://10.0.5.6:3128","domain":"shop.example.com","outcome":"banned"},
		{"proxy":"http://user:pw@10.0.5.6:3128/","domain":"a.b.example.co.uk","outcome":"throttled","retryAfterSeconds":30},
		{"proxy":"other/d","domain":"Example.ORG","outcome":"ok"},
		{"proxy":"other/nope","domain":"example.com","outcome":"banned"},
		{"proxy":"http://10.9.9.9:3128","domain":"example.com","outcome":"banned"},
		{"proxy":"crawl/a","domain":"co.uk","outcome":"banned"},
		{"proxy":"crawl/a","domain":"192.0.2.1","outcome":"banned"},
		{"proxy":"crawl/a","domain":"example.com","outcome":"blocked"},
		{"proxy":"crawl/a","domain":"example.com","outcome":"throttled","retryAfterSeconds":-1}
	]}`
	res, got := post(t, h, "/v1/feedback", body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", res.StatusCode, got)
	}
	var ans feedbackAnswer
	if err := json.Unmarshal([]byte(got), &ans); err != nil {
		t.Fatal(err)
	}
	if ans.Accepted != 3 || len(ans.Rejected) != 6 {
		t.Fatalf("answer %s, want 3 accepted and 6 rejected", got)
	}
	for i, want := range []string{"unknown proxy \"other/nope\"", "unknown proxy \"http://10.9.9.9:3128\"", "co.uk", "an IP address", "unknown outcome \"blocked\"", "retryAfterSeconds -1"} {
		if r := ans.Rejected[i]; r.Index != i+3 || !strings.Contains(r.Error, want) {
			t.Errorf("rejection %d: %+v, want index %d saying %q", i, r, i+3, want)
		}
	}
	wantGot := []string{"crawl/a example.com banned 0s", "crawl/a example.co.uk throttled 30s", "other/d example.org ok 0s"}
	if strings.Join(sk.got, "|") != strings.Join(wantGot, "|") {
		t.Errorf("sink got %q, want %q", sk.got, wantGot)
	}
}

func TestFeedbackRefusesMalformedBodiesWhole(t *testing.T) {
	sk := &sink{}
	h := newTestServer(t, fixture(), Options{Feedback: sk}).Handler()
	one := `{"proxy":"crawl/a","domain":"example.com","outcome":"banned"}`
	many := func(n int) string { return `{"reports":[` + strings.TrimSuffix(strings.Repeat(one+",", n), ",") + `]}` }
	for _, tc := range []struct {
		name, body string
		status     int
		want       string
	}{
		{"empty", "", 400, "empty"},
		{"not json", "reports=1", 400, "not a JSON object"},
		{"a list", "[]", 400, "not a JSON object"},
		{"unknown field", `{"report":[]}`, 400, `unknown field \"report\"`},
		{"wrong type", `{"reports":[{"proxy":1}]}`, 400, "reports.proxy"},
		{"no reports", `{"reports":[]}`, 400, "no reports"},
		{"trailing data", many(1) + "{}", 400, "more than one JSON value"},
		{"1,001 reports", many(1001), 400, "1001 reports; send at most 1000"},
		{"over 1 MiB", `{"reports":[` + one + `],"x":"` + strings.Repeat("a", 1<<20) + `"}`, 413, "larger than 1048576 bytes"},
	} {
		res, got := post(t, h, "/v1/feedback", tc.body)
		if res.StatusCode != tc.status || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %d %s, want %d naming %q", tc.name, res.StatusCode, got, tc.status, tc.want)
		}
	}
	if len(sk.got) != 0 {
		t.Errorf("malformed bodies changed state: %v", sk.got)
	}
	if res, got := post(t, h, "/v1/feedback", many(1000)); res.StatusCode != 200 || !strings.Contains(got, `"accepted":1000`) {
		t.Errorf("1,000 reports: %d %s", res.StatusCode, got)
	}
	res, got := get(t, h, "/v1/feedback")
	if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "POST" {
		t.Errorf("GET /v1/feedback: %d %s", res.StatusCode, got)
	}
	if res, got := post(t, tokenServerOpts(t, fixture(), Options{}), "/v1/feedback", many(1)); res.StatusCode != 503 {
		t.Errorf("without a sink: %d %s", res.StatusCode, got)
	}
}

func TestFeedbackNeedsTheToken(t *testing.T) {
	sk := &sink{}
	s := tokenServerOpts(t, fixture(), Options{Feedback: sk})
	body := `{"reports":[{"proxy":"crawl/a","domain":"example.com","outcome":"banned"}]}`
	if res, got := post(t, s, "/v1/feedback", body, "Authorization", ""); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("without a token: %d %s", res.StatusCode, got)
	}
	if res, got := post(t, s, "/v1/feedback", body, "Authorization", "Bearer wrong"); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("with a wrong token: %d %s", res.StatusCode, got)
	}
	if res, got := post(t, s, "/v1/feedback", body, "Authorization", bearer); res.StatusCode != http.StatusOK || len(sk.got) != 1 {
		t.Errorf("with the token: %d %s", res.StatusCode, got)
	}
}

// cool marks e cooling for site until until.
func cool(e Entry, site string, until time.Time) Entry {
	e.cooldowns = append(e.cooldowns, v1alpha1.ProxyCooldown{Site: site, Until: metav1.NewTime(until), Bans: 1, LastOutcome: v1alpha1.CooldownBanned})
	return e
}

func TestDomainLeavesOutCoolingProxies(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	f := fixture()
	es := []Entry{}
	for _, it := range f.snap.Load().items {
		e := it.Entry
		if e.Name == "a" {
			e = cool(e, "example.com", clk.Now().Add(time.Minute))
		}
		es = append(es, e)
	}
	f.set(es...)
	h := newTestServer(t, f, Options{Clock: clk}).Handler()
	for _, tc := range []struct{ query, want string }{
		{"?domain=shop.example.com", "crawl/b,other/d,other/e"},
		{"?domain=example.org", "crawl/a,crawl/b,other/d,other/e"},
		{"?domain=shop.example.com&namespace=crawl&healthy=any", "crawl/b,crawl/c"},
	} {
		res, body := get(t, h, "/v1/proxies"+tc.query)
		if res.StatusCode != 200 || names(decodeList(t, body)) != tc.want {
			t.Errorf("%s: %d %s, want %s", tc.query, res.StatusCode, body, tc.want)
		}
	}
	// The cooldown ends: a is back.
	clk.Step(time.Minute)
	if _, body := get(t, h, "/v1/proxies?domain=example.com"); names(decodeList(t, body)) != "crawl/a,crawl/b,other/d,other/e" {
		t.Errorf("after the cooldown: %s", body)
	}
	for _, bad := range []string{"co.uk", "10.0.0.1", "a..b"} {
		res, body := get(t, h, "/v1/proxies/pick?domain="+bad)
		if res.StatusCode != 400 || !strings.Contains(body, `"parameter":"domain"`) {
			t.Errorf("?domain=%s: %d %s, want 400 naming domain", bad, res.StatusCode, body)
		}
	}
}

// pickName asks h for a pick and returns namespace/name.
func pickName(t *testing.T, h http.Handler, query string) string {
	t.Helper()
	res, body := get(t, h, "/v1/proxies/pick?"+query)
	if res.StatusCode != 200 {
		t.Fatalf("pick?%s: %d %s", query, res.StatusCode, body)
	}
	var e Entry
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatal(err)
	}
	return e.Namespace + "/" + e.Name
}

// A proxy starting to cool for a site moves only the keys it held, and only for that
// site; pick with a domain and no key sticks to the site's own proxy.
func TestDomainPickMovesOnlyTheCoolingProxysKeys(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var es []Entry
	for i := range 20 {
		es = append(es, Entry{Namespace: "ns", Name: fmt.Sprintf("p%02d", i), URL: fmt.Sprintf("http://10.1.0.%d:3128", i), Healthy: true})
	}
	src := newStaticSource(es...)
	h := newTestServer(t, src, Options{Clock: clk}).Handler()
	before := map[string]string{}
	for k := range 1000 {
		before[fmt.Sprint(k)] = pickName(t, h, fmt.Sprintf("key=%d&domain=example.com", k))
	}
	victim := before["0"]
	siteKey := pickName(t, h, "domain=shop.example.com")
	if again := pickName(t, h, "key=example.com"); again != siteKey {
		t.Errorf("pick?domain=shop.example.com gave %s, pick?key=example.com %s: the site is not the key", siteKey, again)
	}
	for i := range es {
		if es[i].Namespace+"/"+es[i].Name == victim {
			es[i] = cool(es[i], "example.com", clk.Now().Add(time.Hour))
		}
	}
	src.set(es...)
	moved := 0
	for k, was := range before {
		now := pickName(t, h, "key="+k+"&domain=example.com")
		switch {
		case was == victim && now == victim:
			t.Fatalf("key %s still picks %s, which cools for example.com", k, victim)
		case was == victim:
			moved++
		case now != was:
			t.Fatalf("key %s moved from %s to %s, though %s did not cool", k, was, now, was)
		}
		if other := pickName(t, h, "key="+k+"&domain=example.org"); other != was {
			t.Fatalf("key %s on another site moved from %s to %s", k, was, other)
		}
	}
	if moved == 0 {
		t.Fatal("no key moved")
	}
}

func TestSaturationAnswers503WithRetryAfter(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var es []Entry
	for i := range 10 {
		e := Entry{Namespace: "ns", Name: fmt.Sprintf("p%d", i), URL: fmt.Sprintf("http://10.1.0.%d:3128", i), Healthy: true, Pool: "pool"}
		if i < 5 {
			e = cool(e, "example.com", clk.Now().Add(time.Duration(100+i)*time.Second-300*time.Millisecond))
		}
		es = append(es, e)
	}
	src := newStaticSource(es...)
	pools := map[types.NamespacedName]*v1alpha1.PoolBans{{Namespace: "ns", Name: "pool"}: {MaxCoolingPercent: ptr.To[int32](30)}}
	opts := Options{Clock: clk, PoolBans: func(_ context.Context, k types.NamespacedName) *v1alpha1.PoolBans { return pools[k] }}
	h := newTestServer(t, src, opts).Handler()
	// 5 of 10 cooling is not more than 50%.
	if res, body := get(t, h, "/v1/proxies/pick?domain=example.com"); res.StatusCode != 200 {
		t.Fatalf("5 of 10 cooling: %d %s", res.StatusCode, body)
	}
	// The pool's own threshold, 30%, applies to a request naming it.
	for _, path := range []string{"/v1/proxies/pick?domain=example.com&pool=pool", "/v1/proxies?pool=pool&domain=example.com"} {
		res, body := get(t, h, path)
		if res.StatusCode != 503 || res.Header.Get("Retry-After") != "100" ||
			!strings.Contains(body, "site example.com is saturated: 5 of the 10 proxies") || !strings.Contains(body, "more than 30%") {
			t.Errorf("%s: %d Retry-After %q %s", path, res.StatusCode, res.Header.Get("Retry-After"), body)
		}
	}
	// One more cools: 6 of 10 is more than 50%.
	es[5] = cool(es[5], "example.com", clk.Now().Add(time.Hour))
	src.set(es...)
	res, body := get(t, h, "/v1/proxies/pick?domain=example.com")
	if res.StatusCode != 503 || res.Header.Get("Retry-After") != "100" || !strings.Contains(body, "6 of the 10") {
		t.Errorf("6 of 10 cooling: %d Retry-After %q %s", res.StatusCode, res.Header.Get("Retry-After"), body)
	}
	// Other sites and requests without a domain are not held back.
	if res, body := get(t, h, "/v1/proxies/pick?domain=example.org"); res.StatusCode != 200 {
		t.Errorf("another site: %d %s", res.StatusCode, body)
	}
	// The first cooldown ends: 5 of 10 again.
	clk.Step(100 * time.Second)
	if res, body := get(t, h, "/v1/proxies/pick?domain=example.com"); res.StatusCode != 200 {
		t.Errorf("after the first cooldown ended: %d %s", res.StatusCode, body)
	}
	// All matching proxies cooling is saturated at any threshold.
	opts.MaxCoolingPercent = 100
	h = newTestServer(t, src, opts).Handler()
	if res, body := get(t, h, "/v1/proxies/pick?domain=example.com&namespace=ns&labelSelector=x%3Dy"); res.StatusCode != 503 {
		t.Errorf("none matching: %d %s", res.StatusCode, body)
	}
	if res, body := get(t, h, "/v1/proxies?domain=example.com&pool=none"); res.StatusCode != 200 || !bytes.Contains([]byte(body), []byte(`"count":0`)) {
		t.Errorf("no proxy matching: %d %s", res.StatusCode, body)
	}
}

// tokenServerOpts is a server with opts behind the test token.
func tokenServerOpts(t *testing.T, src Source, opts Options) http.Handler {
	path := filepath.Join(t.TempDir(), "token")
	writeToken(t, path, "s3cret-token\n")
	opts.TokenFile = path
	return newTestServer(t, src, opts).Handler()
}

// A draining server (the manager is stopping) refuses feedback with 503 and Retry-After,
// for the crawler to send it again to another replica, and hands its sink nothing; reads
// are still answered.
func TestFeedbackRefusedWhileDraining(t *testing.T) {
	sk := &sink{}
	srv := newTestServer(t, fixture(), Options{Feedback: sk})
	h := srv.Handler()
	report := `{"reports":[{"proxy":"crawl/a","domain":"example.com","outcome":"banned"}]}`
	if res, body := post(t, h, "/v1/feedback", report); res.StatusCode != http.StatusOK {
		t.Fatalf("before Drain: %d %s", res.StatusCode, body)
	}
	srv.Drain()
	srv.Drain() // more than once is fine
	res, body := post(t, h, "/v1/feedback", report)
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") != "1" || !strings.Contains(body, "shutting down") {
		t.Errorf("while draining: %d Retry-After %q %s, want 503, Retry-After 1, saying it is shutting down", res.StatusCode, res.Header.Get("Retry-After"), body)
	}
	sk.mu.Lock()
	n := len(sk.got)
	sk.mu.Unlock()
	if n != 1 {
		t.Errorf("the sink took %d reports, want only the one sent before Drain", n)
	}
	if res, _ := get(t, h, "/v1/proxies"); res.StatusCode != http.StatusOK {
		t.Errorf("GET /v1/proxies while draining: %d, want 200", res.StatusCode)
	}
}
