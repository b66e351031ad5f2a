package pool

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// The arithmetic of a ProxyPool, kept free of the API server so that table tests cover
// it: fenceposts, which children need replacing, how many to create and delete,
// rotation deadlines and the weighted spread; the order children are deleted in is
// deletion_order.go's. The rules follow cluster-api's MachineDeployment and
// MachineSet (and so the Deployment controller's).

// resolveFenceposts turns maxSurge and maxUnavailable into counts for replicas: a
// percentage of surge rounds up, of unavailability down; when both come to 0 (a small
// percentage of few replicas), maxUnavailable becomes 1 so that a rollout can proceed.
func resolveFenceposts(maxSurge, maxUnavailable *intstr.IntOrString, replicas int32) (surge, unavailable int32, err error) {
	s, err := intstr.GetScaledValueFromIntOrPercent(intstr.ValueOrDefault(maxSurge, intstr.FromInt32(1)), int(replicas), true)
	if err != nil {
		return 0, 0, fmt.Errorf("spec.strategy.rollingUpdate.maxSurge: %w", err)
	}
	u, err := intstr.GetScaledValueFromIntOrPercent(intstr.ValueOrDefault(maxUnavailable, intstr.FromInt32(0)), int(replicas), false)
	if err != nil {
		return 0, 0, fmt.Errorf("spec.strategy.rollingUpdate.maxUnavailable: %w", err)
	}
	if s < 0 || u < 0 {
		return 0, 0, fmt.Errorf("spec.strategy.rollingUpdate: maxSurge %d and maxUnavailable %d must not be negative", s, u)
	}
	if s == 0 && u == 0 {
		u = 1
	}
	return int32(s), int32(u), nil
}

// poolChild is what the plan needs to know of one child Proxy.
type poolChild struct {
	name     string
	created  time.Time
	deleting bool // has a deletion timestamp: on its way out, still counted in the total
	upToDate bool // made from the current template (and placed on a current spread entry)
	cordoned bool
	// remediate: remediation handed the child over for a replacement
	// (common.RemediationReplaceAnnotation); replaced like a cordoned child, surge-first.
	remediate bool
	failed    bool // phase Failed
	// stuck: never Ready, progressDeadlineSeconds after its birth (and not Failed).
	stuck bool
	// outdated: the child says its configuration is outdated (ConfigOutdated=True: the
	// operator's rendering changed since its instance was built).
	outdated bool
	ready    bool // phase Ready: the health engine proxied a request through it
	// available: ready for at least minReadySeconds and not cordoned.
	available bool
	expired   bool // past its rotation deadline
}

// good: a child the pool keeps as it is.
func (c *poolChild) good() bool {
	return !c.deleting && c.upToDate && !c.outdated && !c.cordoned && !c.remediate && !c.broken() && !c.expired
}

// broken: Failed, or stuck without ever becoming Ready. The pool replaces such a child
// but, when it is made from the current template and the pool needs its place, only once
// a successor is available: a broken image stalls the pool rather than churning.
func (c *poolChild) broken() bool { return c.failed || c.stuck }

// plan is what one reconcile does to the children.
type plan struct {
	create int
	delete []string
	// stalled: replacements are due but none can be made now, and none is under way.
	stalled bool
}

// planPool decides how many children to create and which to delete, given the resolved
// replicas, maxSurge and maxUnavailable. The rules, after cluster-api:
//   - at most replicas + maxSurge children exist at once (those being deleted count);
//   - a child that needs replacing (cordoned, handed over by remediation, Failed, past its deadline, or made from an
//     older template) is deleted only while the children still available stay at least
//     replicas - maxUnavailable, and, when the good children are not all available yet,
//     only as far as the unavailable newcomers leave room (MachineDeployment's
//     maxScaledDown), so that a replacement is made and becomes available first;
//   - an up-to-date Failed child that the pool still needs is deleted only once a good
//     child made after it is available: a broken image or a ban storm stalls the pool
//     rather than churning through instances, and at most maxSurge replacements are
//     under way at a time;
//   - children beyond replicas that need no replacing are deleted at once (a scale
//     down), in deletion order.
func planPool(children []poolChild, replicas, surge, unavailable int32, order v1alpha1.PoolDeletionOrder, seed string) plan {
	t := tallyChildren(children)
	r := int(replicas)
	var p plan
	p.delete = t.dropExcess(r, order, seed)
	// Replacements and new children, up to the surge bound.
	p.create = max(0, min(r-len(t.good), r+int(surge)-(t.total-len(p.delete))))
	replaced := t.replaceStale(r, int(unavailable), order, seed)
	p.delete = append(p.delete, replaced...)
	p.stalled = p.create == 0 && len(replaced) == 0 && len(t.stale) > 0 && t.goodUnavailable == 0 && !anyDeleting(children)
	return p
}

