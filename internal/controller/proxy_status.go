package controller

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
)

// Event reasons beyond the condition reasons in api/v1alpha1.
const (
	EventPending         = "Pending"
	EventInstanceGone    = "InstanceGone"
	EventReplacing       = "Replacing"
	EventInstanceDeleted = "InstanceDeleted"
)

// Event actions (the events API's "what was being done").
const (
	actionReconcile = "Reconcile"
	actionCreate    = "Create"
	actionGet       = "Get"
	actionDelete    = "Delete"
	actionList      = "List"
)

// statusConflictRetries bounds how often a status write is redone on a fresh copy after
// a conflict with another writer (the health engine).
const statusConflictRetries = 5

// scope is one reconcile of one Proxy: the object as being changed (px), the object as
// the server last had it (base, the patch's starting point) and the status the
// reconciler's pending changes are relative to (orig: as read, then as last written).
// px is updated in place, never swapped, so a caller may keep px := s.px across a
// status write.
type scope struct {
	px   *v1alpha1.Proxy
	base *v1alpha1.Proxy
	orig *v1alpha1.ProxyStatus
	log  logr.Logger
	// gone is set once the finalizer is removed: the object may no longer exist.
	gone bool
	r    *ProxyReconciler
}

func (r *ProxyReconciler) newScope(ctx context.Context, px *v1alpha1.Proxy) *scope {
	return &scope{
		px:   px,
		base: px.DeepCopy(),
		orig: px.Status.DeepCopy(),
		log:  ctrl.LoggerFrom(ctx).WithValues("instance", px.InstanceName()),
		r:    r,
	}
}

// setPhase moves the Proxy to phase and records an Event when that is a change. A Proxy
// the health engine has marked Ready stays Ready when the reconciler finds it Running.
func (s *scope) setPhase(phase v1alpha1.ProxyPhase, reason, message string) {
	st := &s.px.Status
	st.Message = message
	if phase == v1alpha1.PhaseRunning && st.Phase == v1alpha1.PhaseReady {
		return
	}
	if st.Phase == phase {
		return
	}
	s.log.Info("proxy phase changed", "from", st.Phase, "to", phase, "reason", reason, "message", message)
	st.Phase = phase
	typ := corev1.EventTypeNormal
	if phase == v1alpha1.PhaseFailed {
		typ = corev1.EventTypeWarning
	}
	s.event(typ, reason, actionReconcile, "%s: %s", phase, message)
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

// patchStatus writes the reconciler's status fields, under the proxy-controller field
// manager so that managedFields show them as its own. The write carries the version read,
// so it cannot overwrite what the health engine wrote meanwhile; on a conflict the
// reconciler's changes (relative to s.orig, however many conflicts in a row) are laid
// onto a fresh copy, which replaces the contents of s.px, and written again.
func (r *ProxyReconciler) patchStatus(ctx context.Context, s *scope) error {
	if s.gone {
		return nil
	}
	s.px.Status.ObservedGeneration = s.px.Generation
	want := s.px.Status.DeepCopy()
	key := client.ObjectKeyFromObject(s.px)
	for attempt := 1; ; attempt++ {
		if equality.Semantic.DeepEqual(s.base.Status, s.px.Status) {
			s.orig = s.px.Status.DeepCopy()
			return nil
		}
		err := r.Client.Status().Patch(ctx, s.px, client.MergeFromWithOptions(s.base, client.MergeFromWithOptimisticLock{}),
			client.FieldOwner(statusapply.ProxyController))
		if err == nil {
			s.written(s.px)
			return nil
		}
		if !apierrors.IsConflict(err) || attempt == statusConflictRetries {
			return fmt.Errorf("patching status of proxy %s: %w", key, err)
		}
		fresh := &v1alpha1.Proxy{}
		if err := r.reader().Get(ctx, key, fresh); err != nil {
			return fmt.Errorf("re-reading proxy %s after a status conflict: %w", key, err)
		}
		if stale(s.orig, &fresh.Status) {
			// Another reconcile moved the instance on meanwhile: this one decided from a
			// stale copy (the cache lagging behind its own writes), so its changes must
			// not be laid over the newer state; the Proxy is reconciled again instead.
			return fmt.Errorf("proxy %s: instance %q (spec hash %q) changed to %q (%q) meanwhile: %w",
				key, s.orig.ProviderID, s.orig.SpecHash, fresh.Status.ProviderID, fresh.Status.SpecHash, errStaleRead)
		}
		s.base = fresh.DeepCopy()
		layOwned(&fresh.Status, s.orig, want)
		*s.px = *fresh
	}
}

// written records px as what the server now holds: the base of the next patch and of
// the reconciler's next changes. s.px keeps its identity.
func (s *scope) written(px *v1alpha1.Proxy) {
	if px != s.px {
		px.DeepCopyInto(s.px)
	}
	s.base = s.px.DeepCopy()
	s.orig = s.px.Status.DeepCopy()
}

func (r *ProxyReconciler) reader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

// errStaleRead: a reconcile decided from a copy of the Proxy older than the server's in
// the fields it decides from; Reconcile runs again rather than write.
var errStaleRead = errors.New("the reconcile read a stale copy; reconciling again")

// stale reports a fresh status whose instance fields (the ones the reconciler decides
// from, which only the reconciler writes) differ from those the reconcile started from.
// The health engine's writes never touch them, so its conflicts are laid over as before.
func stale(started, fresh *v1alpha1.ProxyStatus) bool {
	return started.ProviderID != fresh.ProviderID || started.SpecHash != fresh.SpecHash
}

// layOwned copies onto dst each field the reconciler owns that want changed relative to
// old (the status the reconciler's changes started from, not an intermediate re-read),
// leaving the health engine's fields (healthy, Healthy, probe data) as dst has them. The
// reconciler's conditions are Provisioned, ConfigOutdated and Preempted.
func layOwned(dst, old, want *v1alpha1.ProxyStatus) {
	if want.Phase != old.Phase && !(want.Phase == v1alpha1.PhaseRunning && dst.Phase == v1alpha1.PhaseReady) {
		dst.Phase = want.Phase
	}
	if want.ProviderID != old.ProviderID {
		dst.ProviderID = want.ProviderID
	}
	if want.IP != old.IP {
		dst.IP = want.IP
	}
	if want.SpecHash != old.SpecHash {
		dst.SpecHash = want.SpecHash
	}
	if want.RenderedHash != old.RenderedHash {
		dst.RenderedHash = want.RenderedHash
	}
	if want.CredentialsSecret != old.CredentialsSecret {
		dst.CredentialsSecret = want.CredentialsSecret
	}
	if want.ObservedReplace != old.ObservedReplace {
		dst.ObservedReplace = want.ObservedReplace
	}
	if want.Message != old.Message {
		dst.Message = want.Message
	}
	dst.ObservedGeneration = want.ObservedGeneration
	for _, typ := range []string{v1alpha1.ConditionProvisioned, v1alpha1.ConditionConfigOutdated, v1alpha1.ConditionPreempted} {
		wc := meta.FindStatusCondition(want.Conditions, typ)
		oc := meta.FindStatusCondition(old.Conditions, typ)
		switch {
		case wc != nil && (oc == nil || !equality.Semantic.DeepEqual(*wc, *oc)):
			meta.SetStatusCondition(&dst.Conditions, *wc)
		case wc == nil && oc != nil:
			meta.RemoveStatusCondition(&dst.Conditions, typ)
		}
	}
}
