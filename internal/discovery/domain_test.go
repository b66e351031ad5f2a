package discovery

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// plainProxies is n healthy proxies ns/p00..., each on an address of its own.
func plainProxies(n int) []Entry {
	es := make([]Entry, n)
	for i := range es {
		es[i] = Entry{Namespace: "ns", Name: fmt.Sprintf("p%02d", i), URL: fmt.Sprintf("http://10.1.0.%d:3128", i), Healthy: true}
	}
	return es
}

// picksFor is what h picks for keys 0..n-1 with the query q.
func picksFor(t *testing.T, h http.Handler, n int, q string) []string {
	t.Helper()
	out := make([]string, n)
	for k := range out {
		out[k] = pickName(t, h, fmt.Sprintf("key=%d&%s", k, q))
	}
	return out
}

// A site's candidate list is kept per snapshot until the soonest of its cooldowns ends,
// and not past it: the proxy whose cooldown ended is back in the list and gets back
// exactly the keys it held, while the one still cooling stays out.
func TestDomainCandidatesEndWithTheSoonestCooldown(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	es := plainProxies(10)
	es[1] = cool(es[1], "example.com", t0.Add(time.Minute))
	es[2] = cool(es[2], "example.com", t0.Add(5*time.Minute))
	src := newStaticSource(es...)
	h := newTestServer(t, src, Options{Clock: clk}).Handler()
	snap := src.snap.Load()
	const keys = 500
	plain := picksFor(t, h, keys, "domain=example.org") // a site nothing cools for

	list := func() string {
		t.Helper()
		_, body := get(t, h, "/v1/proxies?domain=shop.example.com")
		return names(decodeList(t, body))
	}
	all := "ns/p00,ns/p01,ns/p02,ns/p03,ns/p04,ns/p05,ns/p06,ns/p07,ns/p08,ns/p09"
	without := func(gone ...string) string {
		var out []string
		for _, n := range strings.Split(all, ",") {
			if !slices.Contains(gone, n) {
				out = append(out, n)
			}
		}
		return strings.Join(out, ",")
	}
	// checkPicks: every key picks what it picks where nothing cools, unless that proxy
	// is one of cooling; those keys pick another.
	checkPicks := func(when string, cooling ...string) {
		t.Helper()
		got := picksFor(t, h, keys, "domain=example.com")
		for k := range got {
			switch was := plain[k]; {
			case slices.Contains(cooling, was) && got[k] == was:
				t.Fatalf("%s: key %d picks %s, which cools", when, k, was)
			case !slices.Contains(cooling, was) && got[k] != was:
				t.Fatalf("%s: key %d picks %s, but %s, which does not cool, held it", when, k, got[k], was)
			}
		}
	}

	if got := list(); got != without("ns/p01", "ns/p02") {
		t.Fatalf("at the start: %s", got)
	}
	checkPicks("at the start", "ns/p01", "ns/p02")
	first := snap.siteCooling("example.com", clk.Now())
	if len(first.cands) != 8 || !first.validUntil.Equal(t0.Add(time.Minute)) {
		t.Fatalf("the site's candidates: %d, valid until %v; want 8 until %v", len(first.cands), first.validUntil, t0.Add(time.Minute))
	}

	clk.Step(time.Minute - time.Nanosecond)
	if sc := snap.siteCooling("example.com", clk.Now()); sc != first {
		t.Error("the candidate list was worked out again before any cooldown ended")
	}
	if got := list(); got != without("ns/p01", "ns/p02") {
		t.Errorf("just before the first cooldown ends: %s", got)
	}

	clk.Step(time.Nanosecond) // p01's cooldown ends
	if got := list(); got != without("ns/p02") {
		t.Errorf("after p01's cooldown ended: %s", got)
	}
	checkPicks("after p01's cooldown ended", "ns/p02")
	second := snap.siteCooling("example.com", clk.Now())
	if second == first || len(second.cands) != 9 || !second.validUntil.Equal(t0.Add(5*time.Minute)) {
		t.Errorf("after p01's cooldown ended the candidates are %d, valid until %v; want 9 new ones until %v",
			len(second.cands), second.validUntil, t0.Add(5*time.Minute))
	}

	// A clock set back to before the list was worked out gets the answer for its time,
	// not the kept one.
	clk.SetTime(t0.Add(30 * time.Second))
	if got := list(); got != without("ns/p01", "ns/p02") {
		t.Errorf("with the clock set back: %s", got)
	}
	checkPicks("with the clock set back", "ns/p01", "ns/p02")

	clk.SetTime(t0.Add(5 * time.Minute)) // p02's ends too
	if got := list(); got != all {
		t.Errorf("after every cooldown ended: %s", got)
	}
	checkPicks("after every cooldown ended")
	last := snap.siteCooling("example.com", clk.Now())
	if len(last.cands) != 10 || !last.validUntil.IsZero() {
		t.Errorf("with nothing cooling: %d candidates, valid until %v; want all 10 for good", len(last.cands), last.validUntil)
	}
	// A site no proxy has a cooldown for costs no list of its own.
	if sc := snap.siteCooling("example.org", clk.Now()); sc != snap.noneCooling || len(sc.cands) != 10 {
		t.Errorf("a site without cooldowns: %p with %d candidates, want the snapshot's shared answer", sc, len(sc.cands))
	}
}

