package discovery

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// chooseFixture: ns a holds 6 proxies of pool news on 4 egress addresses (p00 and p01
// share one, p02 and p03 another), ns b holds 2 of its own.
func chooseFixture() []Entry {
	var es []Entry
	egress := []string{"198.51.100.1", "198.51.100.1", "198.51.100.2", "198.51.100.2", "198.51.100.3", "198.51.100.4"}
	for i, ip := range egress {
		es = append(es, Entry{Namespace: "a", Name: fmt.Sprintf("p%02d", i), URL: fmt.Sprintf("http://10.2.0.%d:3128", i),
			Healthy: true, Pool: "news", EgressIP: ip, Provider: "kvm2-home", Region: "home", Zone: fmt.Sprintf("rack%d", i%2),
			Labels: map[string]string{"tier": []string{"gold", "silver", "bronze"}[i%3]}})
	}
	for i := range 2 {
		es = append(es, Entry{Namespace: "b", Name: fmt.Sprintf("q%02d", i), URL: fmt.Sprintf("http://10.3.0.%d:3128", i), Healthy: true})
	}
	return es
}

// Choose with a key answers what GET /v1/proxies/pick answers for the same key, filters
// and exclusions: one code path.
func TestChooseWithAKeyIsPick(t *testing.T) {
	src := newStaticSource(chooseFixture()...)
	s := newTestServer(t, src, Options{})
	for k := range 200 {
		key := fmt.Sprintf("session-%d", k)
		for _, c := range []struct {
			q  string
			ch Choice
		}{
			{"", Choice{AllNamespaces: true}},
			{"&namespace=a&pool=news", Choice{AllNamespaces: true, Namespace: "a", Pool: "news"}},
			{"&exclude=a/p00,a/p02", Choice{AllNamespaces: true, Exclude: []string{"a/p00", "a/p02"}}},
			{"&provider=kvm2-home&region=home&zone=rack1", Choice{AllNamespaces: true, Provider: "kvm2-home", Region: "home", Zone: "rack1"}},
			{"&labelSelector=tier+in+(gold,bronze)", Choice{AllNamespaces: true, LabelSelector: "tier in (gold,bronze)"}},
		} {
			want := pickName(t, s.Handler(), "key="+key+c.q)
			c.ch.Key = key
			got, err := s.Choose(context.Background(), c.ch)
			if err != nil {
				t.Fatalf("Choose(%+v): %v", c.ch, err)
			}
			if id := got.Namespace + "/" + got.Name; id != want {
				t.Fatalf("key %s%s: Choose %s, pick %s", key, c.q, id, want)
			}
			if got.Address != strings.TrimPrefix(got.URL, "http://") {
				t.Fatalf("address %q of url %q", got.Address, got.URL)
			}
		}
	}
}

// Without a key, consecutive rotations leave from distinct egress addresses, in a fixed
// order, every address once per round; two proxies on one address count once.
func TestChooseRotatesOverDistinctEgressAddresses(t *testing.T) {
	s := newTestServer(t, newStaticSource(chooseFixture()...), Options{})
	var round []string
	for n := range uint64(8) {
		got, err := s.Choose(context.Background(), Choice{Namespaces: []string{"a"}, Rotation: n})
		if err != nil {
			t.Fatal(err)
		}
		if n < 4 {
			round = append(round, got.EgressIP)
		} else if got.EgressIP != round[n-4] {
			t.Errorf("rotation %d: %s, want %s as in the first round %v", n, got.EgressIP, round[n-4], round)
		}
	}
	if strings.Join(round, ",") != "198.51.100.1,198.51.100.2,198.51.100.3,198.51.100.4" {
		t.Errorf("one round: %v, want the 4 addresses in order", round)
	}
	// An excluded proxy's address is left out of the round; its twin stands for it.
	seen := map[string]bool{}
	for n := range uint64(4) {
		got, err := s.Choose(context.Background(), Choice{Namespaces: []string{"a"}, Rotation: n, Exclude: []string{"a/p04", "a/p00", "a/p01"}})
		if err != nil {
			t.Fatal(err)
		}
		seen[got.Namespace+"/"+got.Name] = true
	}
	if len(seen) != 2 || seen["a/p04"] || seen["a/p00"] || seen["a/p01"] {
		t.Errorf("rotation with 3 exclusions chose %v, want one proxy of each of the 2 addresses left", seen)
	}
}

