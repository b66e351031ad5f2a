package proxy

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
)

// Event reasons beyond the condition reasons in api/v1alpha1.
const (
	EventPending         = "Pending"
	EventInstanceGone    = "InstanceGone"
	EventReplacing       = "Replacing"
	EventInstanceDeleted = "InstanceDeleted"
)

// scope is one reconcile of one Proxy: the object as being changed (px) and the object as
// the server last had it (base: as read, then as last written), which the reconciler's
// pending changes are relative to. px is updated in place, never swapped, so a caller
// may keep px := s.px across a status write.
type scope struct {
	px   *v1alpha1.Proxy
	base *v1alpha1.Proxy
	// lock is the resourceVersion the next status write carries (statusapply.IfVersion):
	// the version read, until a write has gone through.
	lock string
	log  logr.Logger
	// gone is set once the finalizer is removed: the object may no longer exist.
	gone bool
	r    *ProxyReconciler
}

func (r *ProxyReconciler) newScope(ctx context.Context, px *v1alpha1.Proxy) *scope {
	return &scope{
		px:   px,
		base: px.DeepCopy(),
		lock: px.ResourceVersion,
		log:  ctrl.LoggerFrom(ctx).WithValues("instance", px.InstanceName()),
		r:    r,
	}
}

// setPhase moves the Proxy to phase and records an Event when that is a change
// (phaseVerdict.move).
func (s *scope) setPhase(phase v1alpha1.ProxyPhase, reason, message string) {
	var v phaseVerdict
	v.move(s.px, phase, reason, message)
	s.enact(v)
}

// enact carries out v on the Proxy: its log lines, status changes and Events, and the
// address hold's start or end. The provider call v names is the caller's.
func (s *scope) enact(v phaseVerdict) {
	st := &s.px.Status
	for _, l := range v.logs {
		s.log.V(l.level).Info(l.msg, l.kv...)
	}
	if v.message != "" {
		st.Message = v.message
	}
	if v.phase != "" {
		st.Phase = v.phase
	}
	for _, c := range v.conditions {
		meta.SetStatusCondition(&st.Conditions, c)
	}
	for _, typ := range v.removed {
		meta.RemoveStatusCondition(&st.Conditions, typ)
	}
	if a := v.address; a != nil {
		st.ProviderID, st.IP, st.IPv6 = a.providerID, a.ip, a.ipv6
	}
	if rec := v.record; rec != nil {
		st.SpecHash, st.RenderedHash, st.ObservedReplace = rec.specHash, rec.renderedHash, rec.observedReplace
	}
	if !v.holdFrom.IsZero() || v.dropHold {
		s.r.keepHold(s.px.UID, v)
	}
	for _, e := range v.events {
		s.event(e.typ, e.reason, e.action, "%s", e.message)
	}
}

// setProvisioned sets the Provisioned condition.
func (s *scope) setProvisioned(status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&s.px.Status.Conditions, metav1.Condition{
		Type:               v1alpha1.ConditionProvisioned,
		Status:             status,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: s.px.Generation,
	})
}

func (s *scope) event(typ, reason, action, format string, args ...any) {
	if s.r.Recorder == nil {
		return
	}
	s.r.Recorder.Eventf(s.px, nil, typ, reason, action, format, args...)
}

// reconcilerConditions are the Proxy conditions the reconciler owns.
var reconcilerConditions = []string{v1alpha1.ConditionProvisioned, v1alpha1.ConditionConfigOutdated, v1alpha1.ConditionPreempted,
	v1alpha1.ConditionReady, v1alpha1.ConditionReconciling, v1alpha1.ConditionStalled, remediation.ConditionRemediating}

// proxyStatusOf is the part of st the reconciler owns and applies under the
// proxy-controller field manager (docs/architecture.md, "Who writes which status field").
// The health engine's part is healthStatusOf in internal/health.
func proxyStatusOf(st *v1alpha1.ProxyStatus) *v1alpha1.ProxyStatus {
	own := &v1alpha1.ProxyStatus{
		Phase: st.Phase, ProviderID: st.ProviderID, IP: st.IP, IPv6: st.IPv6, SpecHash: st.SpecHash, RenderedHash: st.RenderedHash,
		CredentialsSecret: st.CredentialsSecret, ObservedReplace: st.ObservedReplace,
		ObservedGeneration: st.ObservedGeneration, Message: st.Message,
	}
	for _, c := range st.Conditions {
		if slices.Contains(reconcilerConditions, c.Type) {
			own.Conditions = append(own.Conditions, c)
		}
	}
	return own
}

// applyStatus applies the reconciler's part of the status when it differs from what the
// server holds, after settling Running against Ready (readiness). The first write of a
// reconcile carries the version read: if anything wrote the Proxy since, the reconcile
// decided from an old copy (the cache behind its own last write, say) and must not lay
// that over the newer state, so nothing is written and the error (errStaleRead) has the
// Proxy reconciled again. Once a write has gone through, the reconcile's own fields are
// the server's, and later writes of the same reconcile carry no version: the health
// engine's writes meanwhile touch none of them.
func (r *ProxyReconciler) applyStatus(ctx context.Context, s *scope) error {
	if s.gone {
		return nil
	}
	s.settle()
	want := proxyStatusOf(&s.px.Status)
	if equality.Semantic.DeepEqual(want, proxyStatusOf(&s.base.Status)) {
		return nil
	}
	key := client.ObjectKeyFromObject(s.px)
	obj := s.px.DeepCopy()
	err := statusapply.Status(ctx, r.Client, obj, want, statusapply.ProxyController,
		statusapply.IfVersion(s.lock), statusapply.Claiming(proxyStatusOf(&s.base.Status)))
	switch {
	case apierrors.IsConflict(err):
		return fmt.Errorf("proxy %s changed since version %s was read: %w", key, s.lock, errStaleRead)
	case err != nil:
		return fmt.Errorf("applying status of proxy %s: %w", key, err)
	}
	s.written(obj)
	return nil
}

// settle completes the status before a write: the generation observed, Running settled
// against Ready (readiness), and the kstatus conditions (Ready, Reconciling, Stalled)
// worked out from the phase and the conditions.
func (s *scope) settle() {
	s.px.Status.ObservedGeneration = s.px.Generation
	s.readiness()
	common.SetKstatus(&s.px.Status.Conditions, s.px.Generation, common.ProxyKstate(s.px))
}

// readiness settles Running against Ready from the health engine's Healthy condition
// (judgeReadiness).
func (s *scope) readiness() {
	s.enact(judgeReadiness(s.px))
}

// written records px as what the server now holds: the base of the reconciler's next
// changes. s.px keeps its identity. The reconcile's own fields are current from here on,
// so its later writes carry no version.
func (s *scope) written(px *v1alpha1.Proxy) {
	if px != s.px {
		px.DeepCopyInto(s.px)
	}
	s.base = s.px.DeepCopy()
	s.lock = ""
}

// errStaleRead: a reconcile decided from a copy of the Proxy older than the server's;
// Reconcile runs again rather than write.
var errStaleRead = errors.New("the reconcile read a stale copy; reconciling again")