// A new ban comes as a new snapshot: the lists kept for the old one are not used, and
// the newly banned proxy is left out at once, moving only the keys it held.
func TestDomainCandidatesFollowANewBan(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	es := plainProxies(12)
	es[3] = cool(es[3], "example.com", t0.Add(time.Hour))
	src := newStaticSource(es...)
	h := newTestServer(t, src, Options{Clock: clk}).Handler()
	const keys = 600
	before := picksFor(t, h, keys, "domain=example.com") // keeps the site's list
	old := src.snap.Load()
	kept := old.siteCooling("example.com", clk.Now())
	if len(kept.cands) != 11 {
		t.Fatalf("%d candidates kept, want 11", len(kept.cands))
	}

	victim := before[0]
	for i := range es {
		if es[i].Namespace+"/"+es[i].Name == victim {
			es[i] = cool(es[i], "example.com", t0.Add(10*time.Minute))
		}
	}
	src.set(es...) // what the informer's event for the status write brings
	after := picksFor(t, h, keys, "domain=example.com")
	moved := 0
	for k := range after {
		switch {
		case after[k] == victim || after[k] == "ns/p03":
			t.Fatalf("key %d picks %s, which cools", k, after[k])
		case before[k] == victim:
			moved++
		case after[k] != before[k]:
			t.Fatalf("key %d moved from %s to %s, though neither is newly banned", k, before[k], after[k])
		}
	}
	if moved == 0 {
		t.Fatal("no key moved off the newly banned proxy")
	}
	_, body := get(t, h, "/v1/proxies?domain=example.com")
	if got := names(decodeList(t, body)); strings.Contains(got, victim) || strings.Contains(got, "ns/p03") || strings.Count(got, ",") != 9 {
		t.Errorf("listed %s; want the 10 proxies other than ns/p03 and %s", got, victim)
	}
	if sc := src.snap.Load().siteCooling("example.com", clk.Now()); len(sc.cands) != 10 || !sc.validUntil.Equal(t0.Add(10*time.Minute)) {
		t.Errorf("the new snapshot keeps %d candidates until %v; want 10 until %v", len(sc.cands), sc.validUntil, t0.Add(10*time.Minute))
	}
	if sc := old.siteCooling("example.com", clk.Now()); sc != kept {
		t.Error("the old snapshot's list changed")
	}
}

