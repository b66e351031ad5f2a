package bans

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

func mark(at time.Time, n int32) *v1alpha1.ProxyUnreachable {
	return &v1alpha1.ProxyUnreachable{ReportedAt: metav1.NewMicroTime(at), Reports: n}
}

func answer(reported, probed time.Time, passed bool) *v1alpha1.ProxyUnreachableProbe {
	return &v1alpha1.ProxyUnreachableProbe{ReportedAt: metav1.NewMicroTime(reported), ProbedAt: metav1.NewTime(probed), Passed: passed}
}

// A report opens a mark, later ones count on it until a probe answers it; after a
// passing answer reports are ignored for the holdoff, after a failing one they open a new
// mark at once.
func TestUnreachableAfter(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
	holdoff := time.Minute
	for _, tc := range []struct {
		name       string
		st         v1alpha1.ProxyStatus
		at         time.Time
		n          int32
		want       *v1alpha1.ProxyUnreachable
		result     string
		wantOpened bool
	}{
		{name: "first report", at: t0, n: 2, want: mark(t0.Truncate(time.Microsecond), 2), result: UnreachableMarked, wantOpened: true},
		{name: "open mark counts", st: v1alpha1.ProxyStatus{Unreachable: mark(t0, 2)}, at: t0.Add(time.Second), n: 1,
			want: mark(t0, 3), result: UnreachableCounted, wantOpened: true},
		{name: "within the holdoff after a pass", st: v1alpha1.ProxyStatus{Unreachable: mark(t0, 1), UnreachableProbe: answer(t0, t0.Add(time.Second), true)},
			at: t0.Add(30 * time.Second), n: 5, want: mark(t0, 1), result: UnreachableIgnored},
		{name: "past the holdoff after a pass", st: v1alpha1.ProxyStatus{Unreachable: mark(t0, 1), UnreachableProbe: answer(t0, t0.Add(time.Second), true)},
			at: t0.Add(time.Second + holdoff), n: 1, want: mark(t0.Add(time.Second+holdoff).Truncate(time.Microsecond), 1), result: UnreachableMarked, wantOpened: true},
		{name: "after a failed probe", st: v1alpha1.ProxyStatus{Unreachable: mark(t0, 1), UnreachableProbe: answer(t0, t0.Add(time.Second), false)},
			at: t0.Add(2 * time.Second), n: 1, want: mark(t0.Add(2*time.Second).Truncate(time.Microsecond), 1), result: UnreachableMarked, wantOpened: true},
		{name: "a replica's clock behind the answered report", st: v1alpha1.ProxyStatus{Unreachable: mark(t0, 1), UnreachableProbe: answer(t0, t0, false)},
			at: t0.Add(-time.Second), n: 1, want: mark(t0.Add(time.Microsecond), 1), result: UnreachableMarked, wantOpened: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.st.DeepCopy()
			got, res := UnreachableAfter(&tc.st, tc.at, tc.n, holdoff)
			if res != tc.result || !got.ReportedAt.Equal(&tc.want.ReportedAt) || got.Reports != tc.want.Reports {
				t.Errorf("got %v %d reports, %s; want %v %d reports, %s", got.ReportedAt, got.Reports, res, tc.want.ReportedAt, tc.want.Reports, tc.result)
			}
			if tc.st.Unreachable != nil && tc.st.Unreachable.Reports != before.Unreachable.Reports {
				t.Error("UnreachableAfter modified the status it was given")
			}
			st := tc.st
			st.Unreachable = got
			if UnreachableOpen(&st) != tc.wantOpened {
				t.Errorf("open after the report: %v, want %v", UnreachableOpen(&st), tc.wantOpened)
			}
		})
	}
}

