package proxy

import (
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// The phase verdict: what a reconcile of a Managed Proxy does next, decided by the judge
// functions below from what it observed (the Proxy, the provider's answer or its error's
// class, the clock's now, the address hold) without the API server or the provider, and
// carried out by enact (the status and the Events) and the steps of reconcileManaged
// (the provider call the verdict names). phaseverdict_test.go tables every rule.

// phaseAct is the provider call a verdict asks for next.
type phaseAct string

const (
	// The zero phaseAct ends the reconcile with the verdict's result and error.

	// actRender goes on: the configuration is rendered and the instance looked up.
	actRender phaseAct = "render"
	// actCreate creates the instance (the credentials snapshot first).
	actCreate phaseAct = "create"
	// actRestart starts the stopped instance as it was built.
	actRestart phaseAct = "restart"
	// actReplace deletes the instance (verdict.why says why) and creates it again.
	actReplace phaseAct = "replace"
	// actRemediate asks remediation about the running instance; the verdict's requeue
	// stands unless remediation wants a look sooner.
	actRemediate phaseAct = "remediate"
)

// phaseTimings are the reconciler's intervals a verdict requeues by.
type phaseTimings struct {
	poll, resync, addressHold, quotaRetry, pendingRetry, failedRecheck time.Duration
}

func (r *ProxyReconciler) timings() phaseTimings {
	return phaseTimings{poll: r.PollInterval, resync: r.ResyncInterval, addressHold: r.AddressHold,
		quotaRetry: r.QuotaRetry, pendingRetry: r.PendingRetry, failedRecheck: r.FailedRecheckInterval}
}

// instanceAddress is what status records of where the instance is.
type instanceAddress struct {
	providerID, ip, ipv6 string
}

// phaseEvent is an Event a phase verdict records.
type phaseEvent struct {
	typ, reason, action, message string
}

// verdictLog is a line a verdict logs, at verbosity level.
type verdictLog struct {
	level int
	msg   string
	kv    []any
}

// phaseVerdict is what a judge decides, as data.
type phaseVerdict struct {
	act phaseAct
	why string // of a replacement
	// booting: the instance remediation is asked about runs without an address yet.
	booting bool

	// phase is the phase to move to, "" to keep it; message status.message, "" to keep it.
	phase   v1alpha1.ProxyPhase
	message string
	// conditions are set in order; removed are taken away.
	conditions []metav1.Condition
	removed    []string
	// address is laid on status when set; record (the hashes and the replace annotation
	// value the instance was built for) too.
	address *instanceAddress
	record  *recorded
	// holdFrom starts the address hold at that time; dropHold ends it.
	holdFrom time.Time
	dropHold bool

	logs   []verdictLog
	events []phaseEvent
	// result and err are what the reconcile returns when act is actNone; with
	// actRemediate, result is the requeue remediation may bring forward.
	result ctrl.Result
	err    error
}

func (v *phaseVerdict) log(level int, msg string, kv ...any) {
	v.logs = append(v.logs, verdictLog{level, msg, kv})
}

func (v *phaseVerdict) event(typ, reason, action, format string, args ...any) {
	v.events = append(v.events, phaseEvent{typ, reason, action, fmt.Sprintf(format, args...)})
}

// move moves px to phase with message, logged and told with an Event when that is a
// change. A Ready Proxy stays Ready when the verdict finds it Running: readiness decides
// between the two before each write.
func (v *phaseVerdict) move(px *v1alpha1.Proxy, phase v1alpha1.ProxyPhase, reason, message string) {
	v.message = message
	from := px.Status.Phase
	if (phase == v1alpha1.PhaseRunning && from == v1alpha1.PhaseReady) || from == phase {
		return
	}
	v.log(0, "proxy phase changed", "from", from, "to", phase, "reason", reason, "message", message)
	v.phase = phase
	typ := corev1.EventTypeNormal
	if phase == v1alpha1.PhaseFailed {
		typ = corev1.EventTypeWarning
	}
	v.event(typ, reason, common.ActionReconcile, "%s: %s", phase, message)
}

// provisioned sets the Provisioned condition of px's generation.
func (v *phaseVerdict) provisioned(px *v1alpha1.Proxy, status metav1.ConditionStatus, reason, message string) {
	v.conditions = append(v.conditions, metav1.Condition{Type: v1alpha1.ConditionProvisioned, Status: status,
		Reason: reason, Message: message, ObservedGeneration: px.Generation})
}

// outdated sets the ConfigOutdated condition, with a Normal Event when it turns True or
// changes reason.
func (v *phaseVerdict) outdated(px *v1alpha1.Proxy, status metav1.ConditionStatus, reason, message string) {
	if configOutdatedNews(px, status, reason) {
		v.log(0, "proxy configuration outdated", "reason", reason, "message", message)
		v.event(corev1.EventTypeNormal, reason, common.ActionReconcile, "ConfigOutdated: %s", message)
	}
	v.conditions = append(v.conditions, configOutdatedCondition(px, status, reason, message))
}

// judgeStart decides how a reconcile of a Managed Proxy begins: a provider that is not
// configured (configured lists the ones that are) fails it, a permanent failure at its
// generation ends it, and a new Proxy turns Pending; otherwise it goes on (actRender).
func judgeStart(px *v1alpha1.Proxy, known bool, configured []string) phaseVerdict {
	switch {
	case !known:
		return judgeNotConfigured(px, configured)
	case latchedFailure(px):
		// A permanent error stands until the spec changes; retrying cannot help.
		return phaseVerdict{}
	}
	v := phaseVerdict{act: actRender}
	if px.Status.Phase == "" {
		v.move(px, v1alpha1.PhasePending, EventPending,
			fmt.Sprintf("instance %s will be created by provider %s", px.InstanceName(), px.Spec.Provider))
	}
	return v
}

// judgeNotConfigured fails a Proxy naming a provider that is not in the providers config
// (configured, sorted). It is not retried: the config is read once per process.
func judgeNotConfigured(px *v1alpha1.Proxy, configured []string) phaseVerdict {
	msg := fmt.Sprintf("provider %q is not configured (configured: %s)", px.Spec.Provider, strings.Join(configured, ", "))
	if len(configured) == 0 {
		msg = fmt.Sprintf("provider %[1]q is not configured (no providers are configured: the manager was started without a providers config, or with one listing none); add %[1]q to the manager's --providers-config and restart it", px.Spec.Provider)
	}
	var v phaseVerdict
	if px.Status.Phase != v1alpha1.PhaseFailed {
		v.move(px, v1alpha1.PhaseFailed, v1alpha1.ReasonProviderNotConfigured, msg)
	}
	v.message = msg
	v.provisioned(px, metav1.ConditionFalse, v1alpha1.ReasonProviderNotConfigured, msg)
	return v
}

// looked is what looking up the Proxy's recorded instance found, when the provider did
// not say it is gone (judgeGone): the Get's error, or the instance, the build verdict
// on it (judgeBuild) and the error of carrying that out (carryOut).
type looked struct {
	id       string
	inst     provider.Instance
	err      error
	build    buildVerdict
	buildErr error
	hold     holdFacts
}

// judgeLooked decides what the lookup of the Proxy's instance leads to: a Get error by
// its class (judgeProviderError), a credentials snapshot the Proxy cannot keep, a
// replacement or restart as the build verdict says, or the instance kept: its status
// published (judgeInstance) and, running, remediation asked.
func judgeLooked(px *v1alpha1.Proxy, l looked, t phaseTimings) phaseVerdict {
	switch {
	case l.err != nil:
		return judgeProviderError(px, common.ActionGet, fmt.Errorf("getting instance %s: %w", l.id, l.err), false, t)
	case errors.Is(l.buildErr, errSnapshotTaken):
		return judgeSnapshotTaken(px, l.buildErr, t)
	case l.buildErr != nil:
		return judgeProviderError(px, common.ActionReconcile, l.buildErr, false, t)
	case l.build.action == buildReplace:
		return phaseVerdict{act: actReplace, why: l.build.why}
	case l.build.action == buildRestart:
		// Create starts an existing instance that is not running, as it was built.
		return phaseVerdict{act: actRestart}
	}
	v := judgeInstance(px, l.inst, l.hold, t)
	if l.inst.State == provider.StateRunning {
		v.act, v.booting = actRemediate, l.inst.IP == ""
	}
	return v
}

// judgeProvision decides what the Proxy shows before its Create: Provisioning, unless it
// shows it already (a repeat after a pending, quota or transient result: announcing
// "creating" first would write the status twice per retry, flipping the message and
// reason back and forth) or is Failed with OwnedByOther (a re-check: it stays Failed,
// with no phase flapping, until the Create succeeds). basePhase is the phase the server
// holds. It reports whether the status is written before the Create: a Create may take
// minutes (a first image download).
func judgeProvision(px *v1alpha1.Proxy, basePhase v1alpha1.ProxyPhase) (phaseVerdict, bool) {
	var v phaseVerdict
	switch {
	case ownedByOther(px):
		v.log(1, "checking a proxy failed on an instance of another owner again", "message", px.Status.Message)
		return v, false
	case basePhase == v1alpha1.PhaseProvisioning:
		return v, false
	}
	msg := fmt.Sprintf("creating instance %s with provider %s", px.InstanceName(), px.Spec.Provider)
	v.move(px, v1alpha1.PhaseProvisioning, v1alpha1.ReasonProvisioning, msg)
	v.provisioned(px, metav1.ConditionFalse, v1alpha1.ReasonProvisioning, msg)
	return v, true
}

// created is the provider's answer to a Create: the instance or the error; want the
// hashes a new instance is built from (nil for a restart, which keeps those recorded).
type created struct {
	inst provider.Instance
	err  error
	want *hashes
	hold holdFacts
}

// judgeCreated decides what a Create's answer leads to: an error by its class (the
// instance is not provisioned), or the instance published, with the hashes it was built
// from recorded and ConfigOutdated=False for a new one.
func judgeCreated(px *v1alpha1.Proxy, c created, t phaseTimings) phaseVerdict {
	if c.err != nil {
		return judgeProviderError(px, common.ActionCreate, fmt.Errorf("creating instance %s: %w", px.InstanceName(), c.err), true, t)
	}
	if c.want == nil {
		return judgeInstance(px, c.inst, c.hold, t)
	}
	var v phaseVerdict
	v.record = &recorded{c.want.intent, c.want.rendered, px.Annotations[v1alpha1.ReplaceAnnotation]}
	v.outdated(px, metav1.ConditionFalse, v1alpha1.ReasonUpToDate, upToDateMessage(px))
	inst := judgeInstance(px, c.inst, c.hold, t)
	inst.record, inst.conditions = v.record, append(v.conditions, inst.conditions...)
	inst.logs, inst.events = append(v.logs, inst.logs...), append(v.events, inst.events...)
	return inst
}

// judgeReplace is what the Proxy shows while its instance id is deleted to be built
// again for why.
func judgeReplace(px *v1alpha1.Proxy, id, why string) phaseVerdict {
	var v phaseVerdict
	v.event(corev1.EventTypeNormal, EventReplacing, common.ActionDelete, "%s: deleting instance %s to create it again", why, id)
	msg := fmt.Sprintf("replacing instance %s: %s", px.InstanceName(), why)
	v.move(px, v1alpha1.PhaseProvisioning, v1alpha1.ReasonProvisioning, msg)
	v.provisioned(px, metav1.ConditionFalse, v1alpha1.ReasonProvisioning, msg)
	return v
}

// judgeReplaced forgets the instance deleted for a replacement, and the hashes it was
// built from; the replace annotation's value is seen. The new one is created next.
func judgeReplaced(px *v1alpha1.Proxy) phaseVerdict {
	return phaseVerdict{act: actCreate, address: &instanceAddress{},
		record: &recorded{observedReplace: px.Annotations[v1alpha1.ReplaceAnnotation]}}
}

// holdFacts are what the address hold is judged from: the clock's now, and since when
// the Proxy's running instance has reported no address (zero: it has not been seen
// missing).
type holdFacts struct {
	since, now time.Time
}

// judgeInstance lays what the provider reports about a live instance on the status. A
// running instance the Proxy had at an address that reports none keeps its last address
// and phase for the address hold (from the first reconcile that saw it missing); after
// that it is AddressLost (addressLost). One without an address yet, or not running, is
// Provisioning and looked at every poll; one running at an address is Running.
func judgeInstance(px *v1alpha1.Proxy, inst provider.Instance, h holdFacts, t phaseTimings) phaseVerdict {
	var v phaseVerdict
	if left, held := judgeHold(px, inst, h, t.addressHold, &v); held {
		v.result = ctrl.Result{RequeueAfter: min(t.poll, left)}
		return v
	}
	if lost, msg := addressLost(px, inst); lost {
		v.address = &instanceAddress{providerID: px.Status.ProviderID}
		v.move(px, v1alpha1.PhaseProvisioning, v1alpha1.ReasonAddressLost, msg)
		v.provisioned(px, metav1.ConditionTrue, v1alpha1.ReasonAddressLost, msg)
		v.result = ctrl.Result{RequeueAfter: t.poll}
		return v
	}
	v.address = &instanceAddress{inst.ProviderID, inst.IP, inst.IPv6}
	if inst.State != provider.StateRunning || inst.IP == "" {
		msg := fmt.Sprintf("instance %s is %s; waiting for it to run and report an address", inst.Name, strings.ToLower(orState(inst.State)))
		if inst.State == provider.StateRunning {
			msg = fmt.Sprintf("instance %s is running; waiting for it to report an address", inst.Name)
		}
		v.move(px, v1alpha1.PhaseProvisioning, v1alpha1.ReasonProvisioning, msg)
		v.provisioned(px, metav1.ConditionFalse, v1alpha1.ReasonProvisioning, msg)
		v.result = ctrl.Result{RequeueAfter: t.poll}
		return v
	}
	msg := fmt.Sprintf("instance %s is running at %s", inst.Name, inst.IP)
	v.move(px, v1alpha1.PhaseRunning, v1alpha1.ReasonInstanceRunning, msg)
	v.provisioned(px, metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning, msg)
	v.result = ctrl.Result{RequeueAfter: t.resync}
	return v
}

// judgeHold reports whether the Proxy keeps its last address and phase while inst, its
// running instance, reports none, and for how much longer; the hold's start or end goes
// into v. It holds only an instance the Proxy has already seen at an address (Running or
// Ready), for hold from the first reconcile that saw the address missing.
func judgeHold(px *v1alpha1.Proxy, inst provider.Instance, h holdFacts, hold time.Duration, v *phaseVerdict) (time.Duration, bool) {
	missing := inst.State == provider.StateRunning && inst.IP == "" && px.Status.IP != "" &&
		inst.ProviderID == px.Status.ProviderID &&
		(px.Status.Phase == v1alpha1.PhaseRunning || px.Status.Phase == v1alpha1.PhaseReady)
	if !missing {
		v.dropHold = true
		return 0, false
	}
	since := h.since
	if since.IsZero() {
		since = h.now
		v.holdFrom = h.now
		v.log(0, "running instance reports no address; keeping the last one for a while", "ip", px.Status.IP, "hold", hold)
	}
	left := hold - h.now.Sub(since)
	if left <= 0 {
		v.holdFrom, v.dropHold = time.Time{}, true
		return 0, false
	}
	return left, true
}

// judgeSnapshotTaken shows that the snapshot's Secret name belongs to a Secret the Proxy
// does not control, and checks again every PendingRetry: nothing is written over it.
func judgeSnapshotTaken(px *v1alpha1.Proxy, err error, t phaseTimings) phaseVerdict {
	v := judgeUnavailable(px, v1alpha1.ReasonCredentialsUnavailable, err.Error(),
		"proxy cannot keep its credentials snapshot", "error", err.Error())
	v.result = ctrl.Result{RequeueAfter: t.pendingRetry}
	return v
}

// judgeUnavailable shows that the Proxy's credentials (or WireGuard configuration) cannot
// be had, for reason with msg: Provisioned=False, the phase Pending while the Proxy has no
// instance (one built earlier keeps running as it is), and a Warning Event and a log
// line (logMsg, kv) when the condition changes.
func judgeUnavailable(px *v1alpha1.Proxy, reason, msg, logMsg string, kv ...any) phaseVerdict {
	var v phaseVerdict
	if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned); c == nil ||
		c.Reason != reason || c.Message != msg {
		v.log(0, logMsg, kv...)
		v.event(corev1.EventTypeWarning, reason, common.ActionReconcile, "%s", msg)
	}
	if px.Status.ProviderID == "" {
		v.move(px, v1alpha1.PhasePending, reason, msg)
	}
	v.message = msg
	v.provisioned(px, metav1.ConditionFalse, reason, msg)
	return v
}