// The same through the manager's cache: a site's list is in use when a second proxy is
// banned for it (its status gains the cooldown), and the next answers leave both out.
func TestDomainCandidatesFollowANewBanInTheCache(t *testing.T) {
	ctx := testContext(t)
	ns := newNamespace(t, ctx)
	var specs []proxySpec
	for i := range 6 {
		specs = append(specs, proxySpec{name: fmt.Sprintf("p%d", i), ip: fmt.Sprintf("192.0.2.%d", 20+i), zone: "a", phase: v1alpha1.PhaseReady, healthy: true})
	}
	createProxies(t, ctx, ns, specs)
	h := newTestServer(t, cacheSource(t, ctx, ns), Options{}).Handler()
	ban := func(name string) {
		t.Helper()
		px := &v1alpha1.Proxy{}
		if err := shared.Client(t).Get(ctx, keyOf(ns, name), px); err != nil {
			t.Fatal(err)
		}
		px.Status.Cooldowns = append(px.Status.Cooldowns, v1alpha1.ProxyCooldown{Site: "example.com",
			Until: metav1.NewTime(time.Now().Add(time.Hour)), Bans: 1, LastOutcome: v1alpha1.CooldownBanned})
		if err := shared.Client(t).Status().Update(ctx, px); err != nil {
			t.Fatal(err)
		}
	}
	q := "/v1/proxies?namespace=" + ns + "&domain=www.example.com&format=text"
	lists := func(want int, out ...string) func() (bool, error) {
		return func() (bool, error) {
			_, body := get(t, h, q)
			ok := strings.Count(body, "\n") == want
			for _, o := range out {
				ok = ok && !strings.Contains(body, o+"\n")
			}
			return ok, fmt.Errorf("listed %q", body)
		}
	}
	testutil.WaitFor(t, waitLong, "the 6 proxies listed", lists(6))
	ban("p1")
	testutil.WaitFor(t, waitLong, "p1 left out", lists(5, "http://192.0.2.21:3128"))
	for range 20 { // requests answered from the kept list
		if ok, err := lists(5, "http://192.0.2.21:3128")(); !ok {
			t.Fatal(err)
		}
	}
	ban("p4")
	testutil.WaitFor(t, waitLong, "p1 and p4 left out", lists(4, "http://192.0.2.21:3128", "http://192.0.2.24:3128"))
}

// domainCase is one request of TestDomainPicksEqualTheSlowWay.
type domainCase struct {
	namespace, zone, pool, selector, domain string
	ipv6, credentials                       bool
}

func (c domainCase) query() string {
	v := url.Values{}
	for k, s := range map[string]string{"namespace": c.namespace, "zone": c.zone, "pool": c.pool, "labelSelector": c.selector, "domain": c.domain} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if c.ipv6 {
		v.Set("ipFamily", "6")
	}
	if c.credentials {
		v.Set("credentials", "true")
	}
	return v.Encode()
}

// slowWay answers a domainCase from the entries alone, the long way round: every entry
// checked against every filter and its cooldowns read at now, the saturation guard
// counted, then the two rounds of rendezvous hashing done as the documentation words them.
type slowWay struct {
	entries []Entry // sorted by namespace and name
	secrets map[string]*proxyconfig.Credentials
	pools   map[types.NamespacedName]*v1alpha1.PoolBans
	pct     int
}

// cooling reports whether e cools for site at now.
func cooling(e Entry, site string, now time.Time) (time.Time, bool) {
	for _, c := range e.cooldowns {
		if c.Site == site && c.Until.Time.After(now) {
			return c.Until.Time, true
		}
	}
	return time.Time{}, false
}

// candidates is the entries the request may be handed, or saturated with the seconds
// of Retry-After.
func (sw *slowWay) candidates(t *testing.T, c domainCase, site string, healthyOnly bool, now time.Time) (out []Entry, saturated bool, retry int) {
	sel := labels.Everything()
	if c.selector != "" {
		var err error
		if sel, err = labels.Parse(c.selector); err != nil {
			t.Fatal(err)
		}
	}
	matched, cool := 0, 0
	var soonest time.Time
	firstNS := ""
	for _, e := range sw.entries {
		if (healthyOnly && !e.Healthy) || (c.ipv6 && e.urlIPv6 == "") || (c.namespace != "" && e.Namespace != c.namespace) ||
			(c.zone != "" && e.Zone != c.zone) || (c.pool != "" && e.Pool != c.pool) || !sel.Matches(labels.Set(e.Labels)) {
			continue
		}
		if firstNS == "" {
			firstNS = e.Namespace
		}
		matched++
		if until, ok := cooling(e, site, now); ok {
			cool++
			if soonest.IsZero() || until.Before(soonest) {
				soonest = until
			}
			continue
		}
		if c.ipv6 {
			e.URL = e.urlIPv6
		}
		out = append(out, e)
	}
	pct := sw.pct
	if c.pool != "" {
		ns := c.namespace
		if ns == "" {
			ns = firstNS
		}
		if b := sw.pools[types.NamespacedName{Namespace: ns, Name: c.pool}]; b != nil && b.MaxCoolingPercent != nil {
			pct = int(*b.MaxCoolingPercent)
		}
	}
	if cool > 0 && (cool*100 > pct*matched || cool == matched) {
		secs := soonest.Sub(now).Seconds()
		retry = int(secs)
		if float64(retry) < secs {
			retry++
		}
		return nil, true, max(retry, 1)
	}
	return out, false, 0
}

