package health

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
)

// seen is what a user would see after one probe outcome.
type seen struct {
	phase    v1alpha1.ProxyPhase
	healthy  bool
	cond     metav1.ConditionStatus
	failures int32
	event    string
}

func TestLayResultNoFlapping(t *testing.T) {
	px := testbuild.Proxy("", "", testbuild.WithPort(3128), testbuild.WithPhase(v1alpha1.PhaseRunning), testbuild.WithIP("192.0.2.1"))
	ok := result{latency: 12 * time.Millisecond, egressIP: "198.51.100.1"}
	bad := result{err: errors.New("probe through 192.0.2.1:3128: connection refused"), latency: time.Millisecond}
	steps := []struct {
		r    result
		want seen
	}{
		{bad, seen{v1alpha1.PhaseRunning, false, metav1.ConditionFalse, 1, ""}}, // never healthy: says why, no event
		{ok, seen{v1alpha1.PhaseReady, true, metav1.ConditionTrue, 0, v1alpha1.ReasonProbeSucceeded}},
		{ok, seen{v1alpha1.PhaseReady, true, metav1.ConditionTrue, 0, ""}},
		{bad, seen{v1alpha1.PhaseReady, true, metav1.ConditionTrue, 1, ""}}, // one lost probe: still in rotation
		{bad, seen{v1alpha1.PhaseReady, true, metav1.ConditionTrue, 2, ""}},
		{ok, seen{v1alpha1.PhaseReady, true, metav1.ConditionTrue, 0, ""}}, // recovered, counter reset
		{bad, seen{v1alpha1.PhaseReady, true, metav1.ConditionTrue, 1, ""}},
		{bad, seen{v1alpha1.PhaseReady, true, metav1.ConditionTrue, 2, ""}},
		{bad, seen{v1alpha1.PhaseRunning, false, metav1.ConditionFalse, 3, v1alpha1.ReasonProbeFailed}},
		{bad, seen{v1alpha1.PhaseRunning, false, metav1.ConditionFalse, 4, ""}},
		{ok, seen{v1alpha1.PhaseReady, true, metav1.ConditionTrue, 0, v1alpha1.ReasonProbeSucceeded}},
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, s := range steps {
		now = now.Add(30 * time.Second)
		tr := layResult(px, s.r, now, 3, "")
		c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy)
		got := seen{shown(px), px.Status.Healthy, c.Status, px.Status.ConsecutiveProbeFailures, ""}
		if tr != nil {
			got.event = tr.reason
		}
		if diff := cmp.Diff(s.want, got, cmp.AllowUnexported(seen{})); diff != "" {
			t.Fatalf("step %d (-want +got):\n%s", i, diff)
		}
		if !px.Status.LastProbeTime.Time.Equal(now) {
			t.Errorf("step %d: lastProbeTime %v", i, px.Status.LastProbeTime)
		}
	}
	if px.Status.EgressIP != "198.51.100.1" || px.Status.ProbeLatencyMilliseconds != 12 {
		t.Errorf("egress %q latency %d", px.Status.EgressIP, px.Status.ProbeLatencyMilliseconds)
	}
}

// The engine never moves a proxy out of a phase the reconciler owns.
func TestLayResultLeavesOtherPhases(t *testing.T) {
	for _, ph := range []v1alpha1.ProxyPhase{v1alpha1.PhaseProvisioning, v1alpha1.PhaseFailed, v1alpha1.PhaseDeleting} {
		px := testbuild.Proxy("", "", testbuild.WithPhase(ph))
		layResult(px, result{}, time.Now(), 3, "")
		if px.Status.Phase != ph {
			t.Errorf("%s became %s", ph, px.Status.Phase)
		}
	}
}

// TestApplyHintOnlyWhileNeverAnswered: the provider's hint (gce: the image may lack
// cloud-init) is in the Healthy message while the Proxy has not passed a probe, and not
// once it has.
func TestLayResultHintOnlyWhileNeverAnswered(t *testing.T) {
	const hint = "the image may lack cloud-init"
	px := testbuild.Proxy("", "", testbuild.WithPort(3128), testbuild.WithPhase(v1alpha1.PhaseRunning), testbuild.WithIP("192.0.2.1"))
	bad := result{err: errors.New("probe through 192.0.2.1:3128: connection refused")}
	msg := func() string {
		return meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy).Message
	}
	layResult(px, bad, time.Now(), 3, hint)
	if want := "probes failing; last: probe through 192.0.2.1:3128: connection refused; " + hint; msg() != want {
		t.Errorf("never answered: message %q, want %q", msg(), want)
	}
	layResult(px, result{latency: time.Millisecond}, time.Now(), 3, hint)
	for range 3 {
		layResult(px, bad, time.Now(), 3, hint)
	}
	if px.Status.Healthy || strings.Contains(msg(), hint) {
		t.Errorf("answered once, then failing: healthy %v, message %q; want unhealthy without the hint", px.Status.Healthy, msg())
	}
}

// TestApplyLeavesPreemptedToTheReconciler: the reconciler's Preempted condition is not the
// engine's to write: a good probe makes the successor Ready (the reconciler's readiness
// then removes the notice, TestReadiness in internal/controller/proxy), and the engine's apply
// carries no Preempted at all.
func TestLayResultLeavesPreemptedToTheReconciler(t *testing.T) {
	px := testbuild.Proxy("", "", testbuild.WithPort(3128), testbuild.WithPhase(v1alpha1.PhaseRunning), testbuild.WithIP("192.0.2.1"),
		testbuild.WithCondition(metav1.Condition{Type: v1alpha1.ConditionPreempted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonPreempted}))
	layResult(px, result{err: errors.New("connection refused")}, time.Now(), 3, "")
	if meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionPreempted) == nil {
		t.Error("a failed probe removed the Preempted condition")
	}
	layResult(px, result{latency: time.Millisecond}, time.Now(), 3, "")
	if own := healthStatusOf(&px.Status); shown(px) != v1alpha1.PhaseReady || meta.FindStatusCondition(own.Conditions, v1alpha1.ConditionPreempted) != nil {
		t.Errorf("phase shown %s, the engine's conditions %+v: want Ready, and no Preempted in the engine's apply", shown(px), own.Conditions)
	}
}