// judgeProviderError turns a provider error into status, an Event and a result, by class:
// permanent latches Failed, quota waits QuotaRetry off the backoff curve, pending (work
// the provider runs in the background, such as an image download) waits PendingRetry off
// the curve too and shows the work's progress, a transient error that says when a retry
// can succeed (provider.RetryAfter) waits that long, anything else goes back to
// controller-runtime for a retry with backoff. provisioning says the error kept the
// instance from being provisioned, so the Provisioned condition shows it.
func judgeProviderError(px *v1alpha1.Proxy, action string, err error, provisioning bool, t phaseTimings) phaseVerdict {
	st := &px.Status
	var v phaseVerdict
	switch {
	case errors.Is(err, errStaleRead):
		v.err = err // not the provider's: Reconcile runs again
	case errors.Is(err, provider.ErrPending):
		// Not a failure: no Warning event, and the Provisioned condition carries the
		// progress with the provider's reason (ImageDownloading for kvm2).
		pr, _ := provider.PendingProgress(err)
		if pr.Reason == "" {
			pr.Reason = v1alpha1.ReasonProvisioning
		}
		if pr.Message == "" {
			pr.Message = err.Error()
		}
		msg := progressMessage(pr)
		v.log(1, "provider work pending; asking again", "op", action, "retryIn", t.pendingRetry,
			"reason", pr.Reason, "progress", msg)
		v.phase, v.message = v1alpha1.PhaseProvisioning, msg
		v.provisioned(px, metav1.ConditionFalse, pr.Reason, msg)
		v.result = ctrl.Result{RequeueAfter: t.pendingRetry}
	case errors.Is(err, provider.ErrOwnedByOther):
		// Permanent for this request, but the other owner's instance may go (orphan GC
		// deletes it once no Proxy owns it): check again later instead of latching.
		msg := fmt.Sprintf("%v; checked again every %s, and as soon as orphan GC deletes that instance", err, t.failedRecheck)
		if !ownedByOther(px) {
			v.log(0, "proxy phase changed", "from", st.Phase, "to", v1alpha1.PhaseFailed, "reason", v1alpha1.ReasonOwnedByOther, "error", err.Error())
			v.event(corev1.EventTypeWarning, v1alpha1.ReasonOwnedByOther, action, "%s", msg)
		}
		v.phase, v.message = v1alpha1.PhaseFailed, msg
		v.provisioned(px, metav1.ConditionFalse, v1alpha1.ReasonOwnedByOther, msg)
		v.result = ctrl.Result{RequeueAfter: t.failedRecheck}
	case errors.Is(err, provider.ErrPermanent):
		if st.Phase != v1alpha1.PhaseFailed {
			v.log(0, "proxy phase changed", "from", st.Phase, "to", v1alpha1.PhaseFailed, "reason", v1alpha1.ReasonPermanentError, "error", err.Error())
		}
		v.phase, v.message = v1alpha1.PhaseFailed, err.Error()
		v.provisioned(px, metav1.ConditionFalse, v1alpha1.ReasonPermanentError, err.Error())
		v.event(corev1.EventTypeWarning, v1alpha1.ReasonPermanentError, action, "%v; the Proxy stays Failed until its spec changes", err)
	case errors.Is(err, provider.ErrQuotaExceeded):
		msg := fmt.Sprintf("%v; retrying in %s", err, t.quotaRetry)
		v.log(0, "provider out of capacity; waiting", "op", action, "retryIn", t.quotaRetry, "error", err.Error())
		v.phase, v.message = v1alpha1.PhaseProvisioning, msg
		v.provisioned(px, metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded, msg)
		v.event(corev1.EventTypeWarning, v1alpha1.ReasonQuotaExceeded, action, "%s", msg)
		v.result = ctrl.Result{RequeueAfter: t.quotaRetry}
	case errors.Is(err, provider.ErrTransient) && provider.RetryAfter(err) > 0:
		// The provider says when a retry can succeed (a rate limit's reset): wait that
		// long, at most the error backoff's cap, off the curve.
		wait := min((provider.RetryAfter(err) + time.Second - 1).Truncate(time.Second), maxErrorBackoff)
		v.event(corev1.EventTypeWarning, v1alpha1.ReasonTransientError, action, "%v; retrying in %s", err, wait)
		v.transient(px, err, provisioning)
		v.result = ctrl.Result{RequeueAfter: wait}
	default:
		// ErrTransient, unclassified errors, and ErrNotFound where the contract rules it out.
		v.event(corev1.EventTypeWarning, v1alpha1.ReasonTransientError, action, "%v; retrying", err)
		v.transient(px, err, provisioning)
		v.err = err
	}
	return v
}

