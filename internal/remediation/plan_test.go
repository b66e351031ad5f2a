package remediation

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var t0 = time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// farm plays the controller: it plans at a time and keeps each decision's record, as
// the controller persists it.
type farm struct {
	t       *testing.T
	proxies []State
	groups  map[string]GroupSpec
}

func (f *farm) plan(now time.Time) Result {
	f.t.Helper()
	res, err := Plan(Input{Now: now, Policy: DefaultPolicy(), Proxies: f.proxies, Groups: f.groups})
	if err != nil {
		f.t.Fatalf("Plan at %s: %v", now.Format(time.TimeOnly), err)
	}
	if len(res.Decisions) != len(f.proxies) {
		f.t.Fatalf("Plan at %s: %d decisions for %d proxies", now.Format(time.TimeOnly), len(res.Decisions), len(f.proxies))
	}
	for i, d := range res.Decisions {
		if d.Key != f.proxies[i].Key {
			f.t.Fatalf("decision %d is for %s, want %s", i, d.Key, f.proxies[i].Key)
		}
		f.proxies[i].Record = d.Record
	}
	return res
}

// step is what one pass should decide for one proxy.
type step struct {
	at      time.Duration // since t0
	change  func(*State)  // what happened to the proxy before the pass
	action  Action
	next    time.Duration // since t0; -1: zero
	attempt int32         // the record's after the pass; 0: none
	cond    string        // the Remediating condition: "True/BootTimeout", ""
	outcome string        // the concluded attempt's outcome, ""
}

func runSteps(t *testing.T, st State, steps []step) []Decision {
	t.Helper()
	f := &farm{t: t, proxies: []State{st}}
	var ds []Decision
	for _, s := range steps {
		if s.change != nil {
			s.change(&f.proxies[0])
		}
		d := f.plan(at(s.at)).Decisions[0]
		ds = append(ds, d)
		next := time.Time{}
		if s.next >= 0 {
			next = at(s.next)
		}
		attempt := int32(0)
		if d.Record != nil {
			attempt = d.Record.Attempt
		}
		cond := ""
		if d.Condition != nil {
			cond = string(d.Condition.Status) + "/" + d.Condition.Reason
		}
		outcome := ""
		if d.Concluded != nil {
			outcome = d.Concluded.Outcome
		}
		if d.Action != s.action || !d.Next.Equal(next) || attempt != s.attempt || cond != s.cond || outcome != s.outcome {
			t.Errorf("at t0+%v: action %q, next %v, attempt %d, condition %q, outcome %q; want %q, %v, %d, %q, %q (%s)",
				s.at, d.Action, d.Next.Sub(t0), attempt, cond, outcome, s.action, s.next, s.attempt, s.cond, s.outcome, d.Message)
		}
	}
	return ds
}

// A guest that never answers: rebooted at the boot timeout, replaced when still silent
// after the first wait (3m), its new instance rebooted once its own boot timeout has
// passed (and the second wait, 6m), then healthy: the record is dropped 10m later, and
// the success is counted with the time from the first instance's start.
func TestBootTimeoutRebootThenReplace(t *testing.T) {
	st := State{Key: "default/a", Group: HostGroup("kvm2", "beelink"), Started: t0, CanReboot: true}
	replaced := func(s *State) { s.Started = at(15 * time.Minute) }
	up := func(s *State) { s.Healthy, s.Answered, s.HealthySince = true, true, at(27*time.Minute) }
	ds := runSteps(t, st, []step{
		{at: time.Minute, next: 10 * time.Minute},
		{at: 9*time.Minute + 59*time.Second, next: 10 * time.Minute},
		{at: 10 * time.Minute, action: ActionReboot, next: 13 * time.Minute, attempt: 1, cond: "True/BootTimeout"},
		{at: 12 * time.Minute, next: 13 * time.Minute, attempt: 1, cond: "True/BootTimeout"},
		{at: 13 * time.Minute, action: ActionReplace, next: 19 * time.Minute, attempt: 2, cond: "True/BootTimeout", outcome: OutcomeFailed},
		{at: 14 * time.Minute, change: func(s *State) { s.Started = time.Time{} }, next: -1, attempt: 2, cond: "True/BootTimeout"},
		// the new instance has its own boot timeout: 15m + 10m
		{at: 19 * time.Minute, change: replaced, next: 25 * time.Minute, attempt: 2, cond: "True/BootTimeout"},
		{at: 25 * time.Minute, action: ActionReboot, next: 37 * time.Minute, attempt: 3, cond: "True/BootTimeout", outcome: OutcomeFailed},
		{at: 28 * time.Minute, change: up, next: 37 * time.Minute, attempt: 3},
		{at: 37 * time.Minute, next: -1, outcome: OutcomeSucceeded},
		{at: 40 * time.Minute, next: -1},
	})
	if c := ds[9].Concluded; c == nil || c.FaultToServing != 27*time.Minute || c.Action != ActionReboot || c.Reason != ReasonBootTimeout {
		t.Errorf("the success concluded %+v, want a Reboot for BootTimeout, 27m from fault to serving", c)
	}
	want := "attempt 2: replaced the instance at 2026-12-04T10:13:00Z, as the proxy never answered a probe after its instance started at 2026-12-04T10:00:00Z (boot timeout); attempt 3 comes no sooner than 2026-12-04T10:19:00Z, and only if it is not healthy by then"
	if got := ds[4].Condition.Message; got != want {
		t.Errorf("the Remediating message of attempt 2:\n got %s\nwant %s", got, want)
	}
	if ds[5].Condition.Message != want || ds[6].Condition.Message != want {
		t.Error("the Remediating message changed while attempt 2 was under way (a status write per pass)")
	}
}