// withCreds is e's URL with its credentials, or ok false when they cannot be read.
func (sw *slowWay) withCreds(e Entry) (string, bool) {
	if e.auth == nil {
		return e.URL, true
	}
	cr := sw.secrets[e.Namespace+"/"+string(e.auth.Spec.Proxy.BasicAuth.SecretRef.Name)]
	if cr == nil {
		return "", false
	}
	u, _ := url.Parse(e.URL)
	u.User = url.UserPassword(cr.Username, cr.Password)
	return u.String(), true
}

// pick is the URL the key picks among the candidates, "" for none: the egress address
// (a proxy's own namespace/name when its address is unknown) with the highest score for
// the key, then among its proxies the one with the highest score, the earlier on a tie.
func (sw *slowWay) pick(key string, cands []Entry, creds bool) string {
	var usable []Entry
	for _, e := range cands {
		if creds {
			u, ok := sw.withCreds(e)
			if !ok {
				continue
			}
			e.URL = u
		}
		usable = append(usable, e)
	}
	identity := func(e Entry) string {
		if e.EgressIP != "" {
			return e.EgressIP
		}
		return e.Namespace + "/" + e.Name
	}
	k := hashString(key)
	var bestID string
	var bestIDScore uint64
	for _, e := range usable {
		if sc := score(k, nodeSeed(identity(e))); bestID == "" || sc > bestIDScore {
			bestID, bestIDScore = identity(e), sc
		}
	}
	var best string
	var bestScore uint64
	for _, e := range usable {
		if identity(e) != bestID {
			continue
		}
		if sc := score(k, nodeSeed(e.Namespace+"/"+e.Name)); best == "" || sc > bestScore {
			best, bestScore = e.URL, sc
		}
	}
	return best
}

// distinct is the candidates ?distinctEgress=true keeps: per egress address, the proxy
// with the highest score for the address; in order.
func distinct(cands []Entry) []Entry {
	best := map[string]Entry{}
	for _, e := range cands {
		id := e.EgressIP
		if id == "" {
			id = e.Namespace + "/" + e.Name
		}
		if b, ok := best[id]; !ok || score(nodeSeed(id), nodeSeed(e.Namespace+"/"+e.Name)) > score(nodeSeed(id), nodeSeed(b.Namespace+"/"+b.Name)) {
			best[id] = e
		}
	}
	var out []Entry
	for _, e := range cands {
		id := e.EgressIP
		if id == "" {
			id = e.Namespace + "/" + e.Name
		}
		if best[id].Name == e.Name && best[id].Namespace == e.Namespace {
			out = append(out, e)
		}
	}
	return out
}

func urls(es []Entry) string {
	var b strings.Builder
	for _, e := range es {
		b.WriteString(e.URL + "\n")
	}
	return b.String()
}

