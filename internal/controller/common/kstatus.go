package common

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
)

// Kstate is what the Ready, Reconciling and Stalled conditions say about an object
// (v1alpha1.ConditionReady): it is current (Ready), in progress (Reconciling) or stuck
// until the user changes something (Stalled). reason and message are the conditions'.
type Kstate struct {
	ready, stalled  bool
	reason, message string
}

// SetKstatus sets conds' Ready condition from k, and Reconciling or Stalled while they
// are True, removing them otherwise, at generation gen.
func SetKstatus(conds *[]metav1.Condition, gen int64, k Kstate) {
	set := func(typ string, status metav1.ConditionStatus) {
		meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: status, Reason: k.reason, Message: k.message, ObservedGeneration: gen})
	}
	switch {
	case k.ready:
		set(v1alpha1.ConditionReady, metav1.ConditionTrue)
		meta.RemoveStatusCondition(conds, v1alpha1.ConditionReconciling)
		meta.RemoveStatusCondition(conds, v1alpha1.ConditionStalled)
	case k.stalled:
		set(v1alpha1.ConditionReady, metav1.ConditionFalse)
		set(v1alpha1.ConditionStalled, metav1.ConditionTrue)
		meta.RemoveStatusCondition(conds, v1alpha1.ConditionReconciling)
	default:
		set(v1alpha1.ConditionReady, metav1.ConditionFalse)
		set(v1alpha1.ConditionReconciling, metav1.ConditionTrue)
		meta.RemoveStatusCondition(conds, v1alpha1.ConditionStalled)
	}
}

// ProxyKstate: a Ready Proxy is current; a Failed one, one held back by a Secret or an
// egress configuration that needs the user (Provisioned=False, CredentialsUnavailable
// or EgressUnavailable), or one remediation gave up on (Remediating=False,
// AttemptsExhausted) is stalled; every other phase is work in progress, with the
// Remediating condition's reason and message while it has one.
func ProxyKstate(px *v1alpha1.Proxy) Kstate {
	st := &px.Status
	msg := st.Message
	if msg == "" {
		msg = "phase " + string(st.Phase)
	}
	prov := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionProvisioned)
	rem := meta.FindStatusCondition(st.Conditions, remediation.ConditionRemediating)
	switch {
	case st.Phase == v1alpha1.PhaseReady:
		return Kstate{ready: true, reason: v1alpha1.ReasonProbeSucceeded, message: "the proxy runs and its health probe passes"}
	case st.Phase == v1alpha1.PhaseFailed:
		reason := "Failed"
		if prov != nil && prov.Status == metav1.ConditionFalse {
			reason = prov.Reason
		}
		return Kstate{stalled: true, reason: reason, message: msg}
	case prov != nil && prov.Status == metav1.ConditionFalse &&
		(prov.Reason == v1alpha1.ReasonCredentialsUnavailable || prov.Reason == v1alpha1.ReasonEgressUnavailable):
		return Kstate{stalled: true, reason: prov.Reason, message: prov.Message}
	case rem != nil && rem.Status == metav1.ConditionFalse && rem.Reason == ReasonAttemptsExhausted:
		// Remediation gave up: nothing more happens until the proxy answers or the user acts.
		return Kstate{stalled: true, reason: rem.Reason, message: rem.Message}
	case rem != nil:
		// Being rebooted or replaced, or held by the brake or a probe-target outage.
		return Kstate{reason: rem.Reason, message: rem.Message}
	case st.Phase == v1alpha1.PhaseRunning:
		return Kstate{reason: string(st.Phase), message: "the instance runs; waiting for the health probe through the proxy to pass"}
	case st.Phase == "":
		return Kstate{reason: string(v1alpha1.PhasePending), message: "not reconciled yet"}
	default:
		return Kstate{reason: string(st.Phase), message: msg}
	}
}

// PoolKstate: a complete pool is current; one whose Progressing condition is False for
// any reason but Complete (a broken template, an unreadable Secret, a stall, the
// progress deadline) or whose placement names an unknown provider or zone is stalled;
// otherwise the pool is rolling out, scaling or waiting for its children.
func PoolKstate(conds []metav1.Condition) Kstate {
	prog := meta.FindStatusCondition(conds, v1alpha1.PoolConditionProgressing)
	place := meta.FindStatusCondition(conds, v1alpha1.PoolConditionPlacementValid)
	switch {
	case prog != nil && prog.Status == metav1.ConditionFalse && prog.Reason == v1alpha1.PoolReasonComplete:
		return Kstate{ready: true, reason: prog.Reason, message: prog.Message}
	case prog != nil && prog.Status == metav1.ConditionFalse:
		return Kstate{stalled: true, reason: prog.Reason, message: prog.Message}
	case place != nil && place.Status == metav1.ConditionFalse:
		return Kstate{stalled: true, reason: place.Reason, message: place.Message}
	case prog != nil:
		return Kstate{reason: prog.Reason, message: prog.Message}
	default:
		return Kstate{reason: "Reconciling", message: "not reconciled yet"}
	}
}
