package health

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// DefaultFailureThreshold is how many probes in a row must fail before a healthy proxy
// is marked unhealthy: one lost probe is not enough to take it out of rotation.
const DefaultFailureThreshold = 3

// ReasonNotProbed is the Healthy condition's reason while a once-healthy Proxy is outside
// Running/Ready (its instance is being replaced, or it failed).
const ReasonNotProbed = "NotProbed"

// transition is an Event to record after a status write.
type transition struct {
	typ, reason, note string
}

// layResult lays the probe result r onto px's status: only the fields the health engine owns
// (healthStatusOf). The Proxy reconciler moves the phase between Running and Ready from
// the Healthy condition and probeTarget. hint, when not empty,
// is added to the failure message of a Proxy that has not passed a probe yet (its
// provider's ProbeHinter). It returns the Event to record, if the proxy changed between
// healthy and unhealthy.
func layResult(px *v1alpha1.Proxy, r result, now time.Time, threshold int32, hint string) *transition {
	st := &px.Status
	t := metav1.NewTime(now)
	st.LastProbeTime = &t
	st.ProbeTarget = px.CurrentProbeTarget()
	prev := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHealthy)
	wasHealthy := st.Healthy && prev != nil && prev.Status == metav1.ConditionTrue
	prevReason := ""
	if prev != nil {
		prevReason = prev.Reason
	}

	if r.err == nil {
		st.ConsecutiveProbeFailures = 0
		st.ProbeLatencyMilliseconds = max(r.latency.Milliseconds(), 1)
		st.EgressIP = r.egressIP
		st.Healthy = true
		// No latency here: the message is compared to decide on a write, and the latency
		// of every probe is in the metrics.
		msg := fmt.Sprintf("probe through %s:%d succeeded", st.IP, px.Spec.Port)
		if st.EgressIP != "" {
			msg += ", egress IP " + st.EgressIP
		}
		if r.verified {
			msg += " (the egressIP its WireGuard Secret states)"
		}
		setHealthy(px, metav1.ConditionTrue, v1alpha1.ReasonProbeSucceeded, msg)
		if wasHealthy {
			return nil
		}
		return &transition{corev1.EventTypeNormal, v1alpha1.ReasonProbeSucceeded, "proxy is healthy: " + msg}
	}

	st.ConsecutiveProbeFailures++
	if r.reason == v1alpha1.ReasonEgressMismatch {
		// The proxy answers, but leaves from the wrong address: out of rotation at once,
		// whatever the threshold, with the address the target saw on show.
		st.EgressIP = r.egressIP
		st.Healthy = false
		setHealthy(px, metav1.ConditionFalse, v1alpha1.ReasonEgressMismatch, r.err.Error())
		if prevReason == v1alpha1.ReasonEgressMismatch {
			return nil
		}
		return &transition{corev1.EventTypeWarning, v1alpha1.ReasonEgressMismatch, "proxy is unhealthy: " + r.err.Error()}
	}
	// The count is in consecutiveProbeFailures, not in the message, which is compared
	// to decide on a write.
	msg := fmt.Sprintf("probes failing; last: %v", r.err)
	if hint != "" && !wasHealthy && st.ProbeLatencyMilliseconds == 0 {
		// Never answered (a pass sets the latency): the provider may know why.
		msg += "; " + hint
	}
	if wasHealthy && st.ConsecutiveProbeFailures < threshold {
		// Still in rotation: keep Healthy=True and say nothing until the threshold.
		return nil
	}
	st.Healthy = false
	setHealthy(px, metav1.ConditionFalse, v1alpha1.ReasonProbeFailed, msg)
	if !wasHealthy {
		return nil // it was not in rotation; the condition says why, no Event per round
	}
	return &transition{corev1.EventTypeWarning, v1alpha1.ReasonProbeFailed,
		fmt.Sprintf("proxy is unhealthy after %d consecutive failed probes; last: %v", st.ConsecutiveProbeFailures, r.err)}
}

func setHealthy(px *v1alpha1.Proxy, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{
		Type:               v1alpha1.ConditionHealthy,
		Status:             status,
		Reason:             reason,
		Message:            msg,
		ObservedGeneration: px.Generation,
	})
}

// healthStatusOf is the part of st the health engine owns and applies under the
// proxy-health field manager (docs/architecture.md, "Who writes which status field"):
// healthy, the Healthy condition, probeTarget, lastProbeTime, probeLatencyMilliseconds,
// egressIP, consecutiveProbeFailures and unreachableProbe. The reconciler's part is proxyStatusOf in
// internal/controller/proxy.
func healthStatusOf(st *v1alpha1.ProxyStatus) *v1alpha1.ProxyStatus {
	own := &v1alpha1.ProxyStatus{
		Healthy: st.Healthy, ProbeTarget: st.ProbeTarget, LastProbeTime: st.LastProbeTime,
		ProbeLatencyMilliseconds: st.ProbeLatencyMilliseconds, EgressIP: st.EgressIP,
		ConsecutiveProbeFailures: st.ConsecutiveProbeFailures, UnreachableProbe: st.UnreachableProbe,
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHealthy); c != nil {
		own.Conditions = []metav1.Condition{*c}
	}
	return own
}
