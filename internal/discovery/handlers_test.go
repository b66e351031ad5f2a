package discovery

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func fixture() *staticSource {
	return newStaticSource(
		entry("crawl", "a", true, "kvm2-home", "eu", "eu-1", map[string]string{"tier": "gold", "team": "x"}),
		entry("crawl", "b", true, "kvm2-home", "eu", "eu-2", map[string]string{"tier": "silver"}),
		entry("crawl", "c", false, "kvm2-home", "eu", "eu-1", map[string]string{"tier": "gold"}),
		entry("other", "d", true, "ext", "us", "us-1", nil),
		entry("other", "e", true, "kvm2-lab", "eu", "eu-1", map[string]string{"tier": "gold"}),
	)
}

func TestListFilters(t *testing.T) {
	h := newTestServer(t, fixture(), Options{}).Handler()
	for _, tc := range []struct{ query, want string }{
		{"", "crawl/a,crawl/b,other/d,other/e"},
		{"?healthy=true", "crawl/a,crawl/b,other/d,other/e"},
		{"?healthy=any", "crawl/a,crawl/b,crawl/c,other/d,other/e"},
		{"?healthy=false", "crawl/c"},
		{"?namespace=other", "other/d,other/e"},
		{"?provider=kvm2-home", "crawl/a,crawl/b"},
		{"?provider=kvm2-home&healthy=any", "crawl/a,crawl/b,crawl/c"},
		{"?zone=eu-1", "crawl/a,other/e"},
		{"?region=us", "other/d"},
		{"?labelSelector=tier%3Dgold", "crawl/a,other/e"},
		{"?labelSelector=tier+in+(gold,silver),team!=x", "crawl/b,other/e"},
		{"?labelSelector=!tier", "other/d"},
		{"?region=eu&zone=eu-1&namespace=crawl", "crawl/a"},
		{"?namespace=nowhere", ""},
	} {
		res, body := get(t, h, "/v1/proxies"+tc.query)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", tc.query, res.StatusCode, body)
		}
		if ct := res.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: content type %q", tc.query, ct)
		}
		if got := names(decodeList(t, body)); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.query, got, tc.want)
		}
	}
}

func TestListJSONFields(t *testing.T) {
	src := newStaticSource(Entry{Name: "a", Namespace: "ns", URL: "http://192.0.2.7:3128", Mode: "External",
		Provider: "", Region: "r", Zone: "z", Healthy: true, EgressIP: "198.51.100.9", Labels: map[string]string{"k": "v"}})
	_, body := get(t, newTestServer(t, src, Options{}).Handler(), "/v1/proxies")
	var raw struct {
		Proxies []map[string]any `json:"proxies"`
	}
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"name": "a", "namespace": "ns", "url": "http://192.0.2.7:3128", "mode": "External",
		"region": "r", "zone": "z", "healthy": true, "egressIP": "198.51.100.9", "labels": map[string]any{"k": "v"}}
	if got := fmt.Sprint(raw.Proxies); got != fmt.Sprint([]map[string]any{want}) {
		t.Errorf("got %s\nwant %v", got, want)
	}
}

func TestListText(t *testing.T) {
	h := newTestServer(t, fixture(), Options{}).Handler()
	res, body := get(t, h, "/v1/proxies?format=text&namespace=crawl&healthy=any")
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("content type %q", ct)
	}
	lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	if len(lines) != 3 || !strings.HasSuffix(body, "\n") {
		t.Fatalf("want 3 newline-terminated lines, got %q", body)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "http://") || !strings.HasSuffix(l, ":3128") {
			t.Errorf("line %q is not a proxy URL", l)
		}
	}
	// The unfiltered fast path and the filtered path agree.
	_, fast := get(t, h, "/v1/proxies?format=text")
	_, slow := get(t, h, "/v1/proxies?format=text&healthy=true&labelSelector=")
	if fast != slow || strings.Count(fast, "\n") != 4 {
		t.Errorf("fast path %q, filtered path %q", fast, slow)
	}
}