// The recorder folds unreachable reports into one write of status.unreachable under
// proxy-feedback, keeps it through later cooldown writes, and, once a passing probe has
// answered it, ignores further reports for the holdoff (counted, nothing written).
func TestRecorderWritesUnreachable(t *testing.T) {
	ctx, c, key, clk, r := recorderOnAProxy(t)
	r.UnreachableHoldoff = time.Minute
	marked := testutil.ToFloat64(unreachableReports.WithLabelValues(UnreachableMarked))
	counted := testutil.ToFloat64(unreachableReports.WithLabelValues(UnreachableCounted))
	ignored := testutil.ToFloat64(unreachableReports.WithLabelValues(UnreachableIgnored))

	for range 3 {
		r.Add(key, Report{Outcome: Unreachable})
	}
	r.Add(key, Report{Site: "a.com", Outcome: Banned})
	r.Flush(ctx)
	if w := r.Writes(); w != 1 {
		t.Fatalf("four reports made %d writes, want 1", w)
	}
	got := get(t, ctx, c, key)
	u := got.Status.Unreachable
	if u == nil || u.Reports != 3 || !u.ReportedAt.Time.Equal(clk.Now()) || len(got.Status.Cooldowns) != 1 {
		t.Fatalf("status %+v, want an unreachable mark of 3 reports at %s and a cooldown", got.Status, clk.Now())
	}
	if !UnreachableOpen(&got.Status) {
		t.Error("the mark is not open")
	}
	if fb := testenv.StatusManagers(got)[FieldManager]; !strings.Contains(fb, `"f:unreachable"`) {
		t.Errorf("%s owns %s, want status.unreachable too", FieldManager, fb)
	}
	if d := testutil.ToFloat64(unreachableReports.WithLabelValues(UnreachableMarked)) - marked; d != 1 {
		t.Errorf("marked +%v, want +1", d)
	}
	if d := testutil.ToFloat64(unreachableReports.WithLabelValues(UnreachableCounted)) - counted; d != 2 {
		t.Errorf("counted +%v, want +2", d)
	}

	// A cooldown alone keeps the mark.
	clk.Step(DefaultWriteInterval)
	r.Add(key, Report{Site: "b.com", Outcome: Banned})
	r.Flush(ctx)
	if got = get(t, ctx, c, key); got.Status.Unreachable == nil || got.Status.Unreachable.Reports != 3 {
		t.Fatalf("after a cooldown write the mark is %+v, want it kept", got.Status.Unreachable)
	}

	// The health engine answers: the probe passed.
	base := got.DeepCopy()
	got.Status.UnreachableProbe = &v1alpha1.ProxyUnreachableProbe{ReportedAt: got.Status.Unreachable.ReportedAt,
		ProbedAt: metav1.NewTime(clk.Now()), Passed: true}
	if err := c.Status().Patch(ctx, got, client.MergeFrom(base), client.FieldOwner(statusapply.ProxyHealth)); err != nil {
		t.Fatal(err)
	}
	if got = get(t, ctx, c, key); UnreachableOpen(&got.Status) {
		t.Fatal("the mark is still open after the answer")
	}
	writes := r.Writes()
	clk.Step(DefaultWriteInterval)
	r.Add(key, Report{Outcome: Unreachable})
	r.Add(key, Report{Outcome: Unreachable})
	r.Flush(ctx)
	if w := r.Writes(); w != writes {
		t.Errorf("reports within the holdoff made a write (%d writes, want %d)", w, writes)
	}
	if got = get(t, ctx, c, key); UnreachableOpen(&got.Status) {
		t.Error("reports within the holdoff opened a mark")
	}
	if d := testutil.ToFloat64(unreachableReports.WithLabelValues(UnreachableIgnored)) - ignored; d != 2 {
		t.Errorf("ignored +%v, want +2", d)
	}

	// Past the holdoff a report opens a new mark.
	clk.Step(time.Minute)
	r.Add(key, Report{Outcome: Unreachable})
	r.Flush(ctx)
	got = get(t, ctx, c, key)
	if !UnreachableOpen(&got.Status) || got.Status.Unreachable.Reports != 1 || !got.Status.Unreachable.ReportedAt.Time.Equal(clk.Now()) {
		t.Errorf("past the holdoff: %+v, want a new open mark of 1 report at %s", got.Status.Unreachable, clk.Now())
	}
}
