package bans

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

func TestSite(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"shop.example.com", "example.com"},
		{"a.shop.example.com", "example.com"},
		{"Shop.Example.COM.", "example.com"},
		{"www.example.co.uk", "example.co.uk"},
		{"example.co.uk", "example.co.uk"},
		{"alice.github.io", "alice.github.io"}, // a private suffix: each user is a site
		{"bücher.example", "xn--bcher-kva.example"},
	} {
		got, err := Site(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Site(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "co.uk", "com", "github.io", "localhost", "10.0.0.1", "[::1]", "::1", "a..b.com", "exa mple.com", "http://example.com/"} {
		if got, err := Site(bad); !errors.Is(err, ErrBadDomain) {
			t.Errorf("Site(%q) = %q, %v; want an ErrBadDomain", bad, got, err)
		}
	}
}

func TestParseOutcome(t *testing.T) {
	for _, s := range []string{"banned", "throttled", "ok", "unreachable"} {
		if o, err := ParseOutcome(s); err != nil || string(o) != s {
			t.Errorf("ParseOutcome(%q) = %q, %v", s, o, err)
		}
	}
	if _, err := ParseOutcome("blocked"); !errors.Is(err, ErrBadOutcome) || !strings.Contains(err.Error(), "banned, throttled, ok or unreachable") {
		t.Errorf("ParseOutcome(blocked) = %v, want ErrBadOutcome listing every outcome", err)
	}
}

// state applies reports at a fake clock's times and reads the result back.
type state struct {
	t   *testing.T
	clk *clocktesting.FakeClock
	p   Policy
	cds []v1alpha1.ProxyCooldown
}

func newState(t *testing.T, p Policy) *state {
	return &state{t: t, clk: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)), p: p}
}

func (s *state) report(o Outcome, retry time.Duration) bool {
	var changed bool
	s.cds, changed = CooldownsAfter(s.cds, Report{Site: "example.com", Outcome: o, RetryAfter: retry}, s.clk.Now(), s.p)
	return changed
}

// left is how long the pair still cools (0 when it does not), and its streak.
func (s *state) left() (time.Duration, int32) {
	s.t.Helper()
	until, cooling := CoolingUntil(s.cds, "example.com", s.clk.Now())
	var bans int32
	for _, c := range s.cds {
		if c.Site == "example.com" {
			bans = c.Bans
		}
	}
	if !cooling {
		return 0, bans
	}
	return until.Sub(s.clk.Now()), bans
}

func (s *state) want(left time.Duration, bans int32) {
	s.t.Helper()
	if l, b := s.left(); l != left || b != bans {
		s.t.Fatalf("at %s: cooling %s more with a streak of %d; want %s and %d (entries %+v)", s.clk.Now().Format(time.TimeOnly), l, b, left, bans, s.cds)
	}
}

func TestBanCooldownDoublesUpToTheMax(t *testing.T) {
	s := newState(t, DefaultPolicy)
	wants := []time.Duration{5 * time.Minute, 10 * time.Minute, 20 * time.Minute, 40 * time.Minute, 80 * time.Minute,
		160 * time.Minute, 320 * time.Minute, 640 * time.Minute, 1280 * time.Minute, 24 * time.Hour, 24 * time.Hour}
	for i, w := range wants {
		if !s.report(Banned, 0) {
			t.Fatalf("ban %d changed nothing", i+1)
		}
		s.want(w, int32(i+1))
		// A ban seen by requests in flight while the pair cools is the same ban.
		s.clk.Step(time.Second)
		if s.report(Banned, 0) {
			t.Fatalf("a second report of ban %d while cooling changed the entry: %+v", i+1, s.cds)
		}
		s.want(w-time.Second, int32(i+1))
		s.clk.Step(w - time.Second) // the cooldown ends
		s.want(0, int32(i+1))
	}
}

func TestPolicyFromPool(t *testing.T) {
	s := newState(t, Policy{Cooldown: 10 * time.Second, MaxCooldown: 30 * time.Second})
	for _, w := range []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second, 30 * time.Second} {
		s.report(Banned, 0)
		l, _ := s.left()
		if l != w {
			t.Fatalf("cooldown %s, want %s", l, w)
		}
		s.clk.Step(w)
	}
	if d := (Policy{Cooldown: time.Hour, MaxCooldown: time.Minute}).BanCooldown(3); d != time.Hour {
		t.Errorf("a max below the base: cooldown %s, want the base (1h)", d)
	}
}

