package autoscale

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

var t0 = time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// fresh is a sample from src measured ago before t0.
func fresh(src string, ago time.Duration, sessions float64) Sample {
	return Sample{Source: src, At: t0.Add(-ago), Sessions: sessions}
}

func ptr[T any](v T) *T { return &v }

// base is a pool of 0 to 10 children of 10 sessions each, at t0.
func base() Input {
	return Input{Now: t0, MinReplicas: 0, MaxReplicas: 10, Target: Target{Sessions: 10}}
}

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name     string
		in       func(*Input)
		decided  bool
		replicas int32
		reason   string
		next     time.Duration // since t0; -1: zero
		msg      []string      // substrings of the message
		state    func(*testing.T, State)
	}{
		{name: "an external autoscaler: nothing decided",
			in: func(in *Input) {
				in.Replicas, in.ExternalAutoscaler = 3, "HorizontalPodAutoscaler news/crawl"
				in.Demand = []Sample{fresh("gw-a", 0, 100)}
			},
			replicas: 3, reason: ReasonExternalAutoscaler, next: -1,
			msg: []string{"HorizontalPodAutoscaler news/crawl", "replicas 3"}},
		{name: "invalid: maxReplicas 0", in: func(in *Input) { in.Replicas, in.MaxReplicas = 2, 0 },
			replicas: 2, reason: ReasonInvalidSpec, next: -1, msg: []string{"maxReplicas 0", "kept at 2"}},
		{name: "invalid: min above max", in: func(in *Input) { in.MinReplicas = 11 },
			reason: ReasonInvalidSpec, next: -1, msg: []string{"minReplicas 11", "maxReplicas 10"}},
		{name: "invalid: no target", in: func(in *Input) { in.Target = Target{} },
			reason: ReasonInvalidSpec, next: -1, msg: []string{"target none"}},
		{name: "invalid: a malformed step", in: func(in *Input) { in.MaxStepUp = ptr(intstr.FromString("lots")) },
			reason: ReasonInvalidSpec, next: -1, msg: []string{"maxStepUp lots"}},
		{name: "invalid: a negative warm spare", in: func(in *Input) { in.WarmSpare = -1 },
			reason: ReasonInvalidSpec, next: -1, msg: []string{"warmSpare -1"}},

		{name: "no measurement: the size is kept", in: func(in *Input) { in.Replicas = 4 },
			decided: true, replicas: 4, reason: ReasonDemandUnknown, next: StepRecheck,
			msg: []string{"newer than 2m0s", "(0 stale)", "replicas 4"}},
		{name: "idle (no measurer holds a record): zero demand, held by the delay",
			in:      func(in *Input) { in.Replicas, in.Available, in.Idle = 4, 4, true },
			decided: true, replicas: 4, reason: ReasonHeldByDelay, next: DefaultScaleDownDelay,
			msg: []string{"demand 0 sessions, 0 req/s from 0 sources needs 0 children"}},
		{name: "idle with stale records: still unknown",
			in: func(in *Input) {
				in.Replicas, in.Idle = 4, true
				in.Demand = []Sample{fresh("gw-a", 3*time.Minute, 500)}
			},
			decided: true, replicas: 4, reason: ReasonDemandUnknown, next: StepRecheck, msg: []string{"(1 stale)"}},
		{name: "only stale measurements: the size is kept",
			in: func(in *Input) {
				in.Replicas = 4
				in.Demand = []Sample{fresh("gw-a", 3*time.Minute, 500), fresh("gw-b", 10*time.Minute, 0)}
			},
			decided: true, replicas: 4, reason: ReasonDemandUnknown, next: StepRecheck, msg: []string{"(2 stale)"}},
		{name: "no measurement below minReplicas: raised to it",
			in:      func(in *Input) { in.Replicas, in.MinReplicas = 1, 2 },
			decided: true, replicas: 2, reason: ReasonDemandUnknown, next: StepRecheck,
			msg:   []string{"replicas 2 (from 1, within minReplicas 2 and maxReplicas 10)"},
			state: func(t *testing.T, s State) { wantTime(t, "LastScaleUp", s.LastScaleUp, t0) }},
		{name: "a longer StaleAfter keeps an older measurement",
			in: func(in *Input) {
				in.StaleAfter = 5 * time.Minute
				in.Replicas, in.Available = 4, 4
				in.Demand = []Sample{fresh("gw-a", 3*time.Minute, 40)}
			},
			decided: true, replicas: 4, reason: ReasonWithinTarget, next: -1},

		{name: "from zero: one held request gives one child at once",
			in:      func(in *Input) { in.Demand = []Sample{{Source: "gw-a", At: t0, Held: 1}} },
			decided: true, replicas: 1, reason: ReasonScaledUp, next: -1,
			msg:   []string{"0 sessions + 1 held", "needs 1 children", "scaled up from 0 to 1"},
			state: func(t *testing.T, s State) { wantTime(t, "LastScaleUp", s.LastScaleUp, t0) }},
		{name: "from zero with a burst: the first step only",
			in:      func(in *Input) { in.Demand = []Sample{fresh("gw-a", 0, 95)} },
			decided: true, replicas: 1, reason: ReasonScaledUp, next: StepRecheck,
			msg: []string{"needs 10 children", "wants 10", "scaled up from 0 to 1", "0 available, at most 1 more"}},
		{name: "from zero with warm spare and demand: the spare comes too, within the step",
			in: func(in *Input) {
				in.WarmSpare, in.MaxStepUp = 2, ptr(intstr.FromInt32(5))
				in.Demand = []Sample{fresh("gw-a", 0, 3)}
			},
			decided: true, replicas: 3, reason: ReasonScaledUp, next: -1, msg: []string{"+ warm spare 2", "wants 3"}},
		{name: "a step doubles the pool beyond the available",
			in: func(in *Input) {
				in.Replicas, in.Available = 3, 3
				in.Demand = []Sample{fresh("gw-a", 0, 60), fresh("gw-b", 30*time.Second, 35)}
			},
			decided: true, replicas: 6, reason: ReasonScaledUp, next: StepRecheck,
			msg: []string{"95 sessions", "from 2 sources", "wants 10", "scaled up from 3 to 6"}},
		{name: "a step counts from the available children",
			in: func(in *Input) {
				in.Replicas, in.Available, in.MaxStepUp = 4, 2, ptr(intstr.FromInt32(3))
				in.Demand = []Sample{fresh("gw-a", 0, 100)}
			},
			decided: true, replicas: 5, reason: ReasonScaledUp, next: StepRecheck, msg: []string{"scaled up from 4 to 5"}},
		{name: "held by the step while the last one boots",
			in: func(in *Input) {
				in.Replicas, in.Available, in.MaxStepUp = 4, 2, ptr(intstr.FromInt32(1))
				in.Demand = []Sample{fresh("gw-a", 0, 100)}
			},
			decided: true, replicas: 4, reason: ReasonHeldByStep, next: StepRecheck,
			msg: []string{"held at 4: 2 available, at most 1 more beyond them (maxStepUp 1)"}},
		{name: "below minReplicas: raised to it in one step",
			in: func(in *Input) {
				in.Replicas, in.Available, in.MinReplicas = 1, 0, 5
				in.Demand = []Sample{fresh("gw-a", 0, 100)}
			},
			decided: true, replicas: 5, reason: ReasonScaledUp, next: StepRecheck, msg: []string{"wants 10", "scaled up from 1 to 5"}},
		{name: "a percentage step rounds up",
			in: func(in *Input) {
				in.Replicas, in.Available, in.MaxStepUp = 3, 3, ptr(intstr.FromString("10%"))
				in.Demand = []Sample{fresh("gw-a", 0, 100)}
			},
			decided: true, replicas: 4, reason: ReasonScaledUp, next: StepRecheck},
		{name: "the step reaches the wanted count",
			in: func(in *Input) {
				in.Replicas, in.Available, in.WarmSpare = 2, 2, 1
				in.Demand = []Sample{fresh("gw-a", 0, 25)}
			},
			decided: true, replicas: 4, reason: ReasonScaledUp, next: -1, msg: []string{"needs 3 children", "+ warm spare 1", "wants 4"}},
		{name: "requests per second need more than sessions",
			in: func(in *Input) {
				in.Target = Target{Sessions: 10, RequestsPerSecond: 5}
				in.Replicas, in.Available = 4, 4
				in.Demand = []Sample{{Source: "gw-a", At: t0, Sessions: 5, RequestsPerSecond: 30}}
			},
			decided: true, replicas: 6, reason: ReasonScaledUp, next: -1, msg: []string{"30 req/s", "at 10 sessions and 5 req/s per child", "needs 6"}},
		{name: "requests per second alone",
			in: func(in *Input) {
				in.Target = Target{RequestsPerSecond: 5}
				in.Replicas, in.Available = 2, 2
				in.Demand = []Sample{{Source: "gw-a", At: t0, Sessions: 500, RequestsPerSecond: 10}}
			},
			decided: true, replicas: 2, reason: ReasonWithinTarget, next: -1},
		{name: "of one source only the newest sample counts",
			in: func(in *Input) {
				in.Replicas, in.Available = 2, 2
				in.Demand = []Sample{fresh("gw-a", 0, 20), fresh("gw-a", time.Minute, 90)}
			},
			decided: true, replicas: 2, reason: ReasonWithinTarget, next: -1, msg: []string{"20 sessions", "1 sources"}},
		{name: "a stale source is left out of the sum",
			in: func(in *Input) {
				in.Replicas, in.Available = 2, 2
				in.Demand = []Sample{fresh("gw-a", 0, 20), fresh("gw-gone", 5*time.Minute, 90)}
			},
			decided: true, replicas: 2, reason: ReasonWithinTarget, next: -1, msg: []string{"20 sessions", "1 sources"}},
		{name: "at maxReplicas",
			in: func(in *Input) {
				in.Replicas, in.Available = 10, 10
				in.Demand = []Sample{fresh("gw-a", 0, 1000)}
			},
			decided: true, replicas: 10, reason: ReasonWithinTarget, next: -1, msg: []string{"needs 100", "capped at 10 by maxReplicas 10", "wants 10"}},
		{name: "above a lowered maxReplicas: down at once",
			in: func(in *Input) {
				in.Replicas, in.Available = 12, 12
				in.State.LastScaleUp = t0.Add(-time.Minute)
				in.Demand = []Sample{fresh("gw-a", 0, 1000)}
			},
			decided: true, replicas: 10, reason: ReasonScaledDown, next: -1,
			msg:   []string{"12 replicas exceed maxReplicas 10", "scaled down to 10"},
			state: func(t *testing.T, s State) { wantTime(t, "LastScaleDown", s.LastScaleDown, t0) }},

		{name: "the budget caps a scale-up",
			in: func(in *Input) {
				in.Replicas, in.Available = 4, 4
				in.Budget = &Budget{MaxHourly: 3, CostPerChildHourly: 0.5}
				in.Demand = []Sample{fresh("gw-a", 0, 1000)}
			},
			decided: true, replicas: 6, reason: ReasonBudgetCapped, next: -1,
			msg: []string{"capped at 6 by budget 3/h at 0.5/h per child (6 children)", "scaled up from 4 to 6"}},
		{name: "the budget binds at the cap",
			in: func(in *Input) {
				in.Replicas, in.Available = 6, 6
				in.Budget = &Budget{MaxHourly: 3, CostPerChildHourly: 0.5}
				in.Demand = []Sample{fresh("gw-a", 0, 1000)}
			},
			decided: true, replicas: 6, reason: ReasonBudgetCapped, next: -1, msg: []string{"(6 children)"}},
		{name: "a step below the budget cap is a scale-up",
			in: func(in *Input) {
				in.Replicas, in.Available = 2, 2
				in.Budget = &Budget{MaxHourly: 3, CostPerChildHourly: 0.5}
				in.Demand = []Sample{fresh("gw-a", 0, 1000)}
			},
			decided: true, replicas: 4, reason: ReasonScaledUp, next: StepRecheck},
		{name: "over a lowered budget: down at once",
			in: func(in *Input) {
				in.Replicas, in.Available = 8, 8
				in.Budget = &Budget{MaxHourly: 3, CostPerChildHourly: 0.5}
				in.Demand = []Sample{fresh("gw-a", 0, 1000)}
			},
			decided: true, replicas: 6, reason: ReasonBudgetCapped, next: -1, msg: []string{"8 replicas exceed budget", "scaled down to 6"}},
		{name: "the budget never goes below minReplicas",
			in: func(in *Input) {
				in.Replicas, in.Available, in.MinReplicas = 3, 3, 3
				in.Budget = &Budget{MaxHourly: 1, CostPerChildHourly: 0.5}
				in.Demand = []Sample{fresh("gw-a", 0, 1000)}
			},
			decided: true, replicas: 3, reason: ReasonBudgetCapped, next: -1, msg: []string{"capped at 3 by budget 1/h"}},
		{name: "a budget above maxReplicas does not bind",
			in: func(in *Input) {
				in.Replicas, in.Available = 10, 10
				in.Budget = &Budget{MaxHourly: 100, CostPerChildHourly: 0.5}
				in.Demand = []Sample{fresh("gw-a", 0, 1000)}
			},
			decided: true, replicas: 10, reason: ReasonWithinTarget, next: -1},
		{name: "a budget of nothing keeps the pool at zero, even for a held request",
			in: func(in *Input) {
				in.Budget = &Budget{MaxHourly: 0, CostPerChildHourly: 0.5}
				in.Demand = []Sample{{Source: "gw-a", At: t0, Held: 1}}
			},
			decided: true, replicas: 0, reason: ReasonBudgetCapped, next: -1, msg: []string{"capped at 0 by budget 0/h"}},
		{name: "invalid: a negative budget", in: func(in *Input) { in.Budget = &Budget{MaxHourly: -1, CostPerChildHourly: 0.5} },
			reason: ReasonInvalidSpec, next: -1, msg: []string{"budget maxHourly -1"}},
		{name: "a free child makes no cap",
			in: func(in *Input) {
				in.Replicas, in.Available = 10, 10
				in.Budget = &Budget{MaxHourly: 0, CostPerChildHourly: 0}
				in.Demand = []Sample{fresh("gw-a", 0, 1000)}
			},
			decided: true, replicas: 10, reason: ReasonWithinTarget, next: -1},

		{name: "within target", in: func(in *Input) {
			in.Replicas, in.Available = 3, 3
			in.State = State{BelowSince: t0.Add(-time.Minute), BelowPeak: 2}
			in.Demand = []Sample{fresh("gw-a", 0, 30)}
		},
			decided: true, replicas: 3, reason: ReasonWithinTarget, next: -1, msg: []string{"wants 3; replicas 3"},
			state: func(t *testing.T, s State) { wantTime(t, "BelowSince", s.BelowSince, time.Time{}) }},
		{name: "below: the delay starts",
			in: func(in *Input) {
				in.Replicas, in.Available = 5, 5
				in.Demand = []Sample{fresh("gw-a", 0, 10)}
			},
			decided: true, replicas: 5, reason: ReasonHeldByDelay, next: DefaultScaleDownDelay,
			msg: []string{"wants 1", "held at 5 until 2026-12-04T10:05:00Z", "scaleDownDelay 5m0s", "last change never"},
			state: func(t *testing.T, s State) {
				wantTime(t, "BelowSince", s.BelowSince, t0)
				if s.BelowPeak != 1 {
					t.Errorf("BelowPeak = %d, want 1", s.BelowPeak)
				}
			}},
		{name: "below within the delay: the peak is kept",
			in: func(in *Input) {
				in.Replicas, in.Available = 5, 5
				in.State = State{BelowSince: t0.Add(-4 * time.Minute), BelowPeak: 3}
				in.Demand = []Sample{fresh("gw-a", 0, 10)}
			},
			decided: true, replicas: 5, reason: ReasonHeldByDelay, next: time.Minute,
			state: func(t *testing.T, s State) {
				if s.BelowPeak != 3 {
					t.Errorf("BelowPeak = %d, want 3", s.BelowPeak)
				}
			}},
		{name: "below for the delay: down to the peak",
			in: func(in *Input) {
				in.Replicas, in.Available = 5, 5
				in.State = State{BelowSince: t0.Add(-5 * time.Minute), BelowPeak: 3}
				in.Demand = []Sample{fresh("gw-a", 0, 10)}
			},
			decided: true, replicas: 3, reason: ReasonScaledDown, next: DefaultScaleDownDelay,
			msg: []string{"scaled down from 5 to 3, the most wanted in the last 5m0s"},
			state: func(t *testing.T, s State) {
				wantTime(t, "LastScaleDown", s.LastScaleDown, t0)
				wantTime(t, "BelowSince", s.BelowSince, t0)
				if s.BelowPeak != 1 {
					t.Errorf("BelowPeak = %d, want 1", s.BelowPeak)
				}
			}},
		{name: "below for the delay, but a scale-down 2m ago",
			in: func(in *Input) {
				in.Replicas, in.Available = 5, 5
				in.State = State{BelowSince: t0.Add(-10 * time.Minute), BelowPeak: 1, LastScaleDown: t0.Add(-2 * time.Minute)}
				in.Demand = []Sample{fresh("gw-a", 0, 10)}
			},
			decided: true, replicas: 5, reason: ReasonHeldByDelay, next: 3 * time.Minute,
			msg: []string{"last change 2026-12-04T09:58:00Z"}},
		{name: "below for the delay, but a scale-up 1m ago",
			in: func(in *Input) {
				in.Replicas, in.Available = 5, 5
				in.State = State{BelowSince: t0.Add(-10 * time.Minute), BelowPeak: 1, LastScaleUp: t0.Add(-time.Minute)}
				in.Demand = []Sample{fresh("gw-a", 0, 10)}
			},
			decided: true, replicas: 5, reason: ReasonHeldByDelay, next: 4 * time.Minute},
		{name: "a shorter delay",
			in: func(in *Input) {
				in.Replicas, in.Available, in.ScaleDownDelay = 5, 5, time.Minute
				in.State = State{BelowSince: t0.Add(-time.Minute), BelowPeak: 1}
				in.Demand = []Sample{fresh("gw-a", 0, 10)}
			},
			decided: true, replicas: 1, reason: ReasonScaledDown, next: -1, msg: []string{"scaled down from 5 to 1"}},
		{name: "no demand: down to minReplicas, the warm spare not kept",
			in: func(in *Input) {
				in.Replicas, in.Available, in.MinReplicas, in.WarmSpare = 5, 5, 1, 2
				in.State = State{BelowSince: t0.Add(-6 * time.Minute), BelowPeak: 1}
				in.Demand = []Sample{fresh("gw-a", 0, 0)}
			},
			decided: true, replicas: 1, reason: ReasonScaledDown, next: -1, msg: []string{"needs 0 children", "minReplicas 1", "wants 1"}},
		{name: "no demand: down to zero",
			in: func(in *Input) {
				in.Replicas, in.Available, in.WarmSpare = 2, 2, 2
				in.State = State{BelowSince: t0.Add(-6 * time.Minute), BelowPeak: 0}
				in.Demand = []Sample{fresh("gw-a", 0, 0)}
			},
			decided: true, replicas: 0, reason: ReasonScaledDown, next: -1},
		{name: "while there is demand the warm spare stays",
			in: func(in *Input) {
				in.Replicas, in.Available, in.WarmSpare = 5, 5, 2
				in.State = State{BelowSince: t0.Add(-6 * time.Minute), BelowPeak: 3}
				in.Demand = []Sample{fresh("gw-a", 0, 0.5)}
			},
			decided: true, replicas: 3, reason: ReasonScaledDown, next: -1, msg: []string{"needs 1 children", "+ warm spare 2", "wants 3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := base()
			if tc.in != nil {
				tc.in(&in)
			}
			d := Decide(in)
			if d.Decided != tc.decided || d.Replicas != tc.replicas || d.Reason != tc.reason {
				t.Errorf("= decided %t, %d, %s; want %t, %d, %s\n%s", d.Decided, d.Replicas, d.Reason, tc.decided, tc.replicas, tc.reason, d.Message)
			}
			want := time.Time{}
			if tc.next >= 0 {
				want = at(tc.next)
			}
			wantTime(t, "Next", d.Next, want)
			for _, m := range tc.msg {
				if !strings.Contains(d.Message, m) {
					t.Errorf("message %q lacks %q", d.Message, m)
				}
			}
			if tc.state != nil {
				tc.state(t, d.State)
			}
		})
	}
}

