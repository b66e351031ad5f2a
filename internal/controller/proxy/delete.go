package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// reconcileDelete removes the Proxy's instance, then lets the Proxy go.
func (r *ProxyReconciler) reconcileDelete(ctx context.Context, s *scope) (ctrl.Result, error) {
	px := s.px
	if !controllerutil.ContainsFinalizer(px, Finalizer) {
		s.gone = true
		return ctrl.Result{}, nil
	}
	if mayHaveInstance(px) {
		p, ok := r.Providers[px.Spec.Provider]
		if !ok {
			s.event(corev1.EventTypeWarning, v1alpha1.ReasonInstanceLeftBehind, common.ActionDelete,
				"provider %q is not configured: instance %s, if it exists, is left behind", px.Spec.Provider, px.InstanceName())
		} else if left, until := r.drainLeft(px); left > 0 {
			return r.drain(ctx, s, left, until)
		} else if err := r.deleteInstance(ctx, s, p); err != nil {
			return r.providerError(s, common.ActionDelete, err, false)
		}
	}
	r.forgetAddressHold(px.UID)
	base := s.px.DeepCopy()
	controllerutil.RemoveFinalizer(s.px, Finalizer)
	if err := r.Client.Patch(ctx, s.px, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, fmt.Errorf("removing finalizer from proxy %s: %w", client.ObjectKeyFromObject(s.px), err)
	}
	s.gone = true
	return ctrl.Result{}, nil
}

// drainLeft is how much longer the instance of a deleted Proxy is kept, and until
// when: DeletionDrain from the deletion timestamp, for a Proxy the health engine last
// held healthy (discovery and its pool's EndpointSlice may have handed it out until the
// deletion). The engine stops probing a Proxy once it is being deleted, so
// status.healthy stays as it was at the deletion, through every reconcile of the drain.
// The drain is counted from the timestamp, not from when this reconciler saw it, so a
// manager restarted mid-drain neither starts it afresh nor skips it.
func (r *ProxyReconciler) drainLeft(px *v1alpha1.Proxy) (time.Duration, time.Time) {
	if r.DeletionDrain <= 0 || !px.Status.Healthy || px.DeletionTimestamp == nil {
		return 0, time.Time{}
	}
	until := px.DeletionTimestamp.Add(r.DeletionDrain)
	return until.Sub(r.Clock.Now()), until
}

// drain shows Deleting with the time the instance goes, and looks again then.
func (r *ProxyReconciler) drain(ctx context.Context, s *scope, left time.Duration, until time.Time) (ctrl.Result, error) {
	msg := fmt.Sprintf("draining until %s (deletion drain %s), then deleting instance %s: the proxy left discovery when its deletion began; requests it was handed before then may still be in flight",
		until.UTC().Format(time.RFC3339), r.DeletionDrain, s.px.InstanceName())
	if err := r.showDeleting(ctx, s, msg); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: left}, nil
}

// showDeleting writes phase Deleting and Provisioned False, both saying msg.
func (r *ProxyReconciler) showDeleting(ctx context.Context, s *scope, msg string) error {
	s.setPhase(v1alpha1.PhaseDeleting, v1alpha1.ReasonDeleting, msg)
	s.setProvisioned(metav1.ConditionFalse, v1alpha1.ReasonDeleting, msg)
	return r.applyStatus(ctx, s)
}

// mayHaveInstance: a recorded providerID, or a Proxy that got as far as asking its
// provider (the status write after a Create may have been lost) and has not been
// published as External since. It reads the status, not spec.mode: a Proxy switched
// from Managed to External still has its Managed status until the switch is reconciled.
func mayHaveInstance(px *v1alpha1.Proxy) bool {
	if px.Status.ProviderID != "" {
		return true
	}
	switch px.Status.Phase {
	case "", v1alpha1.PhasePending:
		return false
	}
	c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned)
	return c == nil || c.Reason != v1alpha1.ReasonExternal
}

// deleteInstance shows Deleting and deletes every instance of the Proxy. An instance the
// provider can never delete (a permanent error) is reported and left behind, so the
// Proxy does not hang on its finalizer for ever.
func (r *ProxyReconciler) deleteInstance(ctx context.Context, s *scope, p provider.Provider) error {
	px := s.px
	if err := r.showDeleting(ctx, s, fmt.Sprintf("deleting instance %s", px.InstanceName())); err != nil {
		return err
	}
	ids, err := r.instanceIDs(ctx, px, p)
	if errors.Is(err, provider.ErrPermanent) {
		s.event(corev1.EventTypeWarning, v1alpha1.ReasonInstanceLeftBehind, common.ActionList,
			"cannot look for instance %s, it is left behind if it exists: %v", px.InstanceName(), err)
		return nil
	}
	if err != nil {
		return err
	}
	for _, id := range ids {
		err := p.Delete(ctx, id)
		switch {
		case s.leftBehind(id, err):
		case errors.Is(err, provider.ErrPermanent):
			s.event(corev1.EventTypeWarning, v1alpha1.ReasonInstanceLeftBehind, common.ActionDelete,
				"instance %s cannot be deleted and is left behind: %v", id, err)
		case err != nil:
			return fmt.Errorf("deleting instance %s: %w", id, err)
		default:
			s.event(corev1.EventTypeNormal, EventInstanceDeleted, common.ActionDelete, "deleted instance %s", id)
		}
	}
	return nil
}

// leftBehind reports a Delete error saying that the instance may still exist in a place
// the provider can no longer reach or name (provider.ErrLeftBehind), and records it as a
// Warning InstanceLeftBehind Event whose note is the provider's message (kvm2 names the
// host and the virsh commands that remove it by hand). The caller then goes on as if the
// instance were deleted: nothing the operator can do will delete it.
func (s *scope) leftBehind(id string, err error) bool {
	if !errors.Is(err, provider.ErrLeftBehind) {
		return false
	}
	s.log.Info("instance left behind", "providerID", id, "error", err.Error())
	s.event(corev1.EventTypeWarning, v1alpha1.ReasonInstanceLeftBehind, common.ActionDelete, "%v", err)
	return true
}

// instanceIDs returns the recorded providerID or, when none was recorded, the instances
// the provider lists as owned by this Proxy.
func (r *ProxyReconciler) instanceIDs(ctx context.Context, px *v1alpha1.Proxy, p provider.Provider) ([]string, error) {
	if px.Status.ProviderID != "" {
		return []string{px.Status.ProviderID}, nil
	}
	insts, err := p.ListByTag(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing instances of provider %s to find %s: %w", px.Spec.Provider, px.InstanceName(), err)
	}
	var ids []string
	for _, inst := range insts {
		if inst.UID == string(px.UID) {
			ids = append(ids, inst.ProviderID)
		}
	}
	return ids, nil
}