func TestBadParameters(t *testing.T) {
	h := newTestServer(t, fixture(), Options{}).Handler()
	for _, tc := range []struct{ target, param, mention string }{
		{"/v1/proxies?labelSelector=tier%3D%3D%3Dx", "labelSelector", "invalid label selector"},
		{"/v1/proxies?format=xml", "format", "json"},
		{"/v1/proxies?healthy=yes", "healthy", "any"},
		{"/v1/proxies?zones=eu-1", "zones", "unknown parameter"},
		{"/v1/proxies?zone=a&zone=b", "zone", "once"},
		{"/v1/proxies/pick", "key", "missing required parameter key"},
		{"/v1/proxies/pick?key=k&healthy=any", "healthy", "unknown parameter"},
	} {
		res, body := get(t, h, tc.target)
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", tc.target, res.StatusCode)
		}
		var e struct{ Error, Parameter string }
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Fatalf("%s: error body %q is not JSON: %v", tc.target, body, err)
		}
		if e.Parameter != tc.param || !strings.Contains(e.Error, tc.mention) {
			t.Errorf("%s: got %+v, want parameter %q and a message mentioning %q", tc.target, e, tc.param, tc.mention)
		}
	}
	res, _ := get(t, h, "/v2/nothing")
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("unknown path: status %d", res.StatusCode)
	}
}

func TestMethodNotAllowed(t *testing.T) {
	h := newTestServer(t, fixture(), Options{}).Handler()
	rec := newRecorder()
	h.ServeHTTP(rec, newRequest(http.MethodPost, "/v1/proxies"))
	if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: status %d, Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
}

func TestPick(t *testing.T) {
	src := fixture()
	h := newTestServer(t, src, Options{}).Handler()
	seen := map[string]int{}
	for i := 0; i < 200; i++ {
		target := fmt.Sprintf("/v1/proxies/pick?key=session-%d", i)
		res, body := get(t, h, target)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", target, res.StatusCode, body)
		}
		var e Entry
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Fatal(err)
		}
		if !e.Healthy {
			t.Fatalf("%s picked unhealthy %s", target, e.Name)
		}
		_, again := get(t, h, target)
		if again != body {
			t.Fatalf("%s not sticky: %s then %s", target, body, again)
		}
		_, text := get(t, h, target+"&format=text")
		if text != e.URL+"\n" {
			t.Fatalf("%s&format=text = %q, want %q", target, text, e.URL+"\n")
		}
		seen[e.Namespace+"/"+e.Name]++
	}
	if len(seen) != 4 {
		t.Errorf("200 keys spread over %v; want all 4 healthy proxies used", seen)
	}
	// Filters narrow the set the key is hashed over.
	for i := 0; i < 50; i++ {
		_, body := get(t, h, fmt.Sprintf("/v1/proxies/pick?key=s%d&zone=eu-1", i))
		var e Entry
		_ = json.Unmarshal([]byte(body), &e)
		if e.Zone != "eu-1" || !e.Healthy {
			t.Fatalf("zone-filtered pick returned %+v", e)
		}
	}
	// Nothing healthy matches: 503 with a JSON error.
	res, body := get(t, h, "/v1/proxies/pick?key=k&provider=nope")
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"error":"no healthy proxy`) {
		t.Errorf("no match: %d %s", res.StatusCode, body)
	}
	src.set(entry("crawl", "c", false, "p", "", "", nil))
	if res, _ := get(t, h, "/v1/proxies/pick?key=k"); res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("only unhealthy proxies: status %d, want 503", res.StatusCode)
	}
}

func TestWhoami(t *testing.T) {
	h := newTestServer(t, fixture(), Options{}).Handler()
	req := newRequest(http.MethodGet, "/v1/whoami")
	req.RemoteAddr = "203.0.113.5:40000"
	rec := newRecorder()
	h.ServeHTTP(rec, req)
	if rec.Body.String() != `{"ip":"203.0.113.5"}`+"\n" {
		t.Errorf("json: %q", rec.Body.String())
	}
	req = newRequest(http.MethodGet, "/v1/whoami?format=text")
	req.RemoteAddr = "[2001:db8::1]:5"
	rec = newRecorder()
	h.ServeHTTP(rec, req)
	if rec.Body.String() != "2001:db8::1\n" {
		t.Errorf("text: %q", rec.Body.String())
	}
}

