package controller

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// poolCounts are the figures of the pool's status.
type poolCounts struct {
	replicas, ready, available, upToDate int32
	good, stale, deleting, failed        int32
}

func (s *poolScope) counts() poolCounts {
	var n poolCounts
	for i := range s.info {
		c := &s.info[i]
		n.replicas++
		if c.deleting {
			n.deleting++
			continue
		}
		if c.ready {
			n.ready++
		}
		if c.available {
			n.available++
		}
		if c.upToDate {
			n.upToDate++
		}
		if c.failed {
			n.failed++
		}
		if c.good() {
			n.good++
		} else {
			n.stale++
		}
	}
	return n
}

// patchPoolStatus writes the status from what this reconcile saw and did.
func (r *ProxyPoolReconciler) patchPoolStatus(ctx context.Context, s *poolScope) error {
	pool := s.pool
	n := s.counts()
	st := &pool.Status
	st.Replicas, st.ReadyReplicas, st.AvailableReplicas, st.UpToDateReplicas = n.replicas, n.ready, n.available, n.upToDate
	st.Selector = v1alpha1.PoolLabel + "=" + pool.Name
	st.ObservedGeneration = pool.Generation
	s.setConditions(n)
	if equality.Semantic.DeepEqual(s.base.Status, pool.Status) {
		return nil
	}
	if err := r.Client.Status().Patch(ctx, pool, client.MergeFrom(s.base)); err != nil {
		return fmt.Errorf("patching status of proxy pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	return nil
}

func (s *poolScope) setConditions(n poolCounts) {
	pool := s.pool
	set := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&pool.Status.Conditions, metav1.Condition{
			Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: pool.Generation,
		})
	}
	minAvailable := max(s.replicas-s.unavail, 0)
	if n.available >= minAvailable {
		set(v1alpha1.PoolConditionAvailable, metav1.ConditionTrue, v1alpha1.PoolReasonMinimumAvailable,
			fmt.Sprintf("%d of %d children available (at least %d needed)", n.available, s.replicas, minAvailable))
	} else {
		set(v1alpha1.PoolConditionAvailable, metav1.ConditionFalse, v1alpha1.PoolReasonMinimumUnavailable,
			fmt.Sprintf("%d of %d children available, %d needed", n.available, s.replicas, minAvailable))
	}

	if s.placementMessage == "" {
		set(v1alpha1.PoolConditionPlacementValid, metav1.ConditionTrue, v1alpha1.PoolReasonPlacementValid,
			"every placement names a configured provider and zone")
	} else {
		set(v1alpha1.PoolConditionPlacementValid, metav1.ConditionFalse, s.placementReason, s.placementMessage)
	}

	status, reason, msg := s.progress(n)
	set(v1alpha1.PoolConditionProgressing, status, reason, msg)
}

// progress is the Progressing condition: what the pool is doing, or why it is not.
func (s *poolScope) progress(n poolCounts) (metav1.ConditionStatus, string, string) {
	r := s.replicas
	live := n.replicas - n.deleting
	switch {
	case s.specErr != nil:
		return metav1.ConditionFalse, v1alpha1.PoolReasonStalled, s.specErr.Error()
	case s.plan.stalled:
		return metav1.ConditionFalse, v1alpha1.PoolReasonStalled, s.stalledMessage()
	case n.stale == 0 && n.deleting == 0 && live == r && n.available == r:
		return metav1.ConditionFalse, v1alpha1.PoolReasonComplete,
			fmt.Sprintf("%d of %d children up to date and available", n.available, r)
	case n.stale > 0 && n.upToDate < live:
		return metav1.ConditionTrue, v1alpha1.PoolReasonRollingOut,
			fmt.Sprintf("%d of %d children up to date, %d available", n.upToDate, r, n.available)
	case n.stale > 0:
		return metav1.ConditionTrue, v1alpha1.PoolReasonReplacing,
			fmt.Sprintf("replacing %d children (cordoned, failed or past their deadline), %d of %d available", n.stale, n.available, r)
	case n.good < r:
		return metav1.ConditionTrue, v1alpha1.PoolReasonScalingUp, fmt.Sprintf("%d of %d children exist", n.good, r)
	case live > r || n.deleting > 0:
		return metav1.ConditionTrue, v1alpha1.PoolReasonScalingDown, fmt.Sprintf("%d children, %d wanted", live, r)
	default:
		return metav1.ConditionTrue, v1alpha1.PoolReasonWaitingForAvailable,
			fmt.Sprintf("%d of %d children available (minReadySeconds %d)", n.available, r, s.pool.Spec.MinReadySeconds)
	}
}

func (s *poolScope) stalledMessage() string {
	n := s.counts()
	return fmt.Sprintf("%d children need replacing (%d Failed) but none can be replaced now: %d available, at least %d must stay available (maxUnavailable %d) and at most %d may exist (maxSurge %d); a Failed child is deleted only once a replacement is available",
		n.stale, n.failed, n.available, max(s.replicas-s.unavail, 0), s.unavail, s.replicas+s.surge, s.surge)
}

// wasStalled: the status already says so (the Event is recorded once per stall).
func (s *poolScope) wasStalled() bool {
	c := meta.FindStatusCondition(s.base.Status.Conditions, v1alpha1.PoolConditionProgressing)
	return c != nil && c.Reason == v1alpha1.PoolReasonStalled
}