// A provider that cannot reboot: every attempt replaces.
func TestNoRebootReplacesFirst(t *testing.T) {
	st := State{Key: "default/a", Group: HostGroup("fake", ""), Started: t0}
	runSteps(t, st, []step{
		{at: 10 * time.Minute, action: ActionReplace, next: 13 * time.Minute, attempt: 1, cond: "True/BootTimeout"},
		{at: 13 * time.Minute, change: func(s *State) { s.Started = at(12 * time.Minute) }, next: 22 * time.Minute, attempt: 1, cond: "True/BootTimeout"},
		{at: 22 * time.Minute, action: ActionReplace, next: 28 * time.Minute, attempt: 2, cond: "True/BootTimeout", outcome: OutcomeFailed},
	})
}

// A standalone Proxy that was Ready and fails its probes: remediated after the unhealthy
// timeout, its own override taking the place of the policy's.
func TestUnhealthyTimeoutStandalone(t *testing.T) {
	failing := State{Key: "default/a", Group: HostGroup("kvm2", "beelink"), Started: t0, Answered: true,
		FailingSince: at(time.Hour), CanReboot: true}
	ds := runSteps(t, failing, []step{
		{at: time.Hour + 4*time.Minute, next: time.Hour + 5*time.Minute},
		{at: time.Hour + 5*time.Minute, action: ActionReboot, next: time.Hour + 8*time.Minute, attempt: 1, cond: "True/Unhealthy"},
	})
	if r := ds[1].Record; r.FaultSince != at(time.Hour) || r.Reason != ReasonUnhealthy || !strings.Contains(ds[1].Condition.Message, "has failed its probes since 2026-12-04T11:00:00Z (unhealthy timeout)") {
		t.Errorf("record %+v, condition %q", r, ds[1].Condition.Message)
	}
	failing.UnhealthyTimeout = 2 * time.Minute
	runSteps(t, failing, []step{{at: time.Hour + 2*time.Minute, action: ActionReboot, next: time.Hour + 5*time.Minute, attempt: 1, cond: "True/Unhealthy"}})
}

func member(pool string, i int, healthy bool) State {
	s := State{Key: fmt.Sprintf("default/%s-%d", pool, i), Group: PoolGroup("default", pool), Started: t0, Answered: true, CanReboot: true}
	if healthy {
		s.Healthy, s.HealthySince = true, t0
	} else {
		s.FailingSince = at(time.Hour)
	}
	return s
}

