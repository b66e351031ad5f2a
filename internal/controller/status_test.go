package controller

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// layOwned redoes the reconciler's changes on a copy another writer changed meanwhile.
func TestLayOwned(t *testing.T) {
	cond := func(typ, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: metav1.ConditionFalse, Reason: reason, Message: reason}
	}
	old := v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseProvisioning, Message: "creating",
		Conditions: []metav1.Condition{cond(v1alpha1.ConditionProvisioned, v1alpha1.ReasonProvisioning)}}

	for _, tc := range []struct {
		name      string
		want      v1alpha1.ProxyStatus // what the reconciler wrote, starting from old
		fresh     v1alpha1.ProxyStatus // what the server holds now
		wantPhase v1alpha1.ProxyPhase
	}{
		{
			name:      "Running does not undo Ready",
			want:      v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseRunning, IP: "10.0.0.1", Conditions: []metav1.Condition{cond(v1alpha1.ConditionProvisioned, v1alpha1.ReasonInstanceRunning)}},
			fresh:     v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, Healthy: true, Conditions: []metav1.Condition{cond(v1alpha1.ConditionHealthy, v1alpha1.ReasonProbeSucceeded)}},
			wantPhase: v1alpha1.PhaseReady,
		},
		{
			name:      "a phase the reconciler did not change stays as the other writer left it",
			want:      v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseProvisioning, Message: "still creating", Conditions: old.Conditions},
			fresh:     v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseRunning, Healthy: true, Conditions: old.Conditions},
			wantPhase: v1alpha1.PhaseRunning,
		},
		{
			name:      "Failed is written over Ready",
			want:      v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseFailed, Conditions: []metav1.Condition{cond(v1alpha1.ConditionProvisioned, v1alpha1.ReasonPermanentError)}},
			fresh:     v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, Healthy: true},
			wantPhase: v1alpha1.PhaseFailed,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := tc.fresh.DeepCopy()
			layOwned(dst, &old, &tc.want)
			if dst.Phase != tc.wantPhase {
				t.Errorf("phase %s, want %s", dst.Phase, tc.wantPhase)
			}
			if dst.Healthy != tc.fresh.Healthy || (meta.FindStatusCondition(tc.fresh.Conditions, v1alpha1.ConditionHealthy) != nil) != (meta.FindStatusCondition(dst.Conditions, v1alpha1.ConditionHealthy) != nil) {
				t.Errorf("the other writer's fields changed: %+v", dst)
			}
			wc := meta.FindStatusCondition(tc.want.Conditions, v1alpha1.ConditionProvisioned)
			if got := meta.FindStatusCondition(dst.Conditions, v1alpha1.ConditionProvisioned); wc != nil && (got == nil || got.Reason != wc.Reason) {
				t.Errorf("Provisioned %+v, want reason %s", got, wc.Reason)
			}
			if tc.want.Message != old.Message && dst.Message != tc.want.Message {
				t.Errorf("message %q, want %q", dst.Message, tc.want.Message)
			}
		})
	}
}

// The Preempted condition the reconciler set is the reconciler's to lay onto a fresh copy
// like Provisioned: a conflict on the write that records a preemption must not lose it.
func TestLayOwnedKeepsPreempted(t *testing.T) {
	old := v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, Healthy: true}
	want := v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseProvisioning, Conditions: []metav1.Condition{{
		Type: v1alpha1.ConditionPreempted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonPreempted, Message: "preempted"}}}
	fresh := v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, Healthy: true, ConsecutiveProbeFailures: 1}
	layOwned(&fresh, &old, &want)
	if c := meta.FindStatusCondition(fresh.Conditions, v1alpha1.ConditionPreempted); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("conditions %+v after laying the reconciler's changes, want Preempted=True", fresh.Conditions)
	}
	if fresh.ConsecutiveProbeFailures != 1 {
		t.Errorf("the health engine's failure count was lost: %+v", fresh)
	}
}
