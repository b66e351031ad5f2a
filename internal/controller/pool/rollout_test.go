package pool

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// The rollout sequences: a driver applies each step's plan (planPool, then the deletion
// order) to simulated children, which become available a few steps after their creation
// (or fail, for a broken template) and are gone two steps after their deletion (one step
// they spend deleting, as the finalizer removes the instance), and logs
// every step to a golden file under testdata/rollout/, so that a rollout reads as a
// story. At every step it checks the bounds: never more than replicas + maxSurge
// children, and, once the pool has first been whole, never fewer available than
// replicas - maxUnavailable.

// rolloutChild is one simulated child.
type rolloutChild struct {
	name     string
	template string
	born     int // the step it was created in
	deleting bool
	deleted  int // the step its deletion was asked in
	// readyIn is how many steps after its birth the child becomes available; broken,
	// that it fails then instead.
	readyIn int
	broken  bool
}

// rolloutChange is a spec change made at a step.
type rolloutChange struct {
	step     int
	replicas int32
	template string
	broken   bool // children of this template fail instead of becoming Ready
}

type rolloutSequence struct {
	name               string
	surge, unavailable intstr.IntOrString
	readyIn            int
	changes            []rolloutChange
	maxSteps           int
}

// run plays the sequence and returns its story. With shuffle, planPool sees the children
// in an order shuffle picks anew at every step (the story still lists them by creation):
// the plan must not depend on the order the API server lists children in.
func (sq rolloutSequence) run(t *testing.T, shuffle *rand.Rand) string {
	var (
		log      strings.Builder
		kids     []*rolloutChild
		replicas int32
		template string
		broken   = map[string]bool{}
		made     int
		whole    bool
		t0       = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	)
	fmt.Fprintf(&log, "# %s: maxSurge %s, maxUnavailable %s; a child is available %d steps after its creation\n",
		sq.name, sq.surge.String(), sq.unavailable.String(), sq.readyIn)
	fmt.Fprintf(&log, "# children: <name>:<template> A available, b booting, F failed, D deleting\n")
	for step := 0; step <= sq.maxSteps; step++ {
		// Deletions asked two steps ago are done.
		live := kids[:0]
		for _, k := range kids {
			if !k.deleting || step < k.deleted+2 {
				live = append(live, k)
			}
		}
		kids = live
		for _, ch := range sq.changes {
			if ch.step != step {
				continue
			}
			var what []string
			if ch.replicas != 0 && ch.replicas != replicas {
				replicas = ch.replicas
				what = append(what, fmt.Sprintf("replicas %d", replicas))
			}
			if ch.template != "" && ch.template != template {
				template = ch.template
				broken[template] = ch.broken
				w := "template " + template
				if ch.broken {
					w += " (broken: its children fail)"
				}
				what = append(what, w)
			}
			fmt.Fprintf(&log, "step %2d  spec: %s\n", step, strings.Join(what, ", "))
		}
		surge, unavail, err := resolveFenceposts(&sq.surge, &sq.unavailable, replicas)
		if err != nil {
			t.Fatalf("%s: %v", sq.name, err)
		}
		children := make([]poolChild, len(kids))
		available := 0
		for i, k := range kids {
			due := step >= k.born+k.readyIn
			children[i] = poolChild{
				name:     k.name,
				created:  t0.Add(time.Duration(k.born) * time.Minute),
				deleting: k.deleting,
				upToDate: k.template == template,
				failed:   due && k.broken,
				ready:    due && !k.broken,
			}
			children[i].available = children[i].ready && !k.deleting
			if children[i].available {
				available++
			}
		}
		seen := children
		if shuffle != nil {
			seen = append([]poolChild(nil), children...)
			shuffle.Shuffle(len(seen), func(i, j int) { seen[i], seen[j] = seen[j], seen[i] })
		}
		p := planPool(seen, replicas, surge, unavail, v1alpha1.DeletionOrderOldest, "seed")
		fmt.Fprintf(&log, "step %2d  %s  available %d/%d", step, describeRollout(kids, children), available, replicas)
		if len(p.delete) > 0 {
			fmt.Fprintf(&log, "  delete %s", strings.Join(p.delete, " "))
		}
		if p.create > 0 {
			fmt.Fprintf(&log, "  create %d", p.create)
		}
		if p.stalled {
			fmt.Fprintf(&log, "  stalled")
		}
		log.WriteString("\n")

		// The bounds: creations never take the children (those deleting included) beyond
		// replicas + maxSurge, and the available ones stay at least replicas - maxUnavailable.
		if limit := int(replicas + surge); p.create > 0 && len(kids)-len(p.delete)+p.create > limit {
			t.Errorf("%s step %d: %d children and %d created, more than replicas + maxSurge = %d", sq.name, step, len(kids), p.create, limit)
		}
		if whole && available < int(replicas-unavail) && !sq.scaledUp(step) {
			t.Errorf("%s step %d: %d available, fewer than replicas - maxUnavailable = %d", sq.name, step, available, replicas-unavail)
		}
		if available >= int(replicas) {
			whole = true
		}
		done := len(p.delete) == 0 && p.create == 0 && len(kids) == int(replicas) && available == int(replicas)
		for i := range children {
			done = done && children[i].upToDate
		}
		if done && sq.lastChange() <= step {
			fmt.Fprintf(&log, "settled after %d steps\n", step)
			return log.String()
		}

		for _, name := range p.delete {
			for _, k := range kids {
				if k.name == name {
					k.deleting, k.deleted = true, step
				}
			}
		}
		for n := 0; n < p.create; n++ {
			made++
			kids = append(kids, &rolloutChild{
				name: fmt.Sprintf("c%02d", made), template: template, born: step, readyIn: sq.readyIn, broken: broken[template],
			})
		}
	}
	fmt.Fprintf(&log, "not settled after %d steps\n", sq.maxSteps)
	return log.String()
}