// 3 of 5 unhealthy holds every due member of the pool (40% of 5 is 2), with a message
// naming the counts; another pool is not held; at 1 of 5 the remaining one is rebooted.
func TestBrake(t *testing.T) {
	f := &farm{t: t, groups: map[string]GroupSpec{PoolGroup("default", "news"): {MaxUnhealthy: intstr.FromString("40%"), Field: "spec.remediation.maxUnhealthy"}}}
	for i := range 5 {
		f.proxies = append(f.proxies, member("news", i, i >= 3))
	}
	f.proxies = append(f.proxies, member("shop", 0, false))
	res := f.plan(at(time.Hour + 5*time.Minute))
	news := res.Groups[0]
	wantMsg := "3 of 5 unhealthy, more than maxUnhealthy 40% (2): remediation held; it resumes when at most 2 are unhealthy"
	if news.Name != "pool/default/news" || !news.Held || news.Unhealthy != 3 || news.Size != 5 || news.MaxUnhealthy != 2 || news.Message != wantMsg {
		t.Errorf("group news: %+v; want held, 3 of 5, max 2, %q", news, wantMsg)
	}
	for _, d := range res.Decisions[:3] {
		if d.Action != "" || !d.Held || d.Condition == nil || d.Condition.Status != metav1.ConditionFalse ||
			d.Condition.Reason != ReasonTooManyUnhealthy || d.Condition.Message != "group pool/default/news: "+wantMsg ||
			!d.Next.Equal(at(time.Hour+5*time.Minute+HeldRecheck)) {
			t.Errorf("%s: %+v %+v; want held by the brake, looked at again in %v", d.Key, d, d.Condition, HeldRecheck)
		}
	}
	if shop := res.Decisions[5]; shop.Action != ActionReboot || res.Groups[1].Held {
		t.Errorf("the shop pool's proxy: %q (group %+v); want a reboot: 1 of 1 is within the default 40%%", shop.Action, res.Groups[1])
	}
	if !res.Next.Equal(at(time.Hour + 5*time.Minute + HeldRecheck)) {
		t.Errorf("next look %v, want the held recheck", res.Next.Sub(t0))
	}
	// Two recover: 1 of 5 is within the brake, which lets the last one be rebooted.
	for i := range 2 {
		f.proxies[i].Healthy, f.proxies[i].HealthySince, f.proxies[i].FailingSince = true, at(time.Hour+6*time.Minute), time.Time{}
	}
	res = f.plan(at(time.Hour + 7*time.Minute))
	if news := res.Groups[0]; news.Held || news.Unhealthy != 1 || news.Message != "1 of 5 unhealthy, at most maxUnhealthy 40% (2): remediation allowed" {
		t.Errorf("group news after two recovered: %+v", news)
	}
	if d := res.Decisions[2]; d.Action != ActionReboot || d.Held || d.Record.Attempt != 1 {
		t.Errorf("the last unhealthy child after the release: %+v; want rebooted, attempt 1", d)
	}
	// A count brake: 2 of 5 is not more than 2.
	f.groups[PoolGroup("default", "news")] = GroupSpec{MaxUnhealthy: intstr.FromInt32(0)}
	res = f.plan(at(time.Hour + 8*time.Minute))
	if news := res.Groups[0]; !news.Held || news.Message != "1 of 5 unhealthy, more than maxUnhealthy 0: remediation held; it resumes when at most 0 are unhealthy" {
		t.Errorf("group news with maxUnhealthy 0: %+v", news)
	}
}

// A probe target down for ten minutes: every proxy's probes fail meanwhile and none is
// remediated, during the outage or after it (the clocks start again when it answers);
// the held proxies are not counted by the brake.
func TestProbeTargetOutageRemediatesNothing(t *testing.T) {
	f := &farm{t: t}
	for i := range 5 {
		f.proxies = append(f.proxies, member("news", i, true))
	}
	f.proxies = append(f.proxies, State{Key: "default/booting", Group: PoolGroup("default", "news"), Started: at(time.Hour - 9*time.Minute), CanReboot: true})
	down, up := at(time.Hour), at(time.Hour+10*time.Minute)
	for now := down; now.Before(up.Add(10 * time.Minute)); now = now.Add(30 * time.Second) {
		for i := range f.proxies {
			p := &f.proxies[i]
			p.TargetDown = !now.Before(down) && now.Before(up)
			if !now.Before(up) {
				p.TargetUpSince = up
			}
			if i < 5 && now.Before(up.Add(time.Minute)) { // out of rotation until the first probes after the outage
				p.Healthy, p.FailingSince = false, down
			} else if i < 5 {
				p.Healthy, p.HealthySince, p.FailingSince = true, up.Add(time.Minute), time.Time{}
			}
		}
		res := f.plan(now)
		for _, d := range res.Decisions {
			if d.Action != "" {
				t.Fatalf("at t0+%v (target down %v): %s %s: %s", now.Sub(t0), f.proxies[0].TargetDown, d.Action, d.Key, d.Message)
			}
		}
		if f.proxies[0].TargetDown && res.Groups[0].Unhealthy != 0 {
			t.Errorf("at t0+%v the brake counts %d proxies held by the outage", now.Sub(t0), res.Groups[0].Unhealthy)
		}
		if now.Equal(down.Add(5 * time.Minute)) {
			if d := res.Decisions[0]; !d.Held || d.Condition.Reason != ReasonProbeTargetDown {
				t.Errorf("a proxy due during the outage: %+v, want held with reason %s", d, ReasonProbeTargetDown)
			}
		}
	}
	// The booting proxy, never answered, gets its boot timeout from the target's return.
	res := f.plan(up.Add(10 * time.Minute))
	if d := res.Decisions[5]; d.Action != ActionReboot || d.Record.Reason != ReasonBootTimeout {
		t.Errorf("the proxy that never answered, 10m after the target's return: %+v", d)
	}
}

