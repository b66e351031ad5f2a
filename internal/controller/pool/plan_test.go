package pool

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// The pool's arithmetic, without an API server.

func TestResolveFenceposts(t *testing.T) {
	i := func(n int32) *intstr.IntOrString { v := intstr.FromInt32(n); return &v }
	p := func(s string) *intstr.IntOrString { v := intstr.FromString(s); return &v }
	for _, tc := range []struct {
		surge, unavail      *intstr.IntOrString
		replicas            int32
		wantSurge, wantUnav int32
	}{
		{nil, nil, 6, 1, 0}, // the defaults
		{i(1), i(0), 6, 1, 0},
		{i(3), i(1), 6, 3, 1},
		{p("25%"), p("25%"), 6, 2, 1},  // 1.5: surge rounds up, unavailability down
		{p("1%"), p("0%"), 2, 1, 0},    // a tiny surge still rounds up to 1
		{p("0%"), p("1%"), 2, 0, 1},    // both resolve to 0: unavailability becomes 1
		{p("0%"), p("25%"), 3, 0, 1},   // 0.75 rounds down to 0, then becomes 1
		{p("100%"), p("0%"), 4, 4, 0},  // surge the whole pool
		{i(0), i(2), 0, 0, 2},          // an empty pool keeps its numbers
		{p("50%"), p("50%"), 0, 0, 1},  // percentages of nothing
		{i(10), i(0), 6, 10, 0},        // more surge than replicas is allowed
		{p("200%"), p("0%"), 3, 6, 0},  // so is a percentage over 100
		{i(0), p("100%"), 3, 0, 3},     // and all unavailable
		{p("33%"), p("33%"), 10, 4, 3}, // 3.3
	} {
		t.Run(fmt.Sprintf("%v/%v/%d", tc.surge, tc.unavail, tc.replicas), func(t *testing.T) {
			s, u, err := resolveFenceposts(tc.surge, tc.unavail, tc.replicas)
			if err != nil || s != tc.wantSurge || u != tc.wantUnav {
				t.Fatalf("= %d, %d, %v; want %d, %d", s, u, err, tc.wantSurge, tc.wantUnav)
			}
		})
	}
	if _, _, err := resolveFenceposts(p("lots"), nil, 3); err == nil {
		t.Error("a malformed percentage was accepted")
	}
}

var t0 = time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)

// kid builds a poolChild: name, minutes after t0 it was made, and flags from a string:
// g good and available, r ready only, o outdated, c cordoned, f failed, x expired,
// d deleting, p pending (not ready).
func kid(name string, minute int, flags string) poolChild {
	c := poolChild{name: name, created: t0.Add(time.Duration(minute) * time.Minute), upToDate: true}
	for _, f := range flags {
		switch f {
		case 'g':
			c.ready, c.available = true, true
		case 'r':
			c.ready = true
		case 'o':
			c.upToDate = false
		case 'c':
			c.cordoned = true
		case 'f':
			c.failed = true
		case 'x':
			c.expired = true
		case 'd':
			c.deleting = true
		case 'p':
		}
	}
	if c.cordoned || c.deleting {
		c.available = false
	}
	return c
}