// Domain picks (and lists) are what the slow way gives: over 240 proxies with shared
// and unknown egress addresses, unhealthy ones, IPv6 addresses, credentials (some
// unreadable), pools and cooldowns for several sites ending at different times, for many
// keys and filters, while the clock passes cooldown ends (and once goes back).
func TestDomainPicksEqualTheSlowWay(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	var es []Entry
	for i := range 240 {
		e := Entry{Namespace: []string{"crawl", "news", "shop"}[i%3], Name: fmt.Sprintf("px-%03d", i),
			URL: fmt.Sprintf("http://10.2.%d.%d:3128", i/200, i%200+1), Mode: "Managed", Provider: "kvm2-home",
			Zone: fmt.Sprintf("z%d", i%4), Healthy: i%13 != 0, Labels: map[string]string{"tier": []string{"gold", "silver"}[i%2]}}
		if i%7 != 0 { // every seventh has no known egress address; the others share 40
			e.EgressIP = fmt.Sprintf("198.51.100.%d", i%40)
		}
		if i%5 < 3 {
			e.Pool = "pool-a"
		}
		if i%3 == 0 {
			e.urlIPv6 = urlIPv6(fmt.Sprintf("2001:db8::%x", i+1), 3128)
		}
		if i%4 == 0 {
			secret := "auth-ok"
			if i%24 == 0 {
				secret = "auth-missing"
			}
			e.auth = authFor(e, secret)
		}
		if i%6 == 1 { // example.com: ends from 0 to 9 minutes in
			e = cool(e, "example.com", t0.Add(time.Duration(i%5)*time.Minute+time.Duration(i)*time.Second))
		}
		if i%11 == 2 {
			e = cool(e, "example.org", t0.Add(time.Duration(i)*7*time.Second))
		}
		if i%17 == 3 { // every cooldown for example.net is over
			e = cool(e, "example.net", t0.Add(-time.Second))
		}
		es = append(es, e)
	}
	secrets := map[string]*proxyconfig.Credentials{}
	for _, ns := range []string{"crawl", "news", "shop"} {
		secrets[ns+"/auth-ok"] = &proxyconfig.Credentials{Username: "u-" + ns, Password: "p@ss/" + ns}
	}
	pools := map[types.NamespacedName]*v1alpha1.PoolBans{{Namespace: "crawl", Name: "pool-a"}: {MaxCoolingPercent: ptr.To[int32](10)}}
	src := newStaticSource(es...)
	sw := &slowWay{entries: src.snap.Load().items2entries(), secrets: secrets, pools: pools, pct: 50}
	h := tokenServerOpts(t, src, Options{Clock: clk, Credentials: secretLookup(secrets), MaxCoolingPercent: 50,
		PoolBans: func(_ context.Context, k types.NamespacedName) *v1alpha1.PoolBans { return pools[k] }})

	cases := []domainCase{
		{domain: "shop.example.com"},
		{domain: "example.org"},
		{domain: "www.example.net"},
		{domain: "example.info"}, // nothing has a cooldown for it
		{domain: "example.com", zone: "z1"},
		{domain: "example.com", namespace: "news", selector: "tier=gold"},
		{domain: "example.com", pool: "pool-a"},
		{domain: "example.com", pool: "pool-a", namespace: "crawl"},
		{domain: "example.org", ipv6: true},
		{domain: "example.com", credentials: true},
		{domain: "example.com", credentials: true, ipv6: true, zone: "z0"},
		{},
		{zone: "z2", selector: "tier!=gold"},
	}
	const keys = 300
	var compared, saturated int
	for _, at := range []time.Duration{0, 90 * time.Second, 3*time.Minute + 10*time.Second, time.Minute, 30 * time.Minute} {
		clk.SetTime(t0.Add(at))
		now := clk.Now()
		for _, c := range cases {
			q := c.query()
			site := ""
			if c.domain != "" {
				var err error
				if site, err = siteOf(c.domain); err != nil {
					t.Fatal(err)
				}
			}
			cands, sat, retry := sw.candidates(t, c, site, true, now)
			for k := -1; k < keys; k++ {
				target := "/v1/proxies/pick?format=text&" + q
				key := site
				if k >= 0 || site == "" {
					key = fmt.Sprintf("session-%d", k)
					target += "&key=" + key
				}
				res, body := get(t, h, target, "Authorization", bearer)
				want := sw.pick(key, cands, c.credentials)
				switch {
				case sat:
					if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") != fmt.Sprint(retry) {
						t.Fatalf("at +%v %s: %d Retry-After %q %s; the slow way says saturated, retry in %ds", at, target, res.StatusCode, res.Header.Get("Retry-After"), body, retry)
					}
					saturated++
				case want == "":
					if res.StatusCode != http.StatusServiceUnavailable {
						t.Fatalf("at +%v %s: %d %s; the slow way finds no proxy", at, target, res.StatusCode, body)
					}
				default:
					if res.StatusCode != http.StatusOK || body != want+"\n" {
						t.Fatalf("at +%v %s: %d %q; the slow way picks %s", at, target, res.StatusCode, body, want)
					}
				}
				compared++
				if sat {
					break
				}
			}
			if sat || c.credentials {
				continue
			}
			// The lists, all of them and one per egress address.
			_, body := get(t, h, "/v1/proxies?format=text&"+q, "Authorization", bearer)
			if body != urls(cands) {
				t.Fatalf("at +%v list?%s:\n%s\nthe slow way lists:\n%s", at, q, body, urls(cands))
			}
			_, body = get(t, h, "/v1/proxies?format=text&distinctEgress=true&"+q, "Authorization", bearer)
			if want := urls(distinct(cands)); body != want {
				t.Fatalf("at +%v list?distinctEgress=true&%s:\n%s\nthe slow way lists:\n%s", at, q, body, want)
			}
			// healthy=any: the unhealthy ones count too.
			all, sat, _ := sw.candidates(t, c, site, false, now)
			if !sat {
				_, body = get(t, h, "/v1/proxies?format=text&healthy=any&"+q, "Authorization", bearer)
				if body != urls(all) {
					t.Fatalf("at +%v list?healthy=any&%s:\n%s\nthe slow way lists:\n%s", at, q, body, urls(all))
				}
			}
		}
	}
	if saturated == 0 || compared < 10*keys {
		t.Fatalf("compared %d answers, %d of them saturated; the fixture should give both", compared, saturated)
	}
	t.Logf("compared %d picks with the slow way, %d of them saturated", compared, saturated)
}

