package bans

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// A pool's retirement budget: however many of its children crawlers report banned on
// many sites, the pool retires at most so many of them within any hour, so that a
// stream of reports (a leaked token, a crawler bug) cannot make it replace every VM.
// The children past the budget keep serving and cool for each site, as any banned proxy.

// BudgetWindow is the span a pool's retirement budget counts over.
const BudgetWindow = time.Hour

// MaxRetirementsPerHour is the largest number a budget may be (a percentage may reach
// more in a pool of over 1,000 replicas).
const MaxRetirementsPerHour = 1000

// DefaultMaxRetirementsPerHour: a tenth of the pool, rounded up, so one child an hour
// in a pool of up to 10 replicas. A real wave of blocks burns a few addresses an hour;
// a pool losing more than a tenth of its children each hour is more likely fed false
// reports, and replacing them would cost a VM each without changing what sites think.
var DefaultMaxRetirementsPerHour = intstr.FromString("10%")

var percentRE = regexp.MustCompile(`^[0-9]{1,3}%$`)

// ParseRetirementBudget parses a budget as a flag gives it: a number from 0 to
// MaxRetirementsPerHour or a percentage such as 10%.
func ParseRetirementBudget(s string) (intstr.IntOrString, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 || n > MaxRetirementsPerHour {
			return intstr.IntOrString{}, fmt.Errorf("%d retirements per hour: give 0 to %d, or a percentage of the pool's replicas such as 10%%", n, MaxRetirementsPerHour)
		}
		return intstr.FromInt(n), nil
	}
	if !percentRE.MatchString(s) {
		return intstr.IntOrString{}, fmt.Errorf("%q retirements per hour: give a number from 0 to %d or a percentage of the pool's replicas such as 10%%", s, MaxRetirementsPerHour)
	}
	return intstr.FromString(s), nil
}

// RetirementBudget is how many children a pool of replicas may retire within
// BudgetWindow: budget as a number, or as a percentage of replicas rounded up (10% of 3
// is 1, of 0 is 0).
func RetirementBudget(budget intstr.IntOrString, replicas int) (int, error) {
	n, err := intstr.GetScaledValueFromIntOrPercent(&budget, replicas, true)
	if err != nil {
		return 0, err
	}
	return max(n, 0), nil
}

// Retirement is one retirement a pool's budget counts.
type Retirement struct {
	Proxy string
	At    time.Time
}

// RetirementPlan is what a pool's budget lets happen now.
type RetirementPlan struct {
	// Retire are the children to retire now, in the order they were given.
	Retire []string
	// HeldBack are the children due that the budget holds back, in that order.
	HeldBack []string
	// Recent are the retirements within BudgetWindow, those of Retire included, oldest
	// first: what the pool records.
	Recent []Retirement
	// NextFree is when the oldest of Recent leaves the window, while the budget is
	// spent and some children wait for it; zero otherwise (a budget of 0 never frees).
	NextFree time.Time
}

// PlanRetirements decides which of the due children (most deserving first) a pool
// retires at now, given the retirements it recorded (recent) and its budget per
// BudgetWindow. Retirements older than the window no longer count. A due child already
// in recent took its share of the budget when it was recorded (its retirement was cut
// short, by a restart or a refused write): it is retired again without taking more.
func PlanRetirements(due []string, recent []Retirement, budget int, now time.Time) RetirementPlan {
	from := now.Add(-BudgetWindow)
	var p RetirementPlan
	for _, r := range recent {
		if r.At.After(from) {
			p.Recent = append(p.Recent, r)
		}
	}
	slices.SortStableFunc(p.Recent, func(a, b Retirement) int { return a.At.Compare(b.At) })
	for _, name := range due {
		switch {
		case slices.ContainsFunc(p.Recent, func(r Retirement) bool { return r.Proxy == name }):
			p.Retire = append(p.Retire, name)
		case len(p.Recent) < budget:
			p.Retire = append(p.Retire, name)
			p.Recent = append(p.Recent, Retirement{Proxy: name, At: now})
		default:
			p.HeldBack = append(p.HeldBack, name)
		}
	}
	if len(p.HeldBack) > 0 && budget > 0 {
		p.NextFree = p.Recent[0].At.Add(BudgetWindow)
	}
	return p
}
