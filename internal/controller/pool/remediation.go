package pool

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
)

// The pool's view of remediation: its children are one group, whose brake
// (spec.remediation.maxUnhealthy, else the manager's --max-unhealthy) the pool shows as
// a condition. Each child's reconcile decides and acts for the child itself.

// remediationBrake sets the pool's RemediationAllowed condition from its children's
// states, with a Warning Event TooManyUnhealthy when the brake engages and a Normal
// RemediationResumed when it releases, and returns how soon a child's timeout may
// change the count (0: no such time).
func (r *ProxyPoolReconciler) remediationBrake(s *poolScope) time.Duration {
	pool := s.pool
	var states []remediation.State
	rem := pool.Spec.Template.Spec.Remediation
	for _, c := range s.children {
		st, _ := remediation.FromProxy(c.px)
		if rem != nil && rem.BootTimeout != nil {
			st.BootTimeout = rem.BootTimeout.Duration
		}
		if rem != nil && rem.UnhealthyTimeout != nil {
			st.UnhealthyTimeout = rem.UnhealthyTimeout.Duration
		}
		if r.ProbeTarget != nil {
			st.TargetDown, _ = r.ProbeTarget.ProbeTargetDown()
			st.TargetUpSince = r.ProbeTarget.ProbeTargetUpSince()
		}
		states = append(states, st)
	}
	group := remediation.PoolGroup(pool.Namespace, pool.Name)
	var groups map[string]remediation.GroupSpec
	if pr := pool.Spec.Remediation; pr != nil && pr.MaxUnhealthy != nil {
		groups = map[string]remediation.GroupSpec{group: {MaxUnhealthy: *pr.MaxUnhealthy,
			Field: fmt.Sprintf("proxy pool %s/%s: spec.remediation.maxUnhealthy", pool.Namespace, pool.Name)}}
	}
	res, _ := remediation.Plan(remediation.Input{Now: s.now, Policy: r.Remediation, Proxies: states, Groups: groups})
	g := remediation.GroupState{Name: group, Message: "no children: remediation allowed"}
	for _, gs := range res.Groups {
		if gs.Name == group {
			g = gs
		}
	}
	remediation.ObserveGroup(g)
	c := metav1.Condition{Type: common.PoolConditionRemediationAllowed, Status: metav1.ConditionTrue, Reason: common.PoolReasonWithinMaxUnhealthy,
		Message: g.Message, ObservedGeneration: pool.Generation}
	if g.Held {
		c.Status, c.Reason = metav1.ConditionFalse, remediation.ReasonTooManyUnhealthy
	}
	was := meta.FindStatusCondition(s.base.Status.Conditions, common.PoolConditionRemediationAllowed)
	meta.SetStatusCondition(&pool.Status.Conditions, c)
	switch {
	case g.Held && (was == nil || was.Status != metav1.ConditionFalse):
		r.event(pool, corev1.EventTypeWarning, remediation.ReasonTooManyUnhealthy, common.ActionReconcile, "%s", g.Message)
	case !g.Held && was != nil && was.Status == metav1.ConditionFalse:
		r.event(pool, corev1.EventTypeNormal, common.EventRemediationResumed, common.ActionReconcile, "%s", g.Message)
	}
	if res.Next.IsZero() {
		return 0
	}
	return res.Next.Sub(s.now)
}