// items2entries is the snapshot's entries, in its order.
func (s *Snapshot) items2entries() []Entry {
	out := make([]Entry, len(s.items))
	for i := range s.items {
		out[i] = s.items[i].Entry
	}
	return out
}

// Requests for sites share the kept lists while the snapshot changes under them and
// cooldowns end (run it with -race): every answer is a proxy of the fixture, and once the
// changes stop, the answers are those of a new snapshot of the same proxies.
func TestDomainCandidatesConcurrently(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	es := plainProxies(40)
	for i := range es {
		if i%8 == 0 {
			es[i] = cool(es[i], "example.com", t0.Add(time.Duration(i)*time.Second))
		}
		if i%9 == 0 {
			es[i] = cool(es[i], "example.org", t0.Add(time.Duration(i)*2*time.Second))
		}
	}
	src := newStaticSource(es...)
	h := newTestServer(t, src, Options{Clock: clk}).Handler()
	done := make(chan struct{})
	errs := make(chan error, 8)
	for w := range 8 {
		go func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					errs <- nil
					return
				default:
				}
				site := []string{"example.com", "example.org", "example.net"}[(w+i)%3]
				target := fmt.Sprintf("/v1/proxies/pick?format=text&key=%d&domain=%s", i, site)
				if i%5 == 0 {
					target = "/v1/proxies?format=text&domain=" + site
				}
				rec := newRecorder()
				h.ServeHTTP(rec, newRequest(http.MethodGet, target))
				if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Body.String(), "http://10.1.0.") {
					errs <- fmt.Errorf("%s: %d %q", target, rec.Code, rec.Body.String())
					<-done
					return
				}
			}
		}()
	}
	for step := range 40 {
		clk.Step(time.Second)
		if step%10 == 0 { // a new ban: a new snapshot
			es[step+1] = cool(es[step+1], "example.com", clk.Now().Add(time.Minute))
			src.set(es...)
		}
		time.Sleep(2 * time.Millisecond)
	}
	close(done)
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// The same entries in a snapshot of their own, with no list kept yet.
	fresh := newTestServer(t, newStaticSource(es...), Options{Clock: clk}).Handler()
	for k := range 200 {
		for _, site := range []string{"example.com", "example.org"} {
			q := fmt.Sprintf("/v1/proxies/pick?format=text&key=%d&domain=%s", k, site)
			if _, got := get(t, h, q); got != func() string { _, b := get(t, fresh, q); return b }() {
				t.Fatalf("%s: %q from the server that served the changes, another from a fresh one", q, got)
			}
		}
	}
}
