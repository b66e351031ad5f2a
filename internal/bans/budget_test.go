package bans

import (
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestRetirementBudget(t *testing.T) {
	for _, tc := range []struct {
		budget   intstr.IntOrString
		replicas int
		want     int
	}{
		{DefaultMaxRetirementsPerHour, 3, 1},
		{DefaultMaxRetirementsPerHour, 10, 1},
		{DefaultMaxRetirementsPerHour, 11, 2},
		{DefaultMaxRetirementsPerHour, 50, 5},
		{DefaultMaxRetirementsPerHour, 0, 0},
		{intstr.FromInt32(2), 3, 2},
		{intstr.FromInt32(0), 30, 0},
		{intstr.FromString("100%"), 7, 7},
	} {
		got, err := RetirementBudget(tc.budget, tc.replicas)
		if err != nil || got != tc.want {
			t.Errorf("RetirementBudget(%s, %d) = %d, %v; want %d", tc.budget.String(), tc.replicas, got, err, tc.want)
		}
	}
	if _, err := RetirementBudget(intstr.FromString("many"), 3); err == nil {
		t.Error("RetirementBudget(many) took a budget that is no number or percentage")
	}
}

func TestParseRetirementBudget(t *testing.T) {
	for in, want := range map[string]intstr.IntOrString{"0": intstr.FromInt(0), "3": intstr.FromInt(3), "1000": intstr.FromInt(1000),
		"10%": intstr.FromString("10%"), "100%": intstr.FromString("100%")} {
		if got, err := ParseRetirementBudget(in); err != nil || got != want {
			t.Errorf("ParseRetirementBudget(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for in, msg := range map[string]string{"-1": "give 0 to 1000", "1001": "give 0 to 1000", "ten": `"ten" retirements per hour`,
		"10 %": "a percentage of the pool's replicas such as 10%", "1000%0": "retirements per hour", "": "retirements per hour"} {
		if _, err := ParseRetirementBudget(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseRetirementBudget(%q) = %v, want an error saying %q", in, err, msg)
		}
	}
}

// The budget lets the first due children through, holds the rest back until the oldest
// retirement leaves the hour, forgets retirements older than the hour, and does not
// charge again a child it already recorded.
func TestPlanRetirements(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	for _, tc := range []struct {
		name             string
		due              []string
		recent           []Retirement
		budget           int
		retire, heldBack []string
		recentAfter      []string
		nextFree         time.Time
	}{
		{name: "within the budget", due: []string{"a"}, budget: 1, retire: []string{"a"}, recentAfter: []string{"a"}},
		{name: "past the budget", due: []string{"a", "b", "c"}, budget: 1,
			retire: []string{"a"}, heldBack: []string{"b", "c"}, recentAfter: []string{"a"}, nextFree: now.Add(time.Hour)},
		{name: "spent by an earlier retirement", due: []string{"b"}, budget: 1,
			recent:   []Retirement{{"a", ago(20 * time.Minute)}},
			heldBack: []string{"b"}, recentAfter: []string{"a"}, nextFree: now.Add(40 * time.Minute)},
		{name: "an old retirement no longer counts", due: []string{"b"}, budget: 1,
			recent: []Retirement{{"a", ago(time.Hour)}}, retire: []string{"b"}, recentAfter: []string{"b"}},
		{name: "the oldest frees first", due: []string{"d"}, budget: 2,
			recent:   []Retirement{{"b", ago(10 * time.Minute)}, {"a", ago(50 * time.Minute)}, {"x", ago(2 * time.Hour)}},
			heldBack: []string{"d"}, recentAfter: []string{"a", "b"}, nextFree: now.Add(10 * time.Minute)},
		{name: "a recorded child is retired without more budget", due: []string{"a", "b"}, budget: 1,
			recent: []Retirement{{"a", ago(time.Minute)}}, retire: []string{"a"}, heldBack: []string{"b"},
			recentAfter: []string{"a"}, nextFree: now.Add(59 * time.Minute)},
		{name: "a budget of 0 holds back for good", due: []string{"a"}, budget: 0, heldBack: []string{"a"}},
		{name: "nothing due", budget: 1, recent: []Retirement{{"a", ago(time.Minute)}}, recentAfter: []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := PlanRetirements(tc.due, tc.recent, tc.budget, now)
			var recent []string
			for _, r := range p.Recent {
				recent = append(recent, r.Proxy)
			}
			if !slices.Equal(p.Retire, tc.retire) || !slices.Equal(p.HeldBack, tc.heldBack) || !slices.Equal(recent, tc.recentAfter) || !p.NextFree.Equal(tc.nextFree) {
				t.Errorf("plan: retire %v, held back %v, recent %v, next free %v; want %v, %v, %v, %v",
					p.Retire, p.HeldBack, recent, p.NextFree, tc.retire, tc.heldBack, tc.recentAfter, tc.nextFree)
			}
			if len(p.Recent) > max(tc.budget, len(tc.recent)) {
				t.Errorf("%d retirements recorded with a budget of %d", len(p.Recent), tc.budget)
			}
		})
	}
}
