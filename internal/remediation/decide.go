package remediation

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HeldRecheck is how soon a held proxy is looked at again: a brake releases when a
// member's health changes, which the controller hears of, but the end of a
// probe-target outage changes no Proxy.
const HeldRecheck = time.Minute

// fault is a proxy's fault clock: why it would be remediated, since when, and from when.
type fault struct {
	reason   string
	since    time.Time // the fault's start: the instance's start, or the first failure
	deadline time.Time // since plus the timeout, counted from the probe target's return at the earliest
}

// fault is st's fault clock; ok is false for a healthy proxy, one whose instance does
// not run, or one that is not failing.
func (st State) fault(pol Policy) (f fault, ok bool) {
	if st.Healthy || st.Started.IsZero() {
		return fault{}, false
	}
	boot, unhealthy := orDuration(st.BootTimeout, pol.BootTimeout), orDuration(st.UnhealthyTimeout, pol.UnhealthyTimeout)
	switch {
	case !st.Answered:
		return fault{ReasonBootTimeout, st.Started, later(st.Started, st.TargetUpSince).Add(boot)}, true
	case !st.FailingSince.IsZero():
		return fault{ReasonUnhealthy, st.FailingSince, later(st.FailingSince, st.TargetUpSince).Add(unhealthy)}, true
	}
	return fault{}, false
}

// faulty: st is past its boot or unhealthy timeout at now (what its group's brake
// counts).
func (st State) faulty(pol Policy, now time.Time) bool {
	f, ok := st.fault(pol)
	return ok && !now.Before(f.deadline)
}

// decide is Plan's decision for st, whose group is g.
func decide(st State, pol Policy, g *GroupState, now time.Time) Decision {
	d := Decision{Key: st.Key, Record: st.Record}
	rec := st.Record
	if st.NotRemediable != "" {
		d.Message = "not remediated: " + st.NotRemediable
		return d
	}
	if st.Healthy {
		return healthy(d, st, pol, now)
	}
	if rec != nil {
		d.Condition = underWay(rec, pol)
	}
	f, ok := st.fault(pol)
	if !ok {
		d.Message = "no fault to time: the instance is not running, or the proxy is not failing"
		return d
	}
	due := f.deadline
	if rec != nil {
		due = later(due, rec.At.Add(pol.Wait(rec.Attempt)))
	}
	if now.Before(due) {
		d.Next = due
		d.Message = fmt.Sprintf("%s; due at %s unless it becomes healthy", describeFault(f.reason, f.since), due.UTC().Format(time.RFC3339))
		return d
	}
	switch {
	case st.TargetDown:
		return hold(d, now, ReasonProbeTargetDown, "remediation held: the probe target itself is down, so failed probes say nothing about the proxy: nothing is remediated until it answers again")
	case g.Held:
		return hold(d, now, ReasonTooManyUnhealthy, fmt.Sprintf("group %s: %s", g.Name, g.Message))
	}
	attempt, since := int32(1), f.since
	if rec != nil {
		attempt, since = rec.Attempt+1, rec.FaultSince
		d.Concluded = &Concluded{Reason: rec.Reason, Action: rec.Action, Outcome: OutcomeFailed}
	}
	action := ActionReplace
	if st.CanReboot && (rec == nil || rec.Action != ActionReboot) {
		action = ActionReboot // each instance is rebooted once before it is replaced
	}
	r := &Record{Reason: f.reason, Attempt: attempt, Action: action, At: stamp(now), FaultSince: stamp(since)}
	d.Action, d.Record, d.Next = action, r, r.At.Add(pol.Wait(attempt))
	d.Condition = underWay(r, pol)
	d.Message = d.Condition.Message
	return d
}

// healthy is the decision for a healthy proxy: nothing, or the record dropped once it
// has been healthy for ResetAfter since the later of its recovery and the last attempt.
func healthy(d Decision, st State, pol Policy, now time.Time) Decision {
	rec := st.Record
	if rec == nil {
		d.Message = "healthy"
		return d
	}
	reset := later(st.HealthySince, rec.At).Add(pol.ResetAfter)
	if now.Before(reset) {
		d.Next = reset
		d.Message = fmt.Sprintf("healthy again since %s after attempt %d (%s); its record is dropped at %s",
			st.HealthySince.UTC().Format(time.RFC3339), rec.Attempt, rec.Action, reset.UTC().Format(time.RFC3339))
		return d
	}
	d.Record = nil
	d.Concluded = &Concluded{Reason: rec.Reason, Action: rec.Action, Outcome: OutcomeSucceeded,
		FaultToServing: max(st.HealthySince.Sub(rec.FaultSince), 0)}
	d.Message = fmt.Sprintf("healthy since %s: attempt %d (%s) mended it; record dropped", st.HealthySince.UTC().Format(time.RFC3339), rec.Attempt, rec.Action)
	return d
}

// hold is d held by reason: the condition says so in msg, and the proxy is looked at
// again after HeldRecheck.
func hold(d Decision, now time.Time, reason, msg string) Decision {
	d.Held, d.Next = true, now.Add(HeldRecheck)
	if d.Record != nil {
		msg += fmt.Sprintf(" (after attempt %d, %s at %s)", d.Record.Attempt, d.Record.Action, d.Record.At.Format(time.RFC3339))
	}
	d.Condition = &metav1.Condition{Type: ConditionRemediating, Status: metav1.ConditionFalse, Reason: reason, Message: msg}
	d.Message = msg
	return d
}

// underWay is the Remediating condition while r's attempt is under way. It depends on r
// alone, so it stays the same from the attempt to the next one (no status write per pass).
func underWay(r *Record, pol Policy) *metav1.Condition {
	verb := "rebooted the instance"
	if r.Action == ActionReplace {
		verb = "replaced the instance"
	}
	msg := fmt.Sprintf("attempt %d: %s at %s, as %s; attempt %d comes no sooner than %s, and only if it is not healthy by then",
		r.Attempt, verb, r.At.Format(time.RFC3339), describeFault(r.Reason, r.FaultSince),
		r.Attempt+1, r.At.Add(pol.Wait(r.Attempt)).Format(time.RFC3339))
	return &metav1.Condition{Type: ConditionRemediating, Status: metav1.ConditionTrue, Reason: r.Reason, Message: msg}
}

// describeFault says what a fault of reason since since is.
func describeFault(reason string, since time.Time) string {
	if reason == ReasonBootTimeout {
		return fmt.Sprintf("the proxy never answered a probe after its instance started at %s (boot timeout)", since.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("the proxy has failed its probes since %s (unhealthy timeout)", since.UTC().Format(time.RFC3339))
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func orDuration(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