// The caller's namespaces bound the choice; a pool no proxy of them belongs to is
// ErrUnknownPool naming it; nothing left is ErrNoProxy.
func TestChooseNamespacesAndPools(t *testing.T) {
	s := newTestServer(t, newStaticSource(chooseFixture()...), Options{})
	ctx := context.Background()
	for k := range 50 {
		got, err := s.Choose(ctx, Choice{Namespaces: []string{"b"}, Key: fmt.Sprint(k)})
		if err != nil || got.Namespace != "b" {
			t.Fatalf("a caller of namespace b got %s/%s, %v", got.Namespace, got.Name, err)
		}
	}
	if _, err := s.Choose(ctx, Choice{Namespaces: []string{"b"}, Namespace: "a", Key: "k"}); !errors.Is(err, ErrNoProxy) || !strings.Contains(err.Error(), `namespace "a"`) {
		t.Errorf("namespace a for a caller of b: %v, want ErrNoProxy naming the namespace", err)
	}
	_, err := s.Choose(ctx, Choice{Namespaces: []string{"b"}, Pool: "news", Key: "k"})
	if !errors.Is(err, ErrUnknownPool) || !strings.Contains(err.Error(), `"news"`) {
		t.Errorf("pool news, only in namespace a, for a caller of b: %v, want ErrUnknownPool naming it", err)
	}
	if _, err := s.Choose(ctx, Choice{AllNamespaces: true, Pool: "sports", Key: "k"}); !errors.Is(err, ErrUnknownPool) || !strings.Contains(err.Error(), `"sports"`) {
		t.Errorf("pool sports: %v, want ErrUnknownPool naming it", err)
	}
	if _, err := s.Choose(ctx, Choice{AllNamespaces: true, Namespace: "b", Key: "k", Exclude: []string{"b/q00", "b/q01"}}); !errors.Is(err, ErrNoProxy) {
		t.Errorf("every proxy excluded: %v, want ErrNoProxy", err)
	}
	for k := range 50 {
		got, err := s.Choose(ctx, Choice{AllNamespaces: true, Zone: "rack0", LabelSelector: "tier!=gold", Key: fmt.Sprint(k)})
		if err != nil || got.Zone != "rack0" || got.Labels["tier"] == "gold" {
			t.Fatalf("zone rack0 and tier!=gold: %s/%s in zone %q, tier %q; %v", got.Namespace, got.Name, got.Zone, got.Labels["tier"], err)
		}
	}
	if _, err := s.Choose(ctx, Choice{AllNamespaces: true, Zone: "rack9", Key: "k"}); !errors.Is(err, ErrNoProxy) {
		t.Errorf("zone rack9: %v, want ErrNoProxy", err)
	}
	if _, err := s.Choose(ctx, Choice{AllNamespaces: true, LabelSelector: "tier===x", Key: "k"}); !errors.Is(err, ErrBadSelector) || !strings.Contains(err.Error(), `"tier===x"`) {
		t.Errorf("a selector that does not parse: %v, want ErrBadSelector naming it", err)
	}
}