func TestOkAfterTheCooldownResetsTheStreak(t *testing.T) {
	s := newState(t, DefaultPolicy)
	s.report(Banned, 0)
	s.clk.Step(time.Minute)
	if s.report(OK, 0) { // a request that started before the ban
		t.Fatalf("ok while cooling changed the entry: %+v", s.cds)
	}
	s.want(4*time.Minute, 1)
	s.clk.Step(4 * time.Minute)
	s.report(Banned, 0)
	s.want(10*time.Minute, 2)
	s.clk.Step(10 * time.Minute)
	if !s.report(OK, 0) {
		t.Fatal("ok after the cooldown changed nothing")
	}
	if len(s.cds) != 0 {
		t.Fatalf("ok after the cooldown left %+v, want the pair forgotten", s.cds)
	}
	s.report(Banned, 0)
	s.want(5*time.Minute, 1)
	if s.report(OK, 0) {
		t.Fatal("ok for a pair never reported changed something")
	}
}

func TestThrottledCoolsWithoutCountingAsABan(t *testing.T) {
	s := newState(t, DefaultPolicy)
	s.report(Throttled, 0)
	s.want(DefaultThrottle, 0)
	s.report(Throttled, 90*time.Second) // a later end wins
	s.want(90*time.Second, 0)
	if s.report(Throttled, 10*time.Second) { // an earlier one does not shorten it
		t.Fatalf("a shorter throttle changed the entry: %+v", s.cds)
	}
	s.want(90*time.Second, 0)
	s.report(Banned, 0) // a ban while throttled starts the streak at 1
	s.want(5*time.Minute, 1)
	s.report(Throttled, time.Hour) // a long throttle keeps the streak
	s.want(time.Hour, 1)
	if s.cds[0].LastOutcome != v1alpha1.CooldownThrottled {
		t.Errorf("last outcome %q, want throttled", s.cds[0].LastOutcome)
	}
	// Fractions of a second round up: a cooldown never ends before the time asked.
	s.clk.Step(time.Hour + 300*time.Millisecond)
	s.report(Throttled, 1500*time.Millisecond)
	until, _ := CoolingUntil(s.cds, "example.com", s.clk.Now())
	if want := s.clk.Now().Add(1500 * time.Millisecond); until.Before(want) || until.Sub(want) >= time.Second || until.Nanosecond() != 0 {
		t.Errorf("until %s for a throttle ending at %s", until, want)
	}
}

func TestExpiry(t *testing.T) {
	s := newState(t, DefaultPolicy)
	s.report(Throttled, 0)
	s.clk.Step(DefaultThrottle)
	if cds, dropped := Prune(s.cds, s.clk.Now(), s.p); !dropped || len(cds) != 0 {
		t.Fatalf("an ended throttle is kept: %+v", cds)
	}
	s.cds = nil
	s.report(Banned, 0)
	// The streak is remembered for the max cooldown after the cooldown ends...
	s.clk.Step(5*time.Minute + 24*time.Hour - time.Second)
	if cds, dropped := Prune(s.cds, s.clk.Now(), s.p); dropped || len(cds) != 1 {
		t.Fatalf("a streak within its memory was dropped: %+v", cds)
	}
	s.clk.Step(time.Second)
	// ...then forgotten: pruned, and a new ban starts the streak anew.
	if cds, dropped := Prune(s.cds, s.clk.Now(), s.p); !dropped || len(cds) != 0 {
		t.Fatalf("a forgotten streak is kept: %+v", cds)
	}
	s.report(Banned, 0)
	s.want(5*time.Minute, 1)
}

func TestPruneKeepsTheLatestHundred(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var cds []v1alpha1.ProxyCooldown
	for i := range MaxEntries + 20 {
		// Site i is throttled for i+1 minutes: sites 0..19 expire soonest.
		cds, _ = CooldownsAfter(cds, Report{Site: fmt.Sprintf("site%03d.com", i), Outcome: Throttled, RetryAfter: time.Duration(i+1) * time.Minute}, clk.Now(), DefaultPolicy)
	}
	out, dropped := Prune(cds, clk.Now(), DefaultPolicy)
	if !dropped || len(out) != MaxEntries {
		t.Fatalf("pruned to %d entries (dropped %v), want %d", len(out), dropped, MaxEntries)
	}
	for i, c := range out {
		if want := fmt.Sprintf("site%03d.com", i+20); c.Site != want {
			t.Fatalf("entry %d is %s, want %s (the 20 soonest-expiring dropped, the rest sorted by site)", i, c.Site, want)
		}
	}
	if len(cds) != MaxEntries+20 {
		t.Errorf("Prune modified its input")
	}
}