func wantTime(t *testing.T, name string, got, want time.Time) {
	t.Helper()
	if !got.Equal(want) {
		t.Errorf("%s = %s, want %s", name, got.Format(time.TimeOnly), want.Format(time.TimeOnly))
	}
}

// TestDecideBounds decides from many random inputs and checks the bounds every decision
// keeps: within min, max and the budget; up by at most the step; down only after the
// delay, to no fewer than wanted.
func TestDecideBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(45, 1))
	for i := range 20000 {
		in := Input{
			Now:            t0,
			MaxReplicas:    1 + r.Int32N(20),
			Replicas:       r.Int32N(25),
			WarmSpare:      r.Int32N(4),
			ScaleDownDelay: time.Duration(r.IntN(4)) * time.Minute,
			Target:         Target{Sessions: float64(r.IntN(3) * 5), RequestsPerSecond: float64(r.IntN(3))},
		}
		if in.Target == (Target{}) {
			in.Target.Sessions = 1
		}
		in.MinReplicas = r.Int32N(in.MaxReplicas + 1)
		in.Available = r.Int32N(in.Replicas + 1)
		if r.IntN(3) == 0 {
			in.MaxStepUp = ptr(intstr.FromInt32(r.Int32N(4)))
		}
		if r.IntN(3) == 0 {
			in.Budget = &Budget{MaxHourly: float64(r.IntN(10)), CostPerChildHourly: 0.5}
		}
		for j := range r.IntN(4) {
			in.Demand = append(in.Demand, Sample{Source: string(rune('a' + j)), At: t0.Add(-time.Duration(r.IntN(180)) * time.Second),
				Sessions: float64(r.IntN(100)), Held: r.Int32N(2), RequestsPerSecond: float64(r.IntN(20))})
		}
		ago := func() time.Time {
			if r.IntN(2) == 0 {
				return time.Time{}
			}
			return t0.Add(-time.Duration(r.IntN(10)) * time.Minute)
		}
		in.State = State{LastScaleUp: ago(), LastScaleDown: ago(), BelowSince: ago()}
		if !in.State.BelowSince.IsZero() {
			in.State.BelowPeak = r.Int32N(in.Replicas + 1)
		}
		d := Decide(in)
		capN, _ := in.capacity()
		switch {
		case !d.Decided:
			t.Fatalf("%d: not decided: %s", i, d.Message)
		case d.Replicas > capN || d.Replicas < in.MinReplicas:
			t.Fatalf("%d: %d replicas, out of [%d, %d]: %+v\n%s", i, d.Replicas, in.MinReplicas, capN, in, d.Message)
		case d.Replicas > in.Replicas && d.Replicas > max(in.Replicas, in.Available+in.step(), in.MinReplicas):
			t.Fatalf("%d: up from %d to %d beyond the step: %+v\n%s", i, in.Replicas, d.Replicas, in, d.Message)
		case d.Replicas < in.Replicas && in.Replicas <= capN:
			delay := in.delay()
			if in.State.BelowSince.IsZero() || in.Now.Sub(in.State.BelowSince) < delay ||
				in.Now.Sub(in.State.LastScaleUp) < delay || in.Now.Sub(in.State.LastScaleDown) < delay {
				t.Fatalf("%d: down from %d to %d within the delay: %+v\n%s", i, in.Replicas, d.Replicas, in, d.Message)
			}
			if d.Replicas < d.Wanted {
				t.Fatalf("%d: down to %d, below the %d wanted\n%s", i, d.Replicas, d.Wanted, d.Message)
			}
		}
		if d.Demand.Sources > 0 && (d.Demand.Held > 0 || d.Demand.Sessions > 0 || d.Demand.RequestsPerSecond > 0) &&
			in.Replicas == 0 && capN > 0 && d.Replicas < 1 {
			t.Fatalf("%d: demand at zero and still 0 replicas\n%s", i, d.Message)
		}
	}
}