// A site's cooling proxies are skipped as pick?domain= skips them (the domain read as a
// site: www.news.example.com is news.example.com's site example.com); a saturated
// site is a *SaturatedError with Retry-After; a host that is no site chooses without one.
func TestChooseSkipsCoolingProxiesAndGuardsSaturation(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(t0)
	es := chooseFixture()
	es[0] = cool(es[0], "example.com", t0.Add(time.Minute))
	src := newStaticSource(es...)
	s := newTestServer(t, src, Options{Clock: clk})
	ctx := context.Background()
	for k := range 100 {
		key := fmt.Sprint(k)
		got, err := s.Choose(ctx, Choice{AllNamespaces: true, Key: key, Domain: "www.example.com"})
		if err != nil {
			t.Fatal(err)
		}
		if want := pickName(t, s.Handler(), "key="+key+"&domain=example.com"); got.Namespace+"/"+got.Name != want {
			t.Fatalf("key %s: Choose %s/%s, pick %s", key, got.Namespace, got.Name, want)
		}
		if got.Name == "p00" {
			t.Fatalf("key %s: chose a/p00, cooling for example.com", key)
		}
	}
	var saw00 bool
	for k := range 100 {
		got, err := s.Choose(ctx, Choice{AllNamespaces: true, Key: fmt.Sprint(k), Domain: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		saw00 = saw00 || got.Name == "p00"
	}
	if !saw00 {
		t.Error("a target that is an IP address skipped a/p00 too; want it chosen as without a site")
	}
	for i := 1; i < 4; i++ {
		es[i] = cool(es[i], "example.com", t0.Add(2*time.Minute))
	}
	src.set(es...)
	_, err := s.Choose(ctx, Choice{Namespaces: []string{"a"}, Key: "k", Domain: "example.com"})
	var sat *SaturatedError
	if !errors.As(err, &sat) || sat.Site != "example.com" || sat.RetryAfter != time.Minute {
		t.Fatalf("4 of 6 cooling: %v, want a SaturatedError for example.com, retry after 1m", err)
	}
}

// A strict choice is the key's own proxy or a StrictSessionError naming it and why.
func TestChooseStrict(t *testing.T) {
	es := chooseFixture()
	s := newTestServer(t, newStaticSource(es...), Options{})
	ctx := context.Background()
	home, err := s.Choose(ctx, Choice{Namespaces: []string{"a"}, Key: "k", Strict: true})
	if err != nil {
		t.Fatal(err)
	}
	id := home.Namespace + "/" + home.Name
	_, err = s.Choose(ctx, Choice{Namespaces: []string{"a"}, Key: "k", Strict: true, Exclude: []string{id}})
	var se *StrictSessionError
	if !errors.As(err, &se) || se.Proxy != id || !strings.Contains(se.Reason, "failed earlier") {
		t.Fatalf("strict with its proxy excluded: %v, want a StrictSessionError naming %s", err, id)
	}
	soft, err := s.Choose(ctx, Choice{Namespaces: []string{"a"}, Key: "k", Exclude: []string{id}})
	if err != nil || soft.Name == home.Name {
		t.Fatalf("soft with its proxy excluded: %s, %v; want another proxy", soft.Name, err)
	}
	for i := range es {
		if es[i].Namespace+"/"+es[i].Name == id {
			es[i].Healthy = false
		}
	}
	s = newTestServer(t, newStaticSource(es...), Options{})
	if _, err = s.Choose(ctx, Choice{Namespaces: []string{"a"}, Key: "k", Strict: true}); !errors.As(err, &se) || se.Proxy != id || !strings.Contains(se.Reason, "not healthy") {
		t.Fatalf("strict with its proxy unhealthy: %v, want a StrictSessionError naming %s", err, id)
	}
}

// Choose hands out the credentials the proxy demands, from the same look-up as
// ?credentials=true; a proxy whose credentials cannot be read is passed over.
func TestChooseCredentials(t *testing.T) {
	es := chooseFixture()[6:] // b/q00, b/q01
	for i := range es {
		es[i].auth = &v1alpha1.Proxy{}
		es[i].auth.Name = es[i].Name
	}
	creds := func(_ context.Context, px *v1alpha1.Proxy) (*proxyconfig.Credentials, error) {
		if px.Name == "q00" {
			return nil, errors.New("secret gone")
		}
		return &proxyconfig.Credentials{Username: "u-" + px.Name, Password: "pw"}, nil
	}
	s := newTestServer(t, newStaticSource(es...), Options{Credentials: creds})
	for k := range 20 {
		got, err := s.Choose(context.Background(), Choice{AllNamespaces: true, Key: fmt.Sprint(k)})
		if err != nil || got.Name != "q01" || got.Username != "u-q01" || got.Password != "pw" || strings.Contains(got.URL, "pw") {
			t.Fatalf("key %d: %+v, %v; want b/q01 with u-q01:pw, the URL without them", k, got, err)
		}
	}
	es = es[:1]
	s = newTestServer(t, newStaticSource(es...), Options{Credentials: creds})
	if _, err := s.Choose(context.Background(), Choice{AllNamespaces: true, Key: "k"}); !errors.Is(err, ErrNoProxy) || !strings.Contains(err.Error(), "secret gone") {
		t.Errorf("the only proxy's credentials unreadable: %v, want ErrNoProxy saying why", err)
	}
}

// AuthenticateToken takes the static token for every namespace and refuses others with
// ErrInvalidToken; a server without authentication checks nothing and says so.
func TestAuthenticateToken(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("good\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newTestServer(t, newStaticSource(chooseFixture()...), Options{TokenFile: tok})
	sc, err := s.AuthenticateToken(context.Background(), "good")
	if err != nil || !sc.AllNamespaces {
		t.Errorf("the static token: %+v, %v; want every namespace", sc, err)
	}
	for _, bad := range []string{"bad", ""} {
		if _, err := s.AuthenticateToken(context.Background(), bad); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("token %q: %v, want ErrInvalidToken", bad, err)
		}
	}
	open := newTestServer(t, newStaticSource(), Options{})
	if _, err := open.AuthenticateToken(context.Background(), "good"); err == nil || errors.Is(err, ErrInvalidToken) || !strings.Contains(err.Error(), "no authentication") {
		t.Errorf("a server without authentication: %v, want an error saying so", err)
	}
}

// Report hands the sink what POST /v1/feedback would: unreachable without a site, a ban
// with the domain's site; a domain that is no site and a draining server take nothing.
func TestReport(t *testing.T) {
	var sk sink
	s := newTestServer(t, newStaticSource(chooseFixture()...), Options{Feedback: &sk})
	px := types.NamespacedName{Namespace: "a", Name: "p00"}
	if err := s.Report(px, "", bans.Unreachable, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Report(px, "www.news.example.com", bans.Throttled, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Report(px, "10.0.0.1", bans.Banned, 0); err == nil {
		t.Error("a ban on an IP address was taken; want an error (not a site)")
	}
	s.Drain()
	if err := s.Report(px, "", bans.Unreachable, 0); err == nil || !strings.Contains(err.Error(), "draining") {
		t.Errorf("a report while draining: %v, want refused", err)
	}
	want := "a/p00  unreachable 0s|a/p00 example.com throttled 30s"
	if got := strings.Join(sk.got, "|"); got != want {
		t.Errorf("the sink took %q, want %q", got, want)
	}
}

// BenchmarkChoose is the cost of one Choose (the gateway's choice) as the exits grow from
// 100 to 10,000, with a session key and by rotation, for a caller of one namespace of
// ten, a site that one exit in seven cools for:
//
//	go test -run '^$' -bench Choose ./internal/discovery/
func BenchmarkChoose(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		t0 := time.Now()
		es := make([]Entry, n)
		for i := range es {
			es[i] = Entry{Namespace: fmt.Sprintf("ns%d", i%10), Name: fmt.Sprintf("p%05d", i),
				URL: fmt.Sprintf("http://10.%d.%d.%d:3128", i>>16, (i>>8)&255, i&255), Healthy: true,
				EgressIP: fmt.Sprintf("203.%d.%d.%d", i>>16, (i>>8)&255, i&255)}
			if i%7 == 3 {
				es[i] = cool(es[i], "example.com", t0.Add(time.Hour))
			}
		}
		s := newTestServer(b, newStaticSource(es...), Options{})
		for _, mode := range []string{"key", "rotation"} {
			b.Run(fmt.Sprintf("%s/%d", mode, n), func(b *testing.B) {
				c := Choice{Namespaces: []string{"ns3", "ns4"}, Domain: "www.example.com"}
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					if mode == "key" {
						c.Key = fmt.Sprint(i)
					} else {
						c.Rotation = uint64(i)
					}
					if _, err := s.Choose(context.Background(), c); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// rotate's walk over egressOrder answers what sorting bestPerEgress's representatives
// answers, for filters, exclusions and a site's cooldowns alike.
func TestRotateIsTheSortedDistinctEgress(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var es []Entry
	for i := range 60 {
		e := Entry{Namespace: fmt.Sprintf("ns%d", i%3), Name: fmt.Sprintf("p%02d", i), URL: fmt.Sprintf("http://10.4.0.%d:3128", i), Healthy: i%11 != 0}
		if i%4 != 0 {
			e.EgressIP = fmt.Sprintf("198.51.100.%d", i%9) // several proxies per address
		}
		if i%5 == 0 {
			e = cool(e, "example.com", t0.Add(time.Minute))
		}
		es = append(es, e)
	}
	snap := NewSnapshot(es)
	for _, f := range []filter{{}, {namespace: "ns1"}, {site: "example.com", now: t0}, {anyHealth: true}} {
		for _, skipEvery := range []int{0, 3, 7} {
			f := f
			if f.site != "" {
				f.cands, f.candsSet = snap.siteCooling(f.site, f.now).cands, true
			}
			skip := map[*item]bool{}
			for i := range snap.items {
				if skipEvery > 0 && i%skipEvery == 0 {
					skip[&snap.items[i]] = true
				}
			}
			var want []*item
			for _, c := range snap.bestPerEgress(&f, skip) {
				want = append(want, c.it)
			}
			slices.SortFunc(want, func(a, b *item) int { return strings.Compare(egressKey(a), egressKey(b)) })
			for n := range uint64(len(want) + 2) {
				if got := snap.rotate(n, &f, skip); got != want[n%uint64(len(want))] {
					t.Fatalf("filter %+v, skip every %d, rotation %d: %s, want %s", f, skipEvery, n, got.Name, want[n%uint64(len(want))].Name)
				}
			}
		}
	}
}
