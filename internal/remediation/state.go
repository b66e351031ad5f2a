package remediation

import (
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// State is what remediation needs to know of one proxy. FromProxy fills it from a
// Proxy; the caller adds what the Proxy does not say (CanReboot, the probe target, the
// timeouts of a pool template).
type State struct {
	// Key names the proxy (namespace/name) in messages and results.
	Key string
	// Group is the group whose brake applies: PoolGroup or HostGroup.
	Group string
	// NotRemediable, when set, says why the proxy is never remediated (an External
	// proxy, one being deleted, Failed, cordoned, or leaving from the wrong address); it
	// still counts in its group.
	NotRemediable string
	// Started is when its instance last started running (the Provisioned condition's
	// transition to True with reason InstanceRunning); zero while it does not run.
	Started time.Time
	// Answered: a probe went through the proxy since Started.
	Answered bool
	// Healthy: the proxy passes its probes now (v1alpha1.Proxy.ProbedHealthy), since
	// HealthySince.
	Healthy      bool
	HealthySince time.Time
	// FailingSince is when the proxy, Answered, last went out of rotation (the Healthy
	// condition's transition to False); zero while Healthy or never Answered.
	FailingSince time.Time
	// Record is the last attempt for the fault under way, nil if none.
	Record *Record
	// CanReboot: the proxy's provider can restart its instance in place.
	CanReboot bool
	// TargetDown: the probe target itself is known to be down; TargetUpSince: when it
	// was last seen coming back (zero: not known to have been down). A fault's clock
	// starts no earlier than TargetUpSince. The health engine's ProbeTargetDown and
	// ProbeTargetUpSince give both.
	TargetDown    bool
	TargetUpSince time.Time
	// BootTimeout and UnhealthyTimeout override the Policy's for this proxy (a field of
	// the Proxy or its pool's template); zero takes the Policy's.
	BootTimeout, UnhealthyTimeout time.Duration
}

// PoolGroup is the group of a pool's children.
func PoolGroup(namespace, name string) string { return "pool/" + namespace + "/" + name }

// HostGroup is the group of the standalone Proxies of a provider's host or zone
// (placement.zone; "" for a provider without zones).
func HostGroup(provider, zone string) string {
	if zone == "" {
		return "provider/" + provider
	}
	return "provider/" + provider + "/" + zone
}

// ExternalGroup is the group FromProxy gives an External proxy, which has no host and
// is never remediated.
const ExternalGroup = "external"

// NotRemediable reasons FromProxy gives.
const (
	notRemediableExternal = "an External proxy has no instance to reboot or replace"
	notRemediableDeleting = "the Proxy is being deleted"
	notRemediableEgress   = "the proxy answers but leaves from the wrong address (EgressMismatch): a new VM would leave from the same exit; fix its WireGuard Secret"
	notRemediableFailed   = "phase Failed: the reconciler waits for a change by the user"
	notRemediableCordoned = "cordoned: out of service on purpose (a pool replaces a cordoned child)"
)

// FromProxy is px's State: its group (its pool's if a ProxyPool controls it, else its
// provider's zone), its instance's start, whether it answered since, its health and
// its Record (RecordAnnotation). A Record that does not parse is left out and its error
// returned beside the State, which is complete otherwise.
func FromProxy(px *v1alpha1.Proxy) (State, error) {
	st := State{Key: px.Namespace + "/" + px.Name, Group: HostGroup(px.Spec.Provider, px.Spec.Placement.Zone)}
	if ref, ok := v1alpha1.ControllingPool(px); ok {
		st.Group = PoolGroup(px.Namespace, ref.Name)
	}
	conds := px.Status.Conditions
	addressLost := false
	if c := meta.FindStatusCondition(conds, v1alpha1.ConditionProvisioned); c != nil && c.Status == metav1.ConditionTrue &&
		(c.Reason == v1alpha1.ReasonInstanceRunning || c.Reason == v1alpha1.ReasonAddressLost) {
		st.Started = c.LastTransitionTime.Time
		addressLost = c.Reason == v1alpha1.ReasonAddressLost
	}
	hc := meta.FindStatusCondition(conds, v1alpha1.ConditionHealthy)
	st.Healthy = px.ProbedHealthy()
	switch {
	case st.Healthy:
		st.Answered, st.HealthySince = true, hc.LastTransitionTime.Time
	case addressLost && hc != nil && !hc.LastTransitionTime.Time.Before(st.Started) && px.Status.ProbeLatencyMilliseconds > 0 &&
		strings.HasPrefix(px.Status.ProbeTarget, px.Status.ProviderID+" "):
		// The instance answered at the address it no longer reports (its network failed):
		// failing since it went out of rotation, which is when its probes failed or, if
		// they had not yet, when it lost its address (the Ready condition's fall).
		st.Answered, st.FailingSince = true, hc.LastTransitionTime.Time
		if hc.Status == metav1.ConditionTrue {
			if rc := meta.FindStatusCondition(conds, v1alpha1.ConditionReady); rc != nil && rc.Status == metav1.ConditionFalse {
				st.FailingSince = rc.LastTransitionTime.Time
			}
		}
	case hc != nil && hc.Status == metav1.ConditionFalse && !st.Started.IsZero() &&
		!hc.LastTransitionTime.Time.Before(st.Started) && px.Status.ProbeLatencyMilliseconds > 0 &&
		px.Status.ProbeTarget == px.CurrentProbeTarget():
		// It went False after the instance started, and a probe once passed: it was True
		// in between (a proxy that never passed goes False at its first failure, with
		// no latency recorded; a replaced instance's health is cleared before it runs).
		st.Answered, st.FailingSince = true, hc.LastTransitionTime.Time
	}
	switch {
	case px.Spec.Mode == v1alpha1.ProxyModeExternal:
		st.Group, st.NotRemediable = ExternalGroup, notRemediableExternal
	case px.DeletionTimestamp != nil:
		st.NotRemediable = notRemediableDeleting
	case px.Status.Phase == v1alpha1.PhaseFailed:
		st.NotRemediable = notRemediableFailed
	case px.Annotations[v1alpha1.CordonAnnotation] == "true":
		st.NotRemediable = notRemediableCordoned
	case hc != nil && hc.Reason == v1alpha1.ReasonEgressMismatch:
		st.NotRemediable = notRemediableEgress
	}
	rec, err := ParseRecord(px.Annotations[RecordAnnotation])
	st.Record = rec
	return st, err
}