// transient shows a transient error on the Provisioned condition when it kept the
// instance from being provisioned.
func (v *phaseVerdict) transient(px *v1alpha1.Proxy, err error, provisioning bool) {
	if provisioning {
		v.message = err.Error()
		v.provisioned(px, metav1.ConditionFalse, v1alpha1.ReasonTransientError, err.Error())
	}
}

// judgeReadiness moves a Running Proxy to Ready while the health engine's Healthy
// condition is True for its current instance and address (status.probeTarget), and a
// Ready one back to Running otherwise. Ready takes the Preempted notice away: the
// successor serves. The Running/Ready moves are logged; the health engine records their
// Events (ProbeSucceeded, ProbeFailed).
func judgeReadiness(px *v1alpha1.Proxy) phaseVerdict {
	var v phaseVerdict
	st := &px.Status
	if st.Phase != v1alpha1.PhaseRunning && st.Phase != v1alpha1.PhaseReady {
		return v
	}
	phase := v1alpha1.PhaseRunning
	if px.ProbedHealthy() {
		phase = v1alpha1.PhaseReady
		v.removed = []string{v1alpha1.ConditionPreempted}
	}
	if st.Phase != phase {
		v.log(0, "proxy phase changed", "from", st.Phase, "to", phase, "probeTarget", st.ProbeTarget)
		v.phase = phase
	}
	return v
}
