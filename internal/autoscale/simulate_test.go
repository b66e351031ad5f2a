package autoscale

import (
	"math"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// A pool driven by Decide over simulated minutes: a pass every 15 s, children available
// 90 s after they are made, the demand measured by two gateway replicas 10 s before each
// pass.

const (
	simPass = 15 * time.Second
	simBoot = 90 * time.Second
)

// load is the demand at a time: sessions, and requests held waiting for a child.
type load struct {
	sessions float64
	held     int32
}

// crawl: idle, a first held request at 2m, a ramp to 200 sessions by 12m, steady (195
// and 205 in turn) until 40m, down to 20 by 45m, 20 until 60m, idle until 80m, then a
// held request again.
func crawl(d time.Duration, pass int) load {
	m := d.Minutes()
	switch {
	case m < 2:
		return load{}
	case m < 2.25:
		return load{held: 1}
	case m < 12:
		return load{sessions: math.Round(200 * (m - 2) / 10)}
	case m < 40:
		if pass%2 == 0 {
			return load{sessions: 195}
		}
		return load{sessions: 205}
	case m < 45:
		return load{sessions: math.Round(200 - 180*(m-40)/5)}
	case m < 60:
		return load{sessions: 20}
	case m < 80:
		return load{}
	default:
		return load{held: 1}
	}
}

// pass is one pass of the simulation.
type pass struct {
	at                  time.Duration
	demand              load
	before, available   int32
	after, wanted, need int32
	reason              string
}

type sim struct {
	spec     Input // the pool's autoscaling spec; Now, Replicas, Available, Demand and State are set per pass
	children []time.Time
	state    State
	passes   []pass
}

func (s *sim) run(t *testing.T, until time.Duration) {
	t.Helper()
	for i := 0; time.Duration(i)*simPass <= until; i++ {
		el := time.Duration(i) * simPass
		now := at(el)
		ld := crawl(el, i)
		in := s.spec
		in.Now = now
		in.Replicas = int32(len(s.children))
		for _, c := range s.children {
			if now.Sub(c) >= simBoot {
				in.Available++
			}
		}
		// Two gateway replicas, each seeing half of the demand; the held request at one.
		in.Demand = []Sample{
			{Source: "gw-a", At: now.Add(-10 * time.Second), Sessions: ld.sessions / 2, Held: ld.held},
			{Source: "gw-b", At: now.Add(-10 * time.Second), Sessions: ld.sessions / 2},
		}
		in.State = s.state
		d := Decide(in)
		if !d.Decided {
			t.Fatalf("at %s: not decided: %s", el, d.Message)
		}
		s.state = d.State
		need := in.need(d.Demand)
		s.passes = append(s.passes, pass{at: el, demand: ld, before: in.Replicas, available: in.Available,
			after: d.Replicas, wanted: d.Wanted, need: need, reason: d.Reason})
		s.check(t, in, d)
		// The pool follows: new children now, the newest ones go first.
		for int32(len(s.children)) < d.Replicas {
			s.children = append(s.children, now)
		}
		s.children = s.children[:d.Replicas]
	}
}

// check asserts the rules on the pass just made.
func (s *sim) check(t *testing.T, in Input, d Decision) {
	t.Helper()
	p := s.passes[len(s.passes)-1]
	capN, _ := in.capacity()
	delay := in.delay()
	if p.after > capN || p.after > in.MaxReplicas {
		t.Errorf("at %s: %d replicas, above the cap %d (max %d)", p.at, p.after, capN, in.MaxReplicas)
	}
	if p.after < in.MinReplicas {
		t.Errorf("at %s: %d replicas, below minReplicas %d", p.at, p.after, in.MinReplicas)
	}
	if p.before == 0 && (p.demand.held > 0 || p.demand.sessions > 0) && p.after < 1 {
		t.Errorf("at %s: demand at zero, and still %d replicas", p.at, p.after)
	}
	switch {
	case p.after > p.before:
		if limit := max(p.before, p.available+in.step(), in.MinReplicas); p.after > limit {
			t.Errorf("at %s: up from %d to %d, more than the step allows (%d available, step %d)", p.at, p.before, p.after, p.available, in.step())
		}
	case p.after < p.before:
		// The delay: the last change at least a delay ago, and the pool wanted fewer for
		// the whole delay.
		for _, q := range s.passes[:len(s.passes)-1] {
			if p.at-q.at < delay && q.after != q.before {
				t.Errorf("at %s: down from %d to %d, %s after the change at %s", p.at, p.before, p.after, p.at-q.at, q.at)
			}
			if p.at-q.at <= delay && q.wanted >= p.before {
				t.Errorf("at %s: down from %d, but %d was wanted at %s", p.at, p.before, q.wanted, q.at)
			}
			if p.at-q.at <= delay && q.wanted > p.after && q.at >= p.at-delay {
				// Down to the most wanted within the delay at least.
				t.Errorf("at %s: down to %d, below the %d wanted at %s", p.at, p.after, q.wanted, q.at)
			}
		}
		// Never below the warm spare while there is demand.
		if p.need > 0 && p.after < min(p.need+in.WarmSpare, capN) {
			t.Errorf("at %s: down to %d, below %d needed + warm spare %d", p.at, p.after, p.need, in.WarmSpare)
		}
	}
}

// changes counts the changes between from and to.
func (s *sim) changes(from, to time.Duration) int {
	n := 0
	for _, p := range s.passes {
		if p.at >= from && p.at < to && p.after != p.before {
			n++
		}
	}
	return n
}

// downs counts the scale-downs between from and to.
func (s *sim) downs(from, to time.Duration) int {
	n := 0
	for _, p := range s.passes {
		if p.at >= from && p.at < to && p.after < p.before {
			n++
		}
	}
	return n
}

func (s *sim) at(d time.Duration) pass {
	return s.passes[int(d/simPass)]
}

func crawlSpec() Input {
	return Input{MinReplicas: 0, MaxReplicas: 30, Target: Target{Sessions: 10}, WarmSpare: 2}
}

func TestSimulatedCrawl(t *testing.T) {
	s := &sim{spec: crawlSpec()}
	s.run(t, 85*time.Minute)
	if t.Failed() {
		return
	}
	for _, p := range s.passes {
		if p.after != p.before {
			t.Logf("%8s %5g+%d sessions: %2d -> %2d (%d available, wants %d) %s", p.at, p.demand.sessions, p.demand.held, p.before, p.after, p.available, p.wanted, p.reason)
		}
	}
	// From zero: the held request at 2m gives a child at once.
	if p := s.at(2 * time.Minute); p.before != 0 || p.after != 1 || p.reason != ReasonScaledUp {
		t.Errorf("at 2m: %+v, want up from 0 to 1", p)
	}
	// The ramp: the pool reaches 23 (205 sessions: 21 + 2 spare) in bounded steps, at
	// least two of them.
	ups := 0
	for _, p := range s.passes {
		if p.at < 20*time.Minute && p.after > p.before {
			ups++
		}
	}
	if ups < 3 {
		t.Errorf("%d scale-ups by 20m, want the ramp in steps", ups)
	}
	if p := s.at(20 * time.Minute); p.after != 23 {
		t.Errorf("at 20m: %d replicas, want 23", p.after)
	}
	// Steady demand (195 and 205 in turn): no change from 20m to 40m.
	if n := s.changes(20*time.Minute, 40*time.Minute); n != 0 {
		t.Errorf("%d changes under steady demand, want none", n)
	}
	// Down: at most one scale-down per delay window, and at 20 sessions the pool rests
	// at 4 (2 needed + 2 spare) until the demand stops.
	for from := time.Duration(0); from < 85*time.Minute; from += simPass {
		if n := s.downs(from, from+DefaultScaleDownDelay); n > 1 {
			t.Errorf("%d scale-downs within the delay window from %s", n, from)
		}
	}
	downs := s.downs(0, 85*time.Minute)
	if downs < 3 {
		t.Errorf("%d scale-downs, want the descent in several", downs)
	}
	if p := s.at(59 * time.Minute); p.after != 4 {
		t.Errorf("at 59m: %d replicas, want 4 (2 needed + 2 spare)", p.after)
	}
	// Idle: down to minReplicas (0) after the delay, not before.
	if p := s.at(64*time.Minute + 45*time.Second); p.after != 4 {
		t.Errorf("at 64m45s: %d replicas, want still 4 (the delay)", p.after)
	}
	if p := s.at(79 * time.Minute); p.after != 0 {
		t.Errorf("at 79m: %d replicas, want 0", p.after)
	}
	// And a held request wakes it at once.
	if p := s.at(80 * time.Minute); p.after != 1 {
		t.Errorf("at 80m: %d replicas, want 1", p.after)
	}
}

func TestSimulatedCrawlMinAndStep(t *testing.T) {
	spec := crawlSpec()
	spec.MinReplicas, spec.MaxStepUp = 2, ptr(intstr.FromInt32(2))
	s := &sim{spec: spec}
	s.run(t, 85*time.Minute)
	if p := s.at(time.Minute); p.after != 2 {
		t.Errorf("at 1m: %d replicas, want minReplicas 2", p.after)
	}
	if p := s.at(79 * time.Minute); p.after != 2 {
		t.Errorf("at 79m: %d replicas, want minReplicas 2", p.after)
	}
	for _, p := range s.passes {
		if p.after > p.available+2 && p.after > p.before {
			t.Errorf("at %s: up to %d with %d available, step 2", p.at, p.after, p.available)
		}
	}
}

func TestSimulatedCrawlBudget(t *testing.T) {
	spec := crawlSpec()
	spec.Budget = &Budget{MaxHourly: 7.5, CostPerChildHourly: 0.5} // 15 children
	s := &sim{spec: spec}
	s.run(t, 85*time.Minute)
	highest, capped := int32(0), 0
	for _, p := range s.passes {
		highest = max(highest, p.after)
		if p.reason == ReasonBudgetCapped {
			capped++
		}
	}
	if highest != 15 {
		t.Errorf("highest %d replicas, want the budget's 15", highest)
	}
	if capped == 0 {
		t.Error("the budget never bound")
	}
	if p := s.at(30 * time.Minute); p.after != 15 || p.reason != ReasonBudgetCapped {
		t.Errorf("at 30m: %d replicas, %s; want 15, BudgetCapped", p.after, p.reason)
	}
	if n := s.changes(20*time.Minute, 40*time.Minute); n != 0 {
		t.Errorf("%d changes under steady demand at the cap, want none", n)
	}
}

// BenchmarkDecide is one pool's pass with ten gateway replicas' samples: the
// autoscaler's work per pool.
func BenchmarkDecide(b *testing.B) {
	in := crawlSpec()
	in.Now, in.Replicas, in.Available = t0, 20, 18
	in.State = State{BelowSince: t0.Add(-time.Minute), BelowPeak: 12}
	for i := range 10 {
		in.Demand = append(in.Demand, Sample{Source: string(rune('a' + i)), At: t0.Add(-10 * time.Second), Sessions: 11})
	}
	for b.Loop() {
		Decide(in)
	}
}