// tally is the children sorted into those the pool keeps (good) and those it replaces
// (stale), with the counts the bounds are checked against.
type tally struct {
	good, stale []*poolChild
	// total counts every child, live those not being deleted, available the available
	// ones, goodUnavailable the good ones not yet available.
	total, live, available, goodUnavailable int
}

func tallyChildren(children []poolChild) *tally {
	t := &tally{}
	for i := range children {
		c := &children[i]
		t.total++
		if c.deleting {
			continue
		}
		t.live++
		if c.available {
			t.available++
		}
		switch {
		case !c.good():
			t.stale = append(t.stale, c)
		case c.available:
			t.good = append(t.good, c)
		default:
			t.good = append(t.good, c)
			t.goodUnavailable++
		}
	}
	return t
}

// dropExcess is a scale down: the good children beyond r go at once, most deletable
// first, whatever their availability.
func (t *tally) dropExcess(r int, order v1alpha1.PoolDeletionOrder, seed string) []string {
	excess := len(t.good) - r
	if excess <= 0 {
		return nil
	}
	sortForDeletion(t.good, order, seed)
	var out []string
	for _, c := range t.good[:excess] {
		out = append(out, c.name)
		if c.available {
			t.available--
		} else {
			t.goodUnavailable--
		}
		t.live--
	}
	t.good = t.good[excess:]
	return out
}

// replaceStale deletes the stale children the bounds allow, most deletable first.
func (t *tally) replaceStale(r, unavailable int, order v1alpha1.PoolDeletionOrder, seed string) []string {
	minAvailable := r - unavailable
	maxScaledDown := t.live - minAvailable - t.goodUnavailable
	sortForDeletion(t.stale, order, seed)
	claimed := map[string]bool{}
	var out []string
	for _, c := range t.stale {
		if len(out) >= maxScaledDown {
			break
		}
		if c.broken() && c.upToDate && !c.outdated && len(t.good) < r && !claimSuccessor(c, t.good, claimed) {
			continue
		}
		if c.available {
			if t.available-1 < minAvailable {
				continue
			}
			t.available--
		}
		out = append(out, c.name)
	}
	return out
}

// claimSuccessor finds an available good child made no earlier than c and not yet
// claimed by another deletion, and claims it.
func claimSuccessor(c *poolChild, good []*poolChild, claimed map[string]bool) bool {
	for _, g := range good {
		if g.available && !claimed[g.name] && !g.created.Before(c.created) {
			claimed[g.name] = true
			return true
		}
	}
	return false
}

func anyDeleting(children []poolChild) bool {
	for i := range children {
		if children[i].deleting {
			return true
		}
	}
	return false
}

// unitHash maps s onto [0, 1), the same way on every run and every replica.
func unitHash(s string) float64 {
	sum := sha256.Sum256([]byte(s))
	return float64(binary.BigEndian.Uint64(sum[:8])>>11) / float64(1<<53)
}

// parseJitter reads a rotation jitter such as "25%" as a fraction; "" is 0.
func parseJitter(s string) (float64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(strings.TrimSuffix(s, "%"))
	if err != nil || !strings.HasSuffix(s, "%") || n < 0 || n > 100 {
		return 0, fmt.Errorf("spec.rotation.jitter %q: want a percentage from 0%% to 100%%", s)
	}
	return float64(n) / 100, nil
}

// rotationDeadline is when a child made at created must be replaced: maxAge after
// created, brought forward by the child's own share (from a hash of its UID, so it is the
// same after a restart) of jitter × maxAge. The deadline never exceeds maxAge.
func rotationDeadline(created time.Time, uid string, maxAge time.Duration, jitter float64) time.Time {
	cut := time.Duration(float64(maxAge) * jitter * unitHash(uid))
	return created.Add(maxAge - cut)
}

// pickSpread chooses the entry the next child goes to: the one that, with one more
// child, stays furthest below its weighted share (count+1)/weight, earlier entries
// winning ties. From nothing, weights 1 and 2 give entries 1, 0, 1, 1, 0, 1, …
// Entries with usable false are skipped; it returns -1 when none is usable.
func pickSpread(counts []int, weights []int32, usable []bool) int {
	best := -1
	for i := range counts {
		if !usable[i] || weights[i] <= 0 {
			continue
		}
		// Compare (counts[i]+1)/weights[i] < (counts[best]+1)/weights[best] without division.
		if best < 0 || int64(counts[i]+1)*int64(weights[best]) < int64(counts[best]+1)*int64(weights[i]) {
			best = i
		}
	}
	return best
}
