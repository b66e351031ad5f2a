package proxy

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
)

// Every phase of a Proxy's life, with the conditions the reconciler sets before a write,
// reads as a user would expect: Ready is Current, a permanent error or a Secret the user
// must fix is Failed, everything else is InProgress; a generation not yet observed is
// InProgress whatever the conditions say.
func TestProxyKstatusForEachPhase(t *testing.T) {
	prov := func(st metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: v1alpha1.ConditionProvisioned, Status: st, Reason: reason, Message: reason + " (test)"}
	}
	for _, tc := range []struct {
		name   string
		phase  v1alpha1.ProxyPhase
		conds  []metav1.Condition
		behind bool
		want   status.Status
		reason string
	}{
		{"new", "", nil, false, status.InProgressStatus, "Pending"},
		{"pending on quota", v1alpha1.PhasePending, []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded)}, false, status.InProgressStatus, "Pending"},
		{"provisioning", v1alpha1.PhaseProvisioning, []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonImageDownloading)}, false, status.InProgressStatus, "Provisioning"},
		{"running, probe not passed yet", v1alpha1.PhaseRunning, []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning)}, false, status.InProgressStatus, "Running"},
		{"ready", v1alpha1.PhaseReady, []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning)}, false, status.CurrentStatus, v1alpha1.ReasonProbeSucceeded},
		{"ready, spec changed since", v1alpha1.PhaseReady, []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning)}, true, status.InProgressStatus, ""},
		{"failed", v1alpha1.PhaseFailed, []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonPermanentError)}, false, status.FailedStatus, v1alpha1.ReasonPermanentError},
		{"unlabelled Secret", v1alpha1.PhasePending, []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonCredentialsUnavailable)}, false, status.FailedStatus, v1alpha1.ReasonCredentialsUnavailable},
		{"broken WireGuard Secret", v1alpha1.PhasePending, []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonEgressUnavailable)}, false, status.FailedStatus, v1alpha1.ReasonEgressUnavailable},
		{"being remediated", v1alpha1.PhaseRunning, []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning),
			{Type: remediation.ConditionRemediating, Status: metav1.ConditionTrue, Reason: remediation.ReasonBootTimeout, Message: "attempt 1"}}, false, status.InProgressStatus, remediation.ReasonBootTimeout},
		{"remediation held by the brake", v1alpha1.PhaseRunning, []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning),
			{Type: remediation.ConditionRemediating, Status: metav1.ConditionFalse, Reason: remediation.ReasonTooManyUnhealthy, Message: "held"}}, false, status.InProgressStatus, remediation.ReasonTooManyUnhealthy},
		{"remediation gave up", v1alpha1.PhaseRunning, []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning),
			{Type: remediation.ConditionRemediating, Status: metav1.ConditionFalse, Reason: common.ReasonAttemptsExhausted, Message: "gave up"}}, false, status.FailedStatus, common.ReasonAttemptsExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			px := managedProxy("k")
			px.Generation = 2
			px.Status = v1alpha1.ProxyStatus{Phase: tc.phase, Message: "set by the test", Conditions: tc.conds, ObservedGeneration: 2}
			common.SetKstatus(&px.Status.Conditions, px.Generation, common.ProxyKstate(px))
			if tc.behind {
				px.Generation = 3
			}
			res := controllertest.KstatusOf(t, px)
			if res.Status != tc.want {
				t.Errorf("kstatus %s (%s), want %s", res.Status, res.Message, tc.want)
			}
			if tc.reason != "" {
				ready := controllertest.PoolCondition(&v1alpha1.ProxyPool{Status: v1alpha1.ProxyPoolStatus{Conditions: px.Status.Conditions}}, v1alpha1.ConditionReady)
				if ready.Reason != tc.reason || (ready.Status == metav1.ConditionTrue) != (tc.want == status.CurrentStatus) {
					t.Errorf("Ready %+v, want reason %s, True only when Current", ready, tc.reason)
				}
			}
		})
	}
	// Deleting is Terminating, from the deletion timestamp.
	px := managedProxy("k")
	px.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	px.Status.Phase = v1alpha1.PhaseDeleting
	common.SetKstatus(&px.Status.Conditions, px.Generation, common.ProxyKstate(px))
	if res := controllertest.KstatusOf(t, px); res.Status != status.TerminatingStatus {
		t.Errorf("a deleting Proxy: kstatus %s, want Terminating", res.Status)
	}
}