// ?distinctEgress=true lists one proxy per egress address, with the other filters and in
// both formats; a proxy without a known address is listed as its own identity.
func TestListDistinctEgress(t *testing.T) {
	withEgress := func(e Entry, ip string) Entry { e.EgressIP = ip; return e }
	src := newStaticSource(
		withEgress(entry("crawl", "a", true, "kvm2-home", "eu", "eu-1", nil), "198.51.100.1"),
		withEgress(entry("crawl", "b", true, "kvm2-home", "eu", "eu-1", nil), "198.51.100.1"),
		withEgress(entry("crawl", "c", true, "kvm2-home", "eu", "eu-2", nil), "198.51.100.2"),
		withEgress(entry("crawl", "d", false, "kvm2-home", "eu", "eu-2", nil), "198.51.100.3"),
		entry("crawl", "e", true, "kvm2-home", "eu", "eu-2", nil),
	)
	h := newTestServer(t, src, Options{}).Handler()
	_, body := get(t, h, "/v1/proxies?distinctEgress=true")
	l := decodeList(t, body)
	got := names(l)
	if l.Count != 3 || (got != "crawl/a,crawl/c,crawl/e" && got != "crawl/b,crawl/c,crawl/e") {
		t.Fatalf("distinctEgress=true: %q (count %d); want one of a and b, then c and e", got, l.Count)
	}
	for i := 0; i < 5; i++ {
		if _, again := get(t, h, "/v1/proxies?distinctEgress=true"); names(decodeList(t, again)) != got {
			t.Fatalf("the choice changed between requests: %q then %q", got, names(decodeList(t, again)))
		}
	}
	if _, b := get(t, h, "/v1/proxies?distinctEgress=true&healthy=any&zone=eu-2"); names(decodeList(t, b)) != "crawl/c,crawl/d,crawl/e" {
		t.Errorf("distinctEgress with zone and healthy=any: %q", names(decodeList(t, b)))
	}
	if _, b := get(t, h, "/v1/proxies?distinctEgress=true&format=text"); strings.Count(b, "\n") != 3 {
		t.Errorf("distinctEgress text: %q, want 3 lines", b)
	}
	if _, b := get(t, h, "/v1/proxies?distinctEgress=false"); names(decodeList(t, b)) != "crawl/a,crawl/b,crawl/c,crawl/e" {
		t.Errorf("distinctEgress=false: %q", names(decodeList(t, b)))
	}
	res, b := get(t, h, "/v1/proxies?distinctEgress=yes")
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(b, `invalid value \"yes\" for distinctEgress`) || !strings.Contains(b, `"parameter":"distinctEgress"`) {
		t.Errorf("distinctEgress=yes: %d %s", res.StatusCode, b)
	}
	if res, b := get(t, h, "/v1/proxies/pick?key=k&distinctEgress=true"); res.StatusCode != http.StatusBadRequest || !strings.Contains(b, "unknown parameter") {
		t.Errorf("pick with distinctEgress: %d %s (pick always spreads over egress addresses)", res.StatusCode, b)
	}
}

