package autoscale

import (
	"fmt"
	"math"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// Defaults, used where an Input leaves a field zero.
const (
	// DefaultScaleDownDelay is how long the demand must stay below the pool's size before
	// it shrinks, and the least time between a scale-down and any other change.
	DefaultScaleDownDelay = 5 * time.Minute
	// DefaultStaleAfter: a measurement older than this is ignored.
	DefaultStaleAfter = 2 * time.Minute
	// StepRecheck is when to look again while a scale-up waits for its last step to
	// become available, or while the demand is unknown.
	StepRecheck = 15 * time.Second
)

// DefaultMaxStepUp: a scale-up at most doubles the pool per step (and adds at least one
// child), as the HorizontalPodAutoscaler's default scale-up policy does.
var DefaultMaxStepUp = intstr.FromString("100%")

// Reasons: the Decision's reason, a word for a condition.
const (
	ReasonScaledUp           = "ScaledUp"
	ReasonScaledDown         = "ScaledDown"
	ReasonWithinTarget       = "WithinTarget"
	ReasonHeldByDelay        = "HeldByDelay"
	ReasonHeldByStep         = "HeldByStep"
	ReasonBudgetCapped       = "BudgetCapped"
	ReasonExternalAutoscaler = "ExternalAutoscaler"
	ReasonDemandUnknown      = "DemandUnknown"
	ReasonInvalidSpec        = "InvalidSpec"
)

// Target is the load one available child is meant to carry. A zero field is not used;
// at least one must be set. With both, the pool is sized for whichever needs more.
type Target struct {
	// Sessions: concurrent sessions (open tunnels and held requests) per child.
	Sessions float64
	// RequestsPerSecond per child.
	RequestsPerSecond float64
}

// Sample is one source's measurement of the pool's demand: a gateway replica's, or
// discovery's picks.
type Sample struct {
	// Source names the measurer (for example "gateway/egress-gw-7d9f-x2"); of several
	// samples from one source only the newest counts.
	Source string
	// At is when it was measured.
	At time.Time
	// Sessions is the source's concurrent sessions (open tunnels, live sessions) to the
	// pool; Held its requests held waiting for a child (not counted in Sessions).
	Sessions float64
	Held     int32
	// RequestsPerSecond is the source's request rate to the pool.
	RequestsPerSecond float64
}

// Budget caps what a pool spends.
type Budget struct {
	// MaxHourly is the most the pool may cost per hour, and CostPerChildHourly what one
	// child costs per hour (its machine type and address), in the same currency. The
	// budget allows floor(MaxHourly / CostPerChildHourly) children; a child with no cost
	// (0) makes no cap.
	MaxHourly, CostPerChildHourly float64
}

// State is what the autoscaler keeps between passes; the controller persists
// Decision.State and hands it back as Input.State.
type State struct {
	// LastScaleUp and LastScaleDown are the last changes of the pool's size made by the
	// autoscaler.
	LastScaleUp, LastScaleDown time.Time
	// BelowSince is since when the wanted count has stayed below the pool's size (zero:
	// it is not below), and BelowPeak the highest wanted count since then: a scale-down
	// goes to it, so that a dip within the delay does not take away what a peak needed.
	BelowSince time.Time
	BelowPeak  int32
}

// Input is everything Decide decides from.
type Input struct {
	Now time.Time
	// Replicas is the pool's size now (spec.replicas), Available its available children.
	Replicas, Available int32
	// MinReplicas (0 allowed) and MaxReplicas (at least 1, at least MinReplicas) bound
	// the pool.
	MinReplicas, MaxReplicas int32
	Target                   Target
	// Demand holds the measurements; those older than StaleAfter (0:
	// DefaultStaleAfter) are ignored.
	Demand     []Sample
	StaleAfter time.Duration
	// Idle says that no measurer has reported any demand for the pool at all (none
	// holds a record for it): with no Demand the demand is then zero, not unknown.
	Idle bool
	// WarmSpare children are kept beyond the demand while there is any.
	WarmSpare int32
	// ScaleDownDelay: 0 is DefaultScaleDownDelay.
	ScaleDownDelay time.Duration
	// MaxStepUp bounds a scale-up like a rollout's maxSurge: at most this many children
	// (or this percentage of Replicas, rounded up; at least 1) beyond those available.
	// Nil is DefaultMaxStepUp.
	MaxStepUp *intstr.IntOrString
	// Budget, when set, caps the pool's size (never below MinReplicas).
	Budget *Budget
	// ExternalAutoscaler names an HPA or KEDA ScaledObject that drives the pool ("" when
	// none): Decide then decides nothing.
	ExternalAutoscaler string
	State              State
}

// Demand is the sum of the fresh samples.
type Demand struct {
	Sessions          float64
	Held              int32
	RequestsPerSecond float64
	// Sources counts the fresh sources, Stale the sources ignored as too old.
	Sources, Stale int
}

func (d Demand) String() string {
	s := fmt.Sprintf("%g sessions", d.Sessions)
	if d.Held > 0 {
		s += fmt.Sprintf(" + %d held", d.Held)
	}
	return s + fmt.Sprintf(", %g req/s from %d sources", d.RequestsPerSecond, d.Sources)
}

// Decision is Decide's answer.
type Decision struct {
	// Decided is false when the pool's size is not the autoscaler's to set (an external
	// autoscaler, an invalid spec): Replicas is then the Input's.
	Decided bool
	// Replicas is the pool's desired size.
	Replicas int32
	// Wanted is what the demand asks for (ceil(demand/target) + warm spare, within min
	// and max and the budget) before the step and the delay; Demand is the demand acted
	// on.
	Wanted int32
	Demand Demand
	// Reason is a CamelCase word for a condition; Message names the numbers.
	Reason, Message string
	// Next is when to look again; zero when only new demand or a new spec can change
	// the decision.
	Next time.Time
	// State is what to keep for the next pass.
	State State
}

// Decide sizes a pool at in.Now. It reads no clock and changes nothing. The rules:
//   - with an external autoscaler on, nothing is decided (ExternalAutoscaler);
//   - without a fresh measurement the size is kept (within min, max and the budget)
//     (DemandUnknown), unless the pool is Idle (no measurer holds a record for it);
//   - the pool wants ceil(demand/target) children, plus the warm spare when that is
//     more than 0, never fewer than MinReplicas nor more than MaxReplicas or the budget
//     allows;
//   - it grows at once, toward what it wants, at most MaxStepUp children beyond those
//     available (ScaledUp, or HeldByStep while the last step boots), but to MinReplicas
//     in one step; any demand at zero gives at least one child at once;
//   - it shrinks only once it has wanted fewer for ScaleDownDelay, and ScaleDownDelay
//     after its last change, to the most it wanted in that time (ScaledDown; HeldByDelay
//     meanwhile): at most one scale-down per delay window;
//   - above MaxReplicas or the budget it shrinks at once (ScaledDown, BudgetCapped).
func Decide(in Input) Decision {
	// The demand is summed even when nothing is decided: the controller shows and exports
	// it, and an external autoscaler may scale on it.
	d := Decision{Replicas: in.Replicas, State: in.State, Demand: in.demand()}
	if in.ExternalAutoscaler != "" {
		d.Reason = ReasonExternalAutoscaler
		d.Message = fmt.Sprintf("%s drives the pool's size; the built-in autoscaler is off while it is on (replicas %d)",
			in.ExternalAutoscaler, in.Replicas)
		d.State.BelowSince, d.State.BelowPeak = time.Time{}, 0
		return d
	}
	if msg := in.invalid(); msg != "" {
		d.Reason, d.Message = ReasonInvalidSpec, msg+fmt.Sprintf("; replicas kept at %d", in.Replicas)
		return d
	}
	d.Decided = true
	delay := in.ScaleDownDelay
	if delay <= 0 {
		delay = DefaultScaleDownDelay
	}
	capN, capped := in.capacity()
	bound := fmt.Sprintf("maxReplicas %d", in.MaxReplicas)
	if capped {
		bound = in.budgetNote(capN)
	}

	if d.Demand.Sources == 0 && !(in.Idle && len(in.Demand) == 0) {
		d.Replicas = min(max(in.Replicas, in.MinReplicas), capN)
		d.Wanted = d.Replicas
		d.Reason = ReasonDemandUnknown
		d.Message = fmt.Sprintf("no measurement of the demand newer than %s (%d stale); replicas %d",
			in.staleAfter(), d.Demand.Stale, d.Replicas)
		if d.Replicas != in.Replicas {
			d.Message += fmt.Sprintf(" (from %d, within minReplicas %d and %s)", in.Replicas, in.MinReplicas, bound)
		}
		d.State.BelowSince, d.State.BelowPeak = time.Time{}, 0
		d.Next = in.Now.Add(StepRecheck)
		return d.changed(in)
	}

	need := in.need(d.Demand)
	wanted := need
	if need > 0 {
		wanted += in.WarmSpare
	}
	uncapped := max(wanted, in.MinReplicas)
	d.Wanted = min(uncapped, capN)
	budgetBinds := capped && uncapped > capN
	wantNote := fmt.Sprintf("demand %s needs %d children at %s per child", d.Demand, need, in.Target)
	if need > 0 && in.WarmSpare > 0 {
		wantNote += fmt.Sprintf(", + warm spare %d", in.WarmSpare)
	}
	if uncapped > wanted {
		wantNote += fmt.Sprintf(", minReplicas %d", in.MinReplicas)
	}
	if uncapped > capN {
		wantNote += fmt.Sprintf(", capped at %d by %s", capN, bound)
	}
	wantNote += fmt.Sprintf(": wants %d", d.Wanted)

	switch {
	case in.Replicas > capN:
		// Above the bounds (lowered maxReplicas or budget): shrink at once.
		d.Replicas = d.Wanted
		d.Reason = ReasonScaledDown
		if capped {
			d.Reason = ReasonBudgetCapped
		}
		d.Message = fmt.Sprintf("%s; %d replicas exceed %s: scaled down to %d", wantNote, in.Replicas, bound, d.Replicas)
		d.State.BelowSince, d.State.BelowPeak = time.Time{}, 0
	case d.Wanted > in.Replicas:
		step := in.step()
		// The step bounds growth beyond minReplicas; the floor itself comes at once.
		d.Replicas = max(min(d.Wanted, max(in.Replicas, in.Available+step)), in.MinReplicas)
		d.State.BelowSince, d.State.BelowPeak = time.Time{}, 0
		if d.Replicas == in.Replicas {
			d.Reason = ReasonHeldByStep
			d.Message = fmt.Sprintf("%s; held at %d: %d available, at most %d more beyond them (maxStepUp %s)",
				wantNote, in.Replicas, in.Available, step, in.maxStepUp().String())
			d.Next = in.Now.Add(StepRecheck)
			break
		}
		d.Reason = ReasonScaledUp
		if budgetBinds && d.Replicas == d.Wanted {
			d.Reason = ReasonBudgetCapped
		}
		d.Message = fmt.Sprintf("%s; scaled up from %d to %d", wantNote, in.Replicas, d.Replicas)
		if d.Replicas < d.Wanted {
			d.Message += fmt.Sprintf(" (%d available, at most %d more beyond them: maxStepUp %s)", in.Available, step, in.maxStepUp().String())
			d.Next = in.Now.Add(StepRecheck)
		}
	case d.Wanted == in.Replicas:
		d.State.BelowSince, d.State.BelowPeak = time.Time{}, 0
		d.Reason = ReasonWithinTarget
		if budgetBinds {
			d.Reason = ReasonBudgetCapped
		}
		d.Message = fmt.Sprintf("%s; replicas %d", wantNote, in.Replicas)
	default: // wanted fewer
		if d.State.BelowSince.IsZero() {
			d.State.BelowSince, d.State.BelowPeak = in.Now, d.Wanted
		}
		d.State.BelowPeak = max(d.State.BelowPeak, d.Wanted)
		due := latest(d.State.BelowSince.Add(delay), in.State.LastScaleDown.Add(delay), in.State.LastScaleUp.Add(delay))
		if in.Now.Before(due) {
			d.Reason = ReasonHeldByDelay
			d.Message = fmt.Sprintf("%s; held at %d until %s (scaleDownDelay %s: below since %s, last change %s)",
				wantNote, in.Replicas, due.UTC().Format(time.RFC3339), delay,
				d.State.BelowSince.UTC().Format(time.RFC3339), lastChange(in.State))
			d.Next = due
			break
		}
		d.Replicas = d.State.BelowPeak
		d.Reason = ReasonScaledDown
		d.Message = fmt.Sprintf("%s; scaled down from %d to %d, the most wanted in the last %s",
			wantNote, in.Replicas, d.Replicas, in.Now.Sub(d.State.BelowSince).Round(time.Second))
		d.State.BelowSince, d.State.BelowPeak = time.Time{}, 0
		if d.Wanted < d.Replicas {
			// Still below the new size: the next window starts now.
			d.State.BelowSince, d.State.BelowPeak = in.Now, d.Wanted
		}
	}
	return d.changed(in)
}

// changed records a change of size in the state.
func (d Decision) changed(in Input) Decision {
	switch {
	case d.Replicas > in.Replicas:
		d.State.LastScaleUp = in.Now
	case d.Replicas < in.Replicas:
		d.State.LastScaleDown = in.Now
		if d.Next.IsZero() && d.Reason == ReasonScaledDown && d.Replicas > d.Wanted {
			d.Next = in.Now.Add(in.delay())
		}
	}
	return d
}

func (in *Input) delay() time.Duration {
	if in.ScaleDownDelay > 0 {
		return in.ScaleDownDelay
	}
	return DefaultScaleDownDelay
}

func (in *Input) invalid() string {
	var bad []string
	if in.MaxReplicas < 1 {
		bad = append(bad, fmt.Sprintf("maxReplicas %d is less than 1", in.MaxReplicas))
	}
	if in.MinReplicas < 0 || in.MinReplicas > in.MaxReplicas {
		bad = append(bad, fmt.Sprintf("minReplicas %d is not within 0 and maxReplicas %d", in.MinReplicas, in.MaxReplicas))
	}
	if in.WarmSpare < 0 {
		bad = append(bad, fmt.Sprintf("warmSpare %d is negative", in.WarmSpare))
	}
	if in.Target.Sessions < 0 || in.Target.RequestsPerSecond < 0 || (in.Target.Sessions == 0 && in.Target.RequestsPerSecond == 0) {
		bad = append(bad, fmt.Sprintf("target %s: want at least one positive target", in.Target))
	}
	if s, err := intstr.GetScaledValueFromIntOrPercent(in.maxStepUp(), 1, true); err != nil || s < 0 {
		bad = append(bad, fmt.Sprintf("maxStepUp %s: want a non-negative count or percentage", in.maxStepUp().String()))
	}
	if b := in.Budget; b != nil && (b.MaxHourly < 0 || b.CostPerChildHourly < 0) {
		bad = append(bad, fmt.Sprintf("budget maxHourly %g, cost per child %g: want non-negative", b.MaxHourly, b.CostPerChildHourly))
	}
	return strings.Join(bad, "; ")
}

func (in *Input) staleAfter() time.Duration {
	if in.StaleAfter > 0 {
		return in.StaleAfter
	}
	return DefaultStaleAfter
}

func (in *Input) maxStepUp() *intstr.IntOrString {
	if in.MaxStepUp != nil {
		return in.MaxStepUp
	}
	return &DefaultMaxStepUp
}

// step is the most children a scale-up adds beyond those available: MaxStepUp of
// Replicas, rounded up, at least 1.
func (in *Input) step() int32 {
	s, _ := intstr.GetScaledValueFromIntOrPercent(in.maxStepUp(), int(in.Replicas), true)
	return int32(max(s, 1))
}

// capacity is the most children the pool may have: MaxReplicas, or fewer when the budget
// allows fewer (never fewer than MinReplicas); capped says the budget set it.
func (in *Input) capacity() (n int32, capped bool) {
	b := in.Budget
	if b == nil || b.CostPerChildHourly <= 0 {
		return in.MaxReplicas, false
	}
	afford := math.Floor(b.MaxHourly/b.CostPerChildHourly + 1e-9)
	if afford >= float64(in.MaxReplicas) {
		return in.MaxReplicas, false
	}
	return max(int32(afford), in.MinReplicas), true
}

func (in *Input) budgetNote(n int32) string {
	b := in.Budget
	return fmt.Sprintf("budget %g/h at %g/h per child (%d children)", b.MaxHourly, b.CostPerChildHourly, n)
}

// demand sums the newest fresh sample of each source.
func (in *Input) demand() Demand {
	newest := map[string]Sample{}
	for _, s := range in.Demand {
		if o, ok := newest[s.Source]; !ok || s.At.After(o.At) {
			newest[s.Source] = s
		}
	}
	var d Demand
	for _, s := range newest {
		if in.Now.Sub(s.At) > in.staleAfter() {
			d.Stale++
			continue
		}
		d.Sources++
		d.Sessions += max(s.Sessions, 0)
		d.Held += max(s.Held, 0)
		d.RequestsPerSecond += max(s.RequestsPerSecond, 0)
	}
	return d
}

// need is how many children carry the demand at the target: the larger of the counts
// for sessions (held requests included) and for requests per second; any demand needs
// at least one.
func (in *Input) need(d Demand) int32 {
	var n float64
	sessions := d.Sessions + float64(d.Held)
	if t := in.Target.Sessions; t > 0 {
		n = max(n, math.Ceil(sessions/t-1e-9))
	}
	if t := in.Target.RequestsPerSecond; t > 0 {
		n = max(n, math.Ceil(d.RequestsPerSecond/t-1e-9))
	}
	if n == 0 && (sessions > 0 || d.RequestsPerSecond > 0) {
		n = 1
	}
	return int32(min(n, math.MaxInt32))
}

func (t Target) String() string {
	var s []string
	if t.Sessions != 0 {
		s = append(s, fmt.Sprintf("%g sessions", t.Sessions))
	}
	if t.RequestsPerSecond != 0 {
		s = append(s, fmt.Sprintf("%g req/s", t.RequestsPerSecond))
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, " and ")
}

func latest(ts ...time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

func lastChange(s State) string {
	l := latest(s.LastScaleUp, s.LastScaleDown)
	if l.IsZero() {
		return "never"
	}
	return l.UTC().Format(time.RFC3339)
}
