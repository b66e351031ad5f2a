package pool

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
)

// poolCounts are the figures of the pool's status.
type poolCounts struct {
	replicas, ready, available, upToDate int32
	good, stale, deleting, failed        int32
}

func (s *poolScope) counts() poolCounts {
	var n poolCounts
	for i := range s.children {
		c := &s.children[i]
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
		if c.upToDate && !c.outdated {
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

// applyPoolStatus writes the status from what this reconcile saw and did. The pool
// reconciler applies all of it as proxypool-controller but saturatedSites and the
// Saturated condition, which the ban controller applies (poolStatusOf).
func (r *ProxyPoolReconciler) applyPoolStatus(ctx context.Context, s *poolScope) error {
	pool := s.pool
	n := s.counts()
	st := &pool.Status
	st.Replicas, st.ReadyReplicas, st.AvailableReplicas, st.UpToDateReplicas = n.replicas, n.ready, n.available, n.upToDate
	st.Selector = v1alpha1.PoolLabel + "=" + pool.Name
	st.ObservedGeneration = pool.Generation
	if !s.progressAt.IsZero() {
		st.LastProgressTime = ptr.To(metav1.NewTime(s.progressAt))
	}
	s.setConditions(n)
	s.setEgressIdentities()
	s.setEgressExhausted()
	if equality.Semantic.DeepEqual(s.base.Status, pool.Status) {
		recordPoolMetrics(s, n)
		return nil
	}
	if err := statusapply.Status(ctx, r.Client, pool, poolStatusOf(&pool.Status), statusapply.ProxyPoolController); err != nil {
		return fmt.Errorf("applying status of proxy pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	// The gauges follow the status the API server holds: set once it has taken it, so a
	// scrape never shows counts a reader of the pool cannot see yet (or ever, when the
	// apply fails).
	recordPoolMetrics(s, n)
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
	common.SetKstatus(&pool.Status.Conditions, pool.Generation, common.PoolKstate(pool.Status.Conditions))
}

// progress is the Progressing condition: what the pool is doing, or why it is not.
func (s *poolScope) progress(n poolCounts) (metav1.ConditionStatus, string, string) {
	r := s.replicas
	live := n.replicas - n.deleting
	switch {
	case s.specErr != nil:
		return metav1.ConditionFalse, v1alpha1.PoolReasonStalled, s.specErr.Error()
	case s.credErr != nil:
		return metav1.ConditionFalse, v1alpha1.PoolReasonCredentialsUnavailable,
			fmt.Sprintf("%v; the pool creates and deletes no children until the Secret can be read, and its children keep running as they are", s.credErr)
	case s.deadlineExceeded():
		return metav1.ConditionFalse, v1alpha1.PoolReasonProgressDeadlineExceeded, s.deadlineMessage()
	case s.plan.stalled:
		return metav1.ConditionFalse, v1alpha1.PoolReasonStalled, s.stalledMessage()
	case s.complete():
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

// complete: replicas children, all up to date and available, none being deleted.
func (s *poolScope) complete() bool {
	n := s.counts()
	return n.stale == 0 && n.deleting == 0 && n.replicas == s.replicas && n.available == s.replicas
}

// trackProgress sets progressAt, the last time the pool saw progress: a spec change, the
// pool ceasing to be complete, a child finishing its deletion (fewer children than the
// last status counted: only the pool makes them), or a child becoming Ready or
// available (by its Healthy condition's transition, and minReadySeconds after it).
func (s *poolScope) trackProgress() {
	st := &s.base.Status
	var at time.Time
	if st.LastProgressTime != nil {
		at = st.LastProgressTime.Time
	}
	prev := meta.FindStatusCondition(st.Conditions, v1alpha1.PoolConditionProgressing)
	switch {
	case at.IsZero(), st.ObservedGeneration != s.pool.Generation, int(st.Replicas) > len(s.children),
		prev != nil && prev.Reason == v1alpha1.PoolReasonComplete && !s.complete():
		at = s.now
	}
	for i := range s.children {
		c, px := &s.children[i], s.children[i].px
		if !c.ready || c.deleting {
			continue
		}
		for _, t := range []time.Time{readySince(px), readySince(px).Add(s.minReady())} {
			if t.After(at) && !t.After(s.now) {
				at = t
			}
		}
	}
	s.progressAt = at
}

// deadlineExceeded: the pool is not complete and has seen no progress for
// progressDeadlineSeconds.
func (s *poolScope) deadlineExceeded() bool {
	return s.specErr == nil && s.credErr == nil && !s.progressAt.IsZero() && !s.complete() &&
		!s.now.Before(s.progressAt.Add(s.deadline))
}

// deadlineMessage says that the pool made no progress and which children hold it:
// those stuck deleting (since when) and those never Ready (with their last probe error).
func (s *poolScope) deadlineMessage() string {
	var deleting, never, failed []string
	for i := range s.children {
		c, px := &s.children[i], s.children[i].px
		switch {
		case c.deleting:
			deleting = append(deleting, fmt.Sprintf("%s since %s", px.Name, px.DeletionTimestamp.UTC().Format(time.RFC3339)))
		case c.failed:
			failed = append(failed, fmt.Sprintf("%s (%s)", px.Name, childProblem(px)))
		case !c.ready && !hasBeenReady(px):
			never = append(never, fmt.Sprintf("%s (%s)", px.Name, childProblem(px)))
		}
	}
	msg := fmt.Sprintf("no child became available and none finished deleting for %ds (progressDeadlineSeconds) since %s",
		int64(s.deadline/time.Second), s.progressAt.UTC().Format(time.RFC3339))
	for _, g := range []struct {
		what  string
		names []string
	}{{"stuck deleting", deleting}, {"never Ready", never}, {"Failed", failed}} {
		if len(g.names) == 0 {
			continue
		}
		more := ""
		if len(g.names) > common.MaxNamed {
			more = fmt.Sprintf(" and %d more", len(g.names)-common.MaxNamed)
			g.names = g.names[:common.MaxNamed]
		}
		msg += fmt.Sprintf("; %s: %s%s", g.what, strings.Join(g.names, ", "), more)
	}
	return msg
}

// childProblem is a child's last probe error (its Healthy condition's message), else
// its status message, else its phase.
func childProblem(px *v1alpha1.Proxy) string {
	if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy); c != nil && c.Status != metav1.ConditionTrue && c.Message != "" {
		return c.Message
	}
	if px.Status.Message != "" {
		return px.Status.Message
	}
	if px.Status.Phase == "" {
		return "no status yet"
	}
	return "phase " + string(px.Status.Phase) + ", not probed successfully yet"
}

// reportDeadline records one Warning event when the pool starts exceeding its progress
// deadline.
// The status read from the cache may not show the condition written a pass ago yet, so
// the stall last reported (the progress time it dates from) is remembered per pool too.
func (r *ProxyPoolReconciler) reportDeadline(s *poolScope) {
	uid := s.pool.UID
	if !s.deadlineExceeded() {
		r.deadlineReported.Delete(uid)
		return
	}
	if c := meta.FindStatusCondition(s.base.Status.Conditions, v1alpha1.PoolConditionProgressing); c != nil &&
		c.Reason == v1alpha1.PoolReasonProgressDeadlineExceeded {
		return
	}
	since := s.progressAt.UTC().Format(time.RFC3339Nano)
	if prev, loaded := r.deadlineReported.Swap(uid, since); loaded && prev == since {
		return
	}
	r.event(s.pool, corev1.EventTypeWarning, EventProgressDeadlineExceeded, common.ActionReconcile, "%s", s.deadlineMessage())
}

// poolStatusOf is the part of a pool's status the pool reconciler applies: all of it but
// what proxy-bans owns (saturatedSites, retirements and the Saturated condition), what
// egress-proxies-cost owns (cost) and what the autoscaler owns (autoscaling and the
// Scaling condition).
func poolStatusOf(st *v1alpha1.ProxyPoolStatus) *v1alpha1.ProxyPoolStatus {
	own := st.DeepCopy()
	own.SaturatedSites = 0
	own.Retirements = nil
	own.Cost = nil
	own.Autoscaling = nil
	own.Conditions = slices.DeleteFunc(own.Conditions, func(c metav1.Condition) bool {
		return c.Type == v1alpha1.PoolConditionSaturated || c.Type == v1alpha1.PoolConditionScaling
	})
	return own
}