func TestPlanPool(t *testing.T) {
	for _, tc := range []struct {
		name           string
		kids           []poolChild
		replicas       int32
		surge, unavail int32
		order          v1alpha1.PoolDeletionOrder
		wantCreate     int
		wantDelete     []string
		wantStalled    bool
	}{
		{name: "scale up from nothing: every child at once", replicas: 3, surge: 1, wantCreate: 3},
		{name: "steady", kids: []poolChild{kid("a", 0, "g"), kid("b", 1, "g")}, replicas: 2, surge: 1},
		{name: "scale down oldest first", replicas: 1, surge: 1, order: v1alpha1.DeletionOrderOldest,
			kids:       []poolChild{kid("b", 2, "g"), kid("a", 1, "g"), kid("c", 3, "g")},
			wantDelete: []string{"a", "b"}},
		{name: "scale down newest first", replicas: 1, surge: 1, order: v1alpha1.DeletionOrderNewest,
			kids:       []poolChild{kid("b", 2, "g"), kid("a", 1, "g"), kid("c", 3, "g")},
			wantDelete: []string{"c", "b"}},
		{name: "scale down takes the unready before the order", replicas: 2, surge: 1, order: v1alpha1.DeletionOrderOldest,
			kids:       []poolChild{kid("a", 1, "g"), kid("b", 2, "g"), kid("c", 3, "p")},
			wantDelete: []string{"c"}},
		{name: "scale down ignores availability", replicas: 0, surge: 1,
			kids:       []poolChild{kid("a", 1, "g"), kid("b", 2, "g")},
			wantDelete: []string{"a", "b"}},
		{name: "rollout surges first", replicas: 3, surge: 1,
			kids:       []poolChild{kid("a", 0, "go"), kid("b", 1, "go"), kid("c", 2, "go")},
			wantCreate: 1},
		{name: "rollout waits for the new child", replicas: 3, surge: 1,
			kids: []poolChild{kid("a", 0, "go"), kid("b", 1, "go"), kid("c", 2, "go"), kid("n1", 5, "r")}},
		{name: "rollout deletes one old once the new is available", replicas: 3, surge: 1,
			kids:       []poolChild{kid("a", 0, "go"), kid("b", 1, "go"), kid("c", 2, "go"), kid("n1", 5, "g")},
			wantDelete: []string{"a"}},
		{name: "a deleting child still counts against the surge", replicas: 3, surge: 1,
			kids: []poolChild{kid("a", 0, "god"), kid("b", 1, "go"), kid("c", 2, "go"), kid("n1", 5, "g")}},
		{name: "maxUnavailable lets old go before new exist", replicas: 3, surge: 0, unavail: 1,
			kids:       []poolChild{kid("a", 0, "go"), kid("b", 1, "go"), kid("c", 2, "go")},
			wantDelete: []string{"a"}},
		{name: "then creates into the room", replicas: 3, surge: 0, unavail: 1,
			kids:       []poolChild{kid("a", 0, "god"), kid("b", 1, "go"), kid("c", 2, "go")},
			wantCreate: 0},
		{name: "after the deletion finished", replicas: 3, surge: 0, unavail: 1,
			kids:       []poolChild{kid("b", 1, "go"), kid("c", 2, "go")},
			wantCreate: 1},
		{name: "big surge and unavailability", replicas: 6, surge: 3, unavail: 1,
			kids: []poolChild{kid("a", 0, "go"), kid("b", 1, "go"), kid("c", 2, "go"), kid("d", 3, "go"),
				kid("e", 4, "go"), kid("f", 5, "go")},
			wantCreate: 3, wantDelete: []string{"a"}},
		{name: "old unready children go without waiting", replicas: 2, surge: 1,
			kids:       []poolChild{kid("a", 0, "go"), kid("b", 1, "po"), kid("n", 5, "g"), kid("m", 6, "g")},
			wantDelete: []string{"b", "a"}},
		{name: "cordoned first, and only after its successor is available", replicas: 2, surge: 1,
			kids:       []poolChild{kid("a", 0, "g"), kid("b", 1, "gc")},
			wantCreate: 1},
		{name: "cordoned replaced", replicas: 2, surge: 1,
			kids:       []poolChild{kid("a", 0, "g"), kid("b", 1, "gc"), kid("n", 5, "g")},
			wantDelete: []string{"b"}},
		{name: "failed replaced surge-first", replicas: 3, surge: 1,
			kids:       []poolChild{kid("a", 0, "g"), kid("b", 1, "f"), kid("c", 2, "g")},
			wantCreate: 1},
		{name: "failed kept while its successor is not available", replicas: 3, surge: 1,
			kids: []poolChild{kid("a", 0, "g"), kid("b", 1, "f"), kid("c", 2, "g"), kid("n", 5, "r")}},
		{name: "failed deleted once its successor is available", replicas: 3, surge: 1,
			kids:       []poolChild{kid("a", 0, "g"), kid("b", 1, "f"), kid("c", 2, "g"), kid("n", 5, "g")},
			wantDelete: []string{"b"}},
		{name: "an older good child is no successor: no churn through a bad zone", replicas: 3, surge: 1, unavail: 1,
			kids:        []poolChild{kid("a", 0, "g"), kid("b", 1, "g"), kid("n", 5, "f"), kid("m", 6, "f")},
			wantStalled: true},
		{name: "a surplus failed child goes at once", replicas: 2, surge: 1,
			kids:       []poolChild{kid("a", 0, "g"), kid("b", 1, "g"), kid("n", 5, "f")},
			wantDelete: []string{"n"}},
		{name: "storm: many failed, one replacement at a time", replicas: 6, surge: 1,
			kids: []poolChild{kid("a", 0, "f"), kid("b", 1, "f"), kid("c", 2, "f"), kid("d", 3, "f"),
				kid("e", 4, "g"), kid("f", 5, "g")},
			wantCreate: 1},
		{name: "storm: one successor frees one failed child", replicas: 6, surge: 1,
			kids: []poolChild{kid("a", 0, "f"), kid("b", 1, "f"), kid("c", 2, "f"), kid("d", 3, "f"),
				kid("e", 4, "g"), kid("f", 5, "g"), kid("n", 9, "g")},
			wantDelete: []string{"a"}},
		{name: "broken image: the rollout stalls instead of churning", replicas: 3, surge: 1,
			kids:        []poolChild{kid("a", 0, "go"), kid("b", 1, "go"), kid("c", 2, "go"), kid("n", 5, "f")},
			wantStalled: true},
		{name: "expired replaced surge-first", replicas: 2, surge: 1,
			kids:       []poolChild{kid("a", 0, "gx"), kid("b", 1, "g")},
			wantCreate: 1},
		{name: "expired kept until its successor is available", replicas: 2, surge: 1,
			kids: []poolChild{kid("a", 0, "gx"), kid("b", 1, "g"), kid("n", 5, "r")}},
		{name: "expired deleted after", replicas: 2, surge: 1,
			kids:       []poolChild{kid("a", 0, "gx"), kid("b", 1, "g"), kid("n", 5, "g")},
			wantDelete: []string{"a"}},
		{name: "two expired together: one at a time", replicas: 2, surge: 1,
			kids:       []poolChild{kid("a", 0, "gx"), kid("b", 1, "gx"), kid("n", 5, "g")},
			wantDelete: []string{"a"}},
		{name: "rotation never goes below replicas - maxUnavailable", replicas: 2, surge: 1,
			kids: []poolChild{kid("a", 0, "gx"), kid("b", 1, "p"), kid("n", 5, "g")}},
		{name: "scale down with a cordoned child keeps the good ones", replicas: 2, surge: 1,
			kids:       []poolChild{kid("a", 0, "g"), kid("b", 1, "g"), kid("c", 2, "gc")},
			wantDelete: []string{"c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			order := tc.order
			if order == "" {
				order = v1alpha1.DeletionOrderOldest
			}
			p := planPool(tc.kids, tc.replicas, tc.surge, tc.unavail, order, "seed")
			want := plan{create: tc.wantCreate, delete: tc.wantDelete, stalled: tc.wantStalled}
			if diff := cmp.Diff(want, p, cmp.AllowUnexported(plan{}), cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// Whatever the children, a plan never takes the pool past replicas + maxSurge nor (when
// it was not already) below replicas - maxUnavailable available.
func TestPlanPoolBounds(t *testing.T) {
	flags := []string{"g", "r", "p", "go", "ro", "gc", "f", "gx", "god", "fo"}
	for seed := 0; seed < 4000; seed++ {
		n := seed % 7
		var kids []poolChild
		x := seed
		for i := 0; i < n; i++ {
			kids = append(kids, kid(fmt.Sprintf("k%d", i), i, flags[x%len(flags)]))
			x /= 3
			x += i * 7
		}
		replicas := int32(seed % 5)
		surge, unavail := int32(seed/5%3), int32(seed/15%3)
		if surge == 0 && unavail == 0 {
			unavail = 1
		}
		p := planPool(kids, replicas, surge, unavail, v1alpha1.DeletionOrderOldest, "s")
		total, availBefore, availAfter := 0, 0, 0
		for _, k := range kids {
			total++
			if k.available {
				availBefore++
				if !slices.Contains(p.delete, k.name) {
					availAfter++
				}
			}
		}
		excessGood := 0
		for _, k := range kids {
			if k.good() {
				excessGood++
			}
		}
		excessGood = max(0, excessGood-int(replicas))
		if p.create > 0 && total-len(p.delete)+p.create > int(replicas+surge) {
			t.Fatalf("%v (r=%d s=%d u=%d): %d children after the plan %+v, bound %d", kids, replicas, surge, unavail,
				total-len(p.delete)+p.create, p, replicas+surge)
		}
		floor := min(availBefore, int(replicas-unavail))
		if excessGood == 0 && availAfter < floor {
			t.Fatalf("%v (r=%d s=%d u=%d): %d available after the plan %+v, floor %d", kids, replicas, surge, unavail, availAfter, p, floor)
		}
	}
}

func TestRotationDeadline(t *testing.T) {
	maxAge := 6 * time.Hour
	if d := rotationDeadline(t0, "uid-1", maxAge, 0); !d.Equal(t0.Add(maxAge)) {
		t.Errorf("no jitter: deadline %v, want %v", d, t0.Add(maxAge))
	}
	seen := map[time.Time]bool{}
	for i := 0; i < 200; i++ {
		uid := fmt.Sprintf("3f1c9e2a-%04d", i)
		d := rotationDeadline(t0, uid, maxAge, 0.25)
		if d.After(t0.Add(maxAge)) || d.Before(t0.Add(maxAge*3/4)) {
			t.Fatalf("uid %s: deadline %v outside [%v, %v]", uid, d, t0.Add(maxAge*3/4), t0.Add(maxAge))
		}
		if again := rotationDeadline(t0, uid, maxAge, 0.25); !again.Equal(d) {
			t.Fatalf("uid %s: deadline %v then %v: not deterministic", uid, d, again)
		}
		seen[d] = true
	}
	if len(seen) < 190 {
		t.Errorf("200 children share %d deadlines: they would expire together", len(seen))
	}
}

func TestParseJitter(t *testing.T) {
	for in, want := range map[string]float64{"": 0, "0%": 0, "25%": 0.25, "100%": 1} {
		if got, err := parseJitter(in); err != nil || got != want {
			t.Errorf("parseJitter(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"25", "101%", "-1%", "x%"} {
		if _, err := parseJitter(in); err == nil {
			t.Errorf("parseJitter(%q) accepted", in)
		}
	}
}

func TestPickSpreadRoundRobinByWeight(t *testing.T) {
	for _, tc := range []struct {
		weights []int32
		usable  []bool
		n       int
		want    []int
	}{
		{[]int32{1}, []bool{true}, 3, []int{0, 0, 0}},
		{[]int32{1, 1, 1}, []bool{true, true, true}, 6, []int{0, 1, 2, 0, 1, 2}},
		{[]int32{1, 2}, []bool{true, true}, 6, []int{1, 0, 1, 1, 0, 1}},
		{[]int32{3, 1}, []bool{true, true}, 8, []int{0, 0, 0, 1, 0, 0, 0, 1}},
		{[]int32{1, 2, 1}, []bool{true, false, true}, 4, []int{0, 2, 0, 2}},
		{[]int32{1}, []bool{false}, 1, []int{-1}},
	} {
		counts := make([]int, len(tc.weights))
		var got []int
		for i := 0; i < tc.n; i++ {
			e := pickSpread(counts, tc.weights, tc.usable)
			got = append(got, e)
			if e >= 0 {
				counts[e]++
			}
		}
		if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("weights %v usable %v: picks (-want +got):\n%s", tc.weights, tc.usable, diff)
		}
	}
	// From an uneven start, new children go where the share is short.
	if e := pickSpread([]int{4, 0}, []int32{1, 1}, []bool{true, true}); e != 1 {
		t.Errorf("counts 4,0: picked %d, want 1", e)
	}
}

// The pool is requeued at the earliest moment something will change by time alone: a
// Ready child reaching minReadySeconds, or a child's rotation deadline.
func TestNextDeadline(t *testing.T) {
	now := t0.Add(time.Hour)
	readyAt := func(name string, born, ready time.Time) *v1alpha1.Proxy {
		px := &v1alpha1.Proxy{}
		px.Name, px.UID = name, types.UID("uid-"+name)
		px.Annotations = map[string]string{v1alpha1.BornAnnotation: born.Format(time.RFC3339Nano)}
		px.Status.Phase, px.Status.Healthy = v1alpha1.PhaseReady, true
		px.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, LastTransitionTime: metav1.NewTime(ready)}}
		return px
	}
	scope := func(minReady int32, maxAge time.Duration, kids ...*v1alpha1.Proxy) *poolScope {
		s := &poolScope{now: now, maxAge: maxAge, pool: &v1alpha1.ProxyPool{}}
		s.pool.Spec.MinReadySeconds = minReady
		for _, k := range kids {
			s.children = append(s.children, scopedChild{k, s.classify(k)})
		}
		return s
	}
	for _, tc := range []struct {
		name string
		s    *poolScope
		want time.Duration // 0: none
	}{
		{"nothing pending", scope(0, 0, readyAt("a", t0, t0)), 0},
		{"a child becoming available", scope(30, 0, readyAt("a", t0, now.Add(-10*time.Second))), 20 * time.Second},
		{"already available", scope(30, 0, readyAt("a", t0, now.Add(-time.Minute))), 0},
		{"the earlier of availability and a deadline", scope(30, 2*time.Hour,
			readyAt("a", t0, now.Add(-time.Minute)), readyAt("b", now.Add(-time.Hour), now.Add(-5*time.Second))), 25 * time.Second},
		{"a rotation deadline", scope(0, 90*time.Minute, readyAt("a", t0, t0)), 30 * time.Minute},
		{"past its deadline: nothing to wait for", scope(0, 30*time.Minute, readyAt("a", t0, t0)), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, ok := tc.s.nextDeadline()
			if ok != (tc.want != 0) || d != tc.want {
				t.Fatalf("nextDeadline = %v, %v; want %v", d, ok, tc.want)
			}
		})
	}
}
