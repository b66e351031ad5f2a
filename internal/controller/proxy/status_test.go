package proxy

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// The reconciler settles Running against Ready from the health engine's condition before
// each write, and writes any other phase over Ready.
func TestReadiness(t *testing.T) {
	cond := func(typ, reason string, st metav1.ConditionStatus) metav1.Condition {
		return metav1.Condition{Type: typ, Status: st, Reason: reason, Message: reason}
	}
	probed := func(healthy bool) v1alpha1.ProxyStatus {
		st := v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, ProviderID: "fake://a", IP: "10.0.0.1",
			Healthy: healthy, ProbeTarget: "fake://a 10.0.0.1:3128"}
		c := cond(v1alpha1.ConditionHealthy, v1alpha1.ReasonProbeSucceeded, metav1.ConditionTrue)
		if !healthy {
			c = cond(v1alpha1.ConditionHealthy, v1alpha1.ReasonProbeFailed, metav1.ConditionFalse)
		}
		st.Conditions = []metav1.Condition{c, cond(v1alpha1.ConditionPreempted, v1alpha1.ReasonPreempted, metav1.ConditionTrue)}
		return st
	}
	for _, tc := range []struct {
		name      string
		status    v1alpha1.ProxyStatus
		set       v1alpha1.ProxyPhase
		wantPhase v1alpha1.ProxyPhase
	}{
		{"Running does not undo Ready", probed(true), v1alpha1.PhaseRunning, v1alpha1.PhaseReady},
		{"Ready goes back to Running when the probes fail", probed(false), v1alpha1.PhaseRunning, v1alpha1.PhaseRunning},
		{"a probe of another instance is no reason for Ready", func() v1alpha1.ProxyStatus {
			st := probed(true)
			st.ProviderID = "fake://b"
			return st
		}(), v1alpha1.PhaseRunning, v1alpha1.PhaseRunning},
		{"Failed is written over Ready", probed(true), v1alpha1.PhaseFailed, v1alpha1.PhaseFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			px := managedProxy("ready")
			px.Status = tc.status
			s := (&ProxyReconciler{}).newScope(context.Background(), px)
			s.setPhase(tc.set, "Test", "set by the test")
			s.readiness()
			if px.Status.Phase != tc.wantPhase {
				t.Errorf("phase %s, want %s", px.Status.Phase, tc.wantPhase)
			}
			preempted := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionPreempted) != nil
			if preempted == (tc.wantPhase == v1alpha1.PhaseReady) {
				t.Errorf("Preempted present %v in phase %s: the successor's Ready, and only that, removes it", preempted, tc.wantPhase)
			}
		})
	}
}

// The reconciler applies its own conditions, Preempted among them, and none of the health
// engine's fields: a write that records a preemption carries the condition, and cannot
// touch the health engine's failure count.
func TestProxyStatusOfKeepsPreempted(t *testing.T) {
	st := v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseProvisioning, Healthy: true, ConsecutiveProbeFailures: 1, EgressIP: "198.51.100.7",
		ProbeTarget: "x", Conditions: []metav1.Condition{
			{Type: v1alpha1.ConditionPreempted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonPreempted, Message: "preempted"},
			{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded},
		}}
	own := proxyStatusOf(&st)
	if c := meta.FindStatusCondition(own.Conditions, v1alpha1.ConditionPreempted); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("conditions %+v, want Preempted=True among the reconciler's", own.Conditions)
	}
	if own.Healthy || own.ConsecutiveProbeFailures != 0 || own.EgressIP != "" || own.ProbeTarget != "" ||
		meta.FindStatusCondition(own.Conditions, v1alpha1.ConditionHealthy) != nil {
		t.Errorf("the reconciler's part %+v holds the health engine's fields", own)
	}
}