// A proxy that is not remediable counts in its group and is never acted on.
func TestNotRemediable(t *testing.T) {
	ext := State{Key: "default/ext", Group: "none", Started: t0, NotRemediable: "an External proxy"}
	res, err := Plan(Input{Now: at(time.Hour), Proxies: []State{ext}})
	if err != nil || res.Decisions[0].Action != "" || res.Decisions[0].Condition != nil || res.Groups[0].Unhealthy != 1 || !res.Next.IsZero() {
		t.Errorf("an External proxy past its boot timeout: %+v %+v %v", res.Decisions[0], res.Groups[0], err)
	}
}

// A proxy healthy again keeps its record until ResetAfter has passed since the later of
// its recovery and the last attempt, then drops it, concluding the attempt a success.
func TestHealthyAgainResetsRecord(t *testing.T) {
	rec := &Record{Reason: ReasonUnhealthy, Attempt: 2, Action: ActionReplace, At: at(time.Hour), FaultSince: at(50 * time.Minute)}
	st := State{Key: "default/a", Group: "g", Started: at(time.Hour), Healthy: true, HealthySince: at(55 * time.Minute), Answered: true, Record: rec}
	res, _ := Plan(Input{Now: at(time.Hour + 9*time.Minute), Proxies: []State{st}})
	if d := res.Decisions[0]; d.Record != rec || !d.Next.Equal(at(70*time.Minute)) || d.Condition != nil {
		t.Errorf("healthy 9m after the attempt: %+v; want the record kept until t0+70m", d)
	}
	res, _ = Plan(Input{Now: at(70 * time.Minute), Proxies: []State{st}})
	if d := res.Decisions[0]; d.Record != nil || d.Concluded == nil || d.Concluded.FaultToServing != 5*time.Minute {
		t.Errorf("healthy 10m after the attempt: %+v; want the record dropped, 5m from fault to serving", d)
	}
}

// Attempt n waits FirstWait·2^(n-1), at most MaxWait.
func TestWaits(t *testing.T) {
	p := DefaultPolicy()
	var got []time.Duration
	for n := int32(1); n <= 7; n++ {
		got = append(got, p.Wait(n))
	}
	want := []time.Duration{3 * time.Minute, 6 * time.Minute, 12 * time.Minute, 24 * time.Minute, 30 * time.Minute, 30 * time.Minute, 30 * time.Minute}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("waits %v, want %v", got, want)
	}
	if w := (Policy{}).Wait(1000); w != DefaultMaxWait {
		t.Errorf("the zero policy's wait after attempt 1000: %v, want %v", w, DefaultMaxWait)
	}
}

// The decisions and groups do not depend on the order the proxies come in.
func TestPlanOrderIndependent(t *testing.T) {
	var in []State
	for i := range 5 {
		in = append(in, member("news", i, i >= 3))
	}
	in = append(in, member("shop", 0, false), member("shop", 1, true),
		State{Key: "default/boot", Group: HostGroup("kvm2", "nuc"), Started: at(50 * time.Minute)})
	byKey := func(ss []State) (map[string]string, string) {
		res, err := Plan(Input{Now: at(time.Hour + 5*time.Minute), Proxies: ss})
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, d := range res.Decisions {
			m[d.Key] = fmt.Sprintf("%s %v %v %+v %+v", d.Action, d.Next, d.Held, d.Record, d.Condition)
		}
		return m, fmt.Sprintf("%+v %v", res.Groups, res.Next)
	}
	want, wantGroups := byKey(in)
	for i := range 20 {
		shuffled := slices.Clone(in)
		rand.New(rand.NewPCG(uint64(i), 1)).Shuffle(len(shuffled), func(a, b int) { shuffled[a], shuffled[b] = shuffled[b], shuffled[a] })
		got, groups := byKey(shuffled)
		if !maps.Equal(got, want) || groups != wantGroups {
			t.Fatalf("order %d: decisions or groups differ:\n%v %s\nwant\n%v %s", i, got, groups, want, wantGroups)
		}
	}
}

// BenchmarkPlan1000: a pass over 1,000 proxies in 100 pools, a tenth of them failing.
func BenchmarkPlan1000(b *testing.B) {
	var in []State
	for i := range 1000 {
		in = append(in, member(fmt.Sprintf("p%d", i%100), i, i%10 != 0))
	}
	for b.Loop() {
		if _, err := Plan(Input{Now: at(2 * time.Hour), Proxies: in}); err != nil {
			b.Fatal(err)
		}
	}
}