// Retirement counts the distinct sites with a ban reported within the window, by the
// time of each site's last ban; throttles do not count, and an entry whose cooldown and
// streak memory ended is kept until its last ban leaves the window.
func TestRetireCountsSitesBannedWithinTheWindow(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// A short max cooldown, so that the streak alone would be forgotten within the window.
	p := Policy{Cooldown: time.Minute, MaxCooldown: 2 * time.Minute, RetireAfterSites: 3, RetireWindow: time.Hour}
	var cds []v1alpha1.ProxyCooldown
	at := func(d time.Duration, site string, o Outcome) {
		t.Helper()
		var changed bool
		if cds, changed = CooldownsAfter(cds, Report{Site: site, Outcome: o}, t0.Add(d), p); !changed {
			t.Fatalf("%s on %s at +%v changed nothing", o, site, d)
		}
	}
	at(0, "a.com", Banned)
	if lb := cds[0].LastBanned; lb == nil || !lb.Time.Equal(t0) {
		t.Fatalf("lastBanned = %v, want %v", lb, t0)
	}
	at(10*time.Minute, "b.com", Banned)
	at(20*time.Minute, "c.com", Throttled)
	if sites, ok := Retire(cds, t0.Add(21*time.Minute), p); ok {
		t.Fatalf("retired after bans on %v and a throttle; want 3 sites banned", sites)
	}
	at(30*time.Minute, "d.com", Banned)
	// Past a.com's cooldown and streak memory (3 min), but its ban is within the hour.
	pruned, _ := Prune(cds, t0.Add(31*time.Minute), p)
	if sites, ok := Retire(pruned, t0.Add(31*time.Minute), p); !ok || fmt.Sprint(sites) != "[a.com b.com d.com]" {
		t.Fatalf("Retire at +31m = %v, %v; want [a.com b.com d.com], true", sites, ok)
	}
	sites, leaves := BannedSites(pruned, t0.Add(31*time.Minute), p)
	if len(sites) != 3 || !leaves.Equal(t0.Add(time.Hour)) {
		t.Fatalf("BannedSites = %v leaving at %v; want 3, the first leaving at %v", sites, leaves, t0.Add(time.Hour))
	}
	// An hour after a.com's ban it has left the window (and the entry is pruned).
	pruned, _ = Prune(cds, t0.Add(time.Hour), p)
	if sites, ok := Retire(pruned, t0.Add(time.Hour), p); ok || len(sites) != 2 {
		t.Fatalf("Retire an hour on = %v, %v; want b.com and d.com, not retired", sites, ok)
	}
	if slices.ContainsFunc(pruned, func(c v1alpha1.ProxyCooldown) bool { return c.Site == "a.com" }) {
		t.Fatalf("a.com kept past its window and streak memory: %+v", pruned)
	}
	// 0 sites turns retirement off.
	off := p
	off.RetireAfterSites = 0
	if _, ok := Retire(cds, t0.Add(31*time.Minute), off); ok {
		t.Fatal("retired with retireAfterSites 0")
	}
	if n := CoolingSites(cds, t0.Add(30*time.Minute)); n != 1 { // d.com alone still cools
		t.Fatalf("CoolingSites at +30m = %d, want 1", n)
	}
	if next := NextEnd(cds, t0.Add(30*time.Minute)); !next.Equal(t0.Add(31 * time.Minute)) {
		t.Fatalf("NextEnd at +30m = %v, want d.com's end %v", next, t0.Add(31*time.Minute))
	}
}

func TestSaturated(t *testing.T) {
	for _, tc := range []struct {
		cooling, matched, pct int
		want                  bool
	}{
		{0, 10, 50, false}, {5, 10, 50, false}, {6, 10, 50, true}, {1, 1, 100, true},
		{1, 10, 0, true}, {0, 0, 0, false}, {9, 10, 100, false}, {10, 10, 100, true},
	} {
		if got := Saturated(tc.cooling, tc.matched, tc.pct); got != tc.want {
			t.Errorf("Saturated(%d of %d, %d%%) = %v, want %v", tc.cooling, tc.matched, tc.pct, got, tc.want)
		}
	}
}