// scaledUp: replicas went up at or before step since the pool was last whole, so fewer
// than the new replicas - maxUnavailable may be available while the new ones boot.
func (sq rolloutSequence) scaledUp(step int) bool {
	var prev int32
	for _, ch := range sq.changes {
		if ch.replicas == 0 {
			continue
		}
		if ch.step <= step && prev != 0 && ch.replicas > prev && step < ch.step+sq.readyIn+1 {
			return true
		}
		prev = ch.replicas
	}
	return false
}

func (sq rolloutSequence) lastChange() int {
	last := 0
	for _, ch := range sq.changes {
		last = max(last, ch.step)
	}
	return last
}

func describeRollout(kids []*rolloutChild, children []poolChild) string {
	if len(kids) == 0 {
		return "[]"
	}
	parts := make([]string, len(kids))
	for i, k := range kids {
		c := &children[i]
		state := "b"
		switch {
		case c.deleting:
			state = "D"
		case c.failed:
			state = "F"
		case c.available:
			state = "A"
		}
		parts[i] = fmt.Sprintf("%s:%s %s", k.name, k.template, state)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// rolloutSequences are the golden rollout stories.
var rolloutSequences = []rolloutSequence{
	{
		name: "3 replicas, surge 1, unavailable 0", surge: intstr.FromInt32(1), unavailable: intstr.FromInt32(0), readyIn: 2, maxSteps: 30,
		changes: []rolloutChange{{step: 0, replicas: 3, template: "v1"}, {step: 3, template: "v2"}},
	},
	{
		name: "4 replicas, surge 2, unavailable 1", surge: intstr.FromInt32(2), unavailable: intstr.FromInt32(1), readyIn: 2, maxSteps: 30,
		changes: []rolloutChange{{step: 0, replicas: 4, template: "v1"}, {step: 3, template: "v2"}},
	},
	{
		name: "scale from 3 to 5 during a rollout", surge: intstr.FromInt32(1), unavailable: intstr.FromInt32(0), readyIn: 2, maxSteps: 30,
		changes: []rolloutChange{{step: 0, replicas: 3, template: "v1"}, {step: 3, template: "v2"}, {step: 5, replicas: 5}},
	},
	{
		name: "scale from 4 to 2 during a rollout", surge: intstr.FromInt32(1), unavailable: intstr.FromInt32(0), readyIn: 2, maxSteps: 30,
		changes: []rolloutChange{{step: 0, replicas: 4, template: "v1"}, {step: 3, template: "v2"}, {step: 5, replicas: 2}},
	},
	{
		name: "a broken template, then a fixed one", surge: intstr.FromInt32(1), unavailable: intstr.FromInt32(0), readyIn: 2, maxSteps: 30,
		changes: []rolloutChange{{step: 0, replicas: 3, template: "v1"}, {step: 3, template: "v2", broken: true}, {step: 10, template: "v3"}},
	},
}

func TestRolloutSequences(t *testing.T) {
	for _, sq := range rolloutSequences {
		t.Run(sq.name, func(t *testing.T) {
			file := "rollout/" + strings.NewReplacer(" ", "-", ",", "").Replace(sq.name) + ".txt"
			testutil.Golden(t, file, sq.run(t, nil))
		})
	}
}

// TestRolloutSequencesAnyOrder plays every golden story again with the children handed
// to planPool in shuffled orders (fixed seeds, so a failure replays): the story must come
// out word for word the same.
func TestRolloutSequencesAnyOrder(t *testing.T) {
	for _, sq := range rolloutSequences {
		t.Run(sq.name, func(t *testing.T) {
			want := sq.run(t, nil)
			for _, seed := range []int64{1, 2, 3, 7, 42, 1234, 99991} {
				if got := sq.run(t, rand.New(rand.NewSource(seed))); got != want {
					t.Errorf("seed %d: the story differs from the one in creation order:\n%s\nwant:\n%s", seed, got, want)
				}
			}
		})
	}
}
