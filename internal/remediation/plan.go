package remediation

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// GroupSpec is a group's own brake.
type GroupSpec struct {
	// MaxUnhealthy: more unhealthy proxies than this (a count, or a percentage of the
	// group's size rounded up) hold remediation in the whole group.
	MaxUnhealthy intstr.IntOrString
	// Field names where MaxUnhealthy came from, for errors (for example
	// "proxy pool news/crawl: spec.remediation.maxUnhealthy").
	Field string
}

// Input is everything Plan decides from.
type Input struct {
	Now    time.Time
	Policy Policy
	// Proxies are the proxies to decide for, with every other member of their groups:
	// a group's size is the number of its members here.
	Proxies []State
	// Groups holds the groups' own brakes; a group without one takes
	// Policy.MaxUnhealthy.
	Groups map[string]GroupSpec
}

// Decision is what remediation decides for one proxy.
type Decision struct {
	Key string
	// Action is ActionReboot or ActionReplace to do now, "" for nothing.
	Action Action
	// Next is when to look at the proxy again (the controller requeues then); zero when
	// only a change of the proxy (or its group) can change the decision.
	Next time.Time
	// Record is the record to keep after this pass (with Action: the new attempt's),
	// nil to keep none (remove a stored one). With an Action, persist it before the
	// action is carried out (internal/controller/proxy does, with the version it read, so
	// that a pass that decided from a stale copy is refused before it acts): the
	// attempt then counts as made even if the action fails, and the next attempt
	// follows after its wait.
	Record *Record
	// Held: the proxy is due, but its group's brake or a probe-target outage holds it.
	Held bool
	// Condition is the Remediating condition to set (ObservedGeneration left to the
	// caller), nil to remove it.
	Condition *metav1.Condition
	// Concluded is the outcome of the previous attempt if this pass learnt it: failed
	// (another attempt is made now) or succeeded (healthy for ResetAfter, the record is
	// dropped). Count it with ObserveConcluded once the pass is written.
	Concluded *Concluded
	// Message says what was decided, for logs.
	Message string
}

// Concluded is the known outcome of an attempt.
type Concluded struct {
	Reason  string
	Action  Action
	Outcome string // OutcomeSucceeded or OutcomeFailed
	// FaultToServing is the time from the fault's start to the proxy being healthy
	// again, for a success.
	FaultToServing time.Duration
}

// Outcomes of an attempt.
const (
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
)

// GroupState is a group's brake as Plan found it.
type GroupState struct {
	Name string
	// Size counts the group's members in the Input; Unhealthy those past their boot or
	// unhealthy timeout (a proxy held by a probe-target outage not counted);
	// MaxUnhealthy is the brake as a count.
	Size, Unhealthy, MaxUnhealthy int
	// Held: Unhealthy > MaxUnhealthy; remediation waits in the whole group.
	Held bool
	// Message names the counts: what a condition or Event on the group says.
	Message string
	// Err is why the group's brake could not be read (it names the field); the group's
	// due proxies are held.
	Err error
}

// Result is Plan's answer.
type Result struct {
	// Decisions are in the order of Input.Proxies.
	Decisions []Decision
	// Groups are sorted by name.
	Groups []GroupState
	// Next is the earliest Decision.Next, zero if none.
	Next time.Time
}

// Plan decides, at in.Now, what to do with each proxy: nothing, look again at a time,
// reboot or replace. It reads no clock and changes nothing. A group's brake that cannot
// be read holds that group and is returned as an error (every such error joined); the
// Result is complete all the same.
func Plan(in Input) (Result, error) {
	pol := in.Policy.withDefaults()
	byName := map[string]*GroupState{}
	var errs []error
	var res Result
	for _, st := range in.Proxies {
		g := byName[st.Group]
		if g == nil {
			g = &GroupState{Name: st.Group}
			byName[st.Group] = g
		}
		g.Size++
		if !st.TargetDown && st.faulty(pol, in.Now) {
			g.Unhealthy++
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		g := byName[name]
		spec, ok := in.Groups[name]
		if !ok {
			spec = GroupSpec{MaxUnhealthy: pol.MaxUnhealthy, Field: "default maxUnhealthy"}
		}
		g.evaluate(spec)
		if g.Err != nil {
			errs = append(errs, g.Err)
		}
		res.Groups = append(res.Groups, *g)
	}
	for _, st := range in.Proxies {
		d := decide(st, pol, byName[st.Group], in.Now)
		if !d.Next.IsZero() && (res.Next.IsZero() || d.Next.Before(res.Next)) {
			res.Next = d.Next
		}
		res.Decisions = append(res.Decisions, d)
	}
	return res, errors.Join(errs...)
}

// evaluate sets g's brake from spec.
func (g *GroupState) evaluate(spec GroupSpec) {
	n, err := MaxUnhealthyCount(spec.MaxUnhealthy, g.Size)
	if err != nil {
		g.Err = fmt.Errorf("remediation group %s: %s: %w", g.Name, spec.Field, err)
		g.Held = true
		g.Message = fmt.Sprintf("%d of %d unhealthy; remediation held: %s: %v", g.Unhealthy, g.Size, spec.Field, err)
		return
	}
	g.MaxUnhealthy = n
	brake := fmt.Sprintf("maxUnhealthy %s", spec.MaxUnhealthy.String())
	if spec.MaxUnhealthy.Type == intstr.String {
		brake += fmt.Sprintf(" (%d)", n)
	}
	g.Held = g.Unhealthy > n
	if g.Held {
		g.Message = fmt.Sprintf("%d of %d unhealthy, more than %s: remediation held; it resumes when at most %d are unhealthy",
			g.Unhealthy, g.Size, brake, n)
		return
	}
	g.Message = fmt.Sprintf("%d of %d unhealthy, at most %s: remediation allowed", g.Unhealthy, g.Size, brake)
}