// ?ipFamily=6 lists and picks among the proxies with an IPv6 address, each by its IPv6
// URL; 4, the default, by the IPv4 one.
func TestIPFamily(t *testing.T) {
	withV6 := func(e Entry, ip string) Entry { e.urlIPv6 = urlIPv6(ip, 3128); return e }
	src := newStaticSource(
		withV6(entry("crawl", "a", true, "gce-eu", "eu", "eu-1", nil), "2001:db8:1::"),
		entry("crawl", "b", true, "gce-eu", "eu", "eu-1", nil),
		withV6(entry("crawl", "c", false, "gce-eu", "eu", "eu-1", nil), "2001:db8:3::"),
	)
	h := newTestServer(t, src, Options{}).Handler()
	for _, q := range []string{"", "?ipFamily=4"} {
		_, body := get(t, h, "/v1/proxies"+q)
		if l := decodeList(t, body); names(l) != "crawl/a,crawl/b" || !strings.HasPrefix(l.Proxies[0].URL, "http://10.0.") {
			t.Errorf("/v1/proxies%s: %s", q, body)
		}
	}
	_, body := get(t, h, "/v1/proxies?ipFamily=6")
	l := decodeList(t, body)
	if names(l) != "crawl/a" || l.Proxies[0].URL != "http://[2001:db8:1::]:3128" {
		t.Errorf("ipFamily=6: %s", body)
	}
	if _, body := get(t, h, "/v1/proxies?ipFamily=6&healthy=any&format=text"); body != "http://[2001:db8:1::]:3128\nhttp://[2001:db8:3::]:3128\n" {
		t.Errorf("ipFamily=6 text: %q", body)
	}
	if _, body := get(t, h, "/v1/proxies/pick?key=k&ipFamily=6&format=text"); body != "http://[2001:db8:1::]:3128\n" {
		t.Errorf("pick ipFamily=6: %q", body)
	}
	if res, body := get(t, h, "/v1/proxies/pick?key=k&ipFamily=6&zone=eu-2"); res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("pick ipFamily=6 matching none: %d %s", res.StatusCode, body)
	}
	res, b := get(t, h, "/v1/proxies?ipFamily=v6")
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(b, `invalid value \"v6\" for ipFamily: use 4 (the default) or 6`) {
		t.Errorf("ipFamily=v6: %d %s", res.StatusCode, b)
	}
}

// The IPv6 URLs work with the rest of the API: feedback names a proxy by the IPv6 URL it
// was handed, ?domain= leaves out a proxy cooling for the site (its cooldowns are the
// same whichever address it is reached at), and ?distinctEgress=true keeps one proxy per
// egress address.
func TestIPFamilyWithFeedbackDomainAndDistinctEgress(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	v6 := func(e Entry, ip, egress string) Entry {
		e.urlIPv6, e.EgressIP = urlIPv6(ip, 3128), egress
		return e
	}
	src := newStaticSource(
		cool(v6(entry("crawl", "a", true, "gce-eu", "eu", "eu-1", nil), "2001:db8:a::", "198.51.100.1"), "example.com", clk.Now().Add(time.Hour)),
		v6(entry("crawl", "b", true, "gce-eu", "eu", "eu-1", nil), "2001:db8:b::", "198.51.100.2"),
		v6(entry("crawl", "c", true, "gce-eu", "eu", "eu-1", nil), "2001:db8:c::", "198.51.100.2"),
		v6(entry("crawl", "d", true, "gce-eu", "eu", "eu-1", nil), "2001:db8:d::", "198.51.100.3"),
	)
	sk := &sink{}
	h := newTestServer(t, src, Options{Feedback: sk, Clock: clk, MaxCoolingPercent: 50}).Handler()

	res, body := post(t, h, "/v1/feedback", `{"reports":[{"proxy":"http://[2001:DB8:B::]:3128","domain":"example.org","outcome":"banned"}]}`)
	if res.StatusCode != http.StatusOK || !strings.Contains(body, `"accepted":1`) || len(sk.got) != 1 || !strings.HasPrefix(sk.got[0], "crawl/b ") {
		t.Errorf("feedback by IPv6 URL: %d %s, recorded %q", res.StatusCode, body, sk.got)
	}
	if _, body := get(t, h, "/v1/proxies?ipFamily=6&domain=example.com"); names(decodeList(t, body)) != "crawl/b,crawl/c,crawl/d" {
		t.Errorf("ipFamily=6&domain=example.com: %s; want the cooling a left out", body)
	}
	_, body = get(t, h, "/v1/proxies?ipFamily=6&distinctEgress=true")
	l := decodeList(t, body)
	if got := names(l); got != "crawl/a,crawl/b,crawl/d" && got != "crawl/a,crawl/c,crawl/d" {
		t.Errorf("ipFamily=6&distinctEgress=true: %s; want a, one of b and c, d", body)
	}
	for _, p := range l.Proxies {
		if !strings.HasPrefix(p.URL, "http://[2001:db8:") {
			t.Errorf("ipFamily=6 served %s by %s", p.Name, p.URL)
		}
	}
}
