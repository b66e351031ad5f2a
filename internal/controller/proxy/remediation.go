package proxy

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
)

// The reconciler's side of remediation (internal/remediation decides): each reconcile of
// a Managed Proxy whose instance exists gathers the States of its group (its pool's
// children, or the standalone Proxies of its provider host or zone), plans, and carries
// out the decision for the Proxy itself: a reboot through the provider, or a
// replacement (a standalone Proxy's instance is deleted and built again; a pool child is
// marked with common.RemediationReplaceAnnotation and its pool replaces it surge-first). The
// Record lives in remediation.RecordAnnotation, the outcome in the Remediating condition.

// DefaultRemediationMaxAttempts is spec.remediation.maxAttempts when unset: a reboot and
// four replacements, 3+6+12+24 minutes of waits after the first timeout.
const DefaultRemediationMaxAttempts = 5

// notRemediableHandedOver: a pool child marked for replacement is the pool's now.
const notRemediableHandedOver = "handed to its pool for a replacement"

// remediate plans for s.px, whose instance id of provider p exists (running, or booting
// without an address: booting), and carries the decision out. It returns when to look
// again (0: only a change of the Proxy matters) and whether the instance was deleted for
// a replacement (the caller then creates it again).
func (r *ProxyReconciler) remediate(ctx context.Context, s *scope, p provider.Provider, booting bool) (time.Duration, bool, error) {
	px := s.px
	now := r.Clock.Now()
	self, err := remediation.FromProxy(px)
	if err != nil {
		s.log.Error(err, "ignoring the remediation record; the next attempt starts over")
	}
	if held, _ := r.brakes.Load(self.Group); self.Healthy && self.Record == nil && held != true {
		// Nothing to do, and no brake of its provider's to release: its group is not
		// gathered. (A pool's brake is the pool reconciler's to release.)
		meta.RemoveStatusCondition(&px.Status.Conditions, remediation.ConditionRemediating)
		return 0, false, nil
	}
	pool, err := r.controllingPool(ctx, px)
	if err != nil {
		return 0, false, err
	}
	members, groups, err := r.remediationGroup(ctx, px, pool)
	if err != nil {
		return 0, false, err
	}
	spec := remediationSpec(px, pool)
	states := []remediation.State{r.remediationState(px, spec, booting)}
	for i := range members {
		m := &members[i]
		if m.UID == px.UID {
			continue
		}
		states = append(states, r.remediationState(m, remediationSpec(m, pool), false))
	}
	res, err := remediation.Plan(remediation.Input{Now: now, Policy: r.Remediation, Proxies: states, Groups: groups})
	if err != nil {
		s.log.Error(err, "remediation brake") // the group is held; its message says why
	}
	for _, g := range res.Groups {
		remediation.ObserveGroup(g)
		if pool == nil {
			r.reportHostBrake(ctx, px.Spec.Provider, g)
		}
	}
	d := res.Decisions[0]
	s.log.V(1).Info("remediation", "decision", d.Message, "action", d.Action)
	maxAttempts := int32(DefaultRemediationMaxAttempts)
	if spec != nil && spec.MaxAttempts != nil {
		maxAttempts = *spec.MaxAttempts
	}
	replaced := false
	switch {
	case d.Action != "" && d.Record.Attempt > maxAttempts:
		c := exhausted(self.Record, maxAttempts)
		if remediation.SetCondition(px, c, now) {
			s.event(corev1.EventTypeWarning, common.ReasonAttemptsExhausted, common.ActionReconcile, "%s", c.Message)
		}
		return 0, false, nil
	case d.Action == remediation.ActionReboot:
		// The record goes first, with the version read: a reconcile that decided from a
		// stale copy (the last attempt's record not in its cache yet) is refused there
		// and acts on nothing. A reboot that fails after it counts as made: the next
		// attempt, after its wait, replaces.
		rb, ok := provider.RebooterOf(p)
		if !ok {
			return 0, false, fmt.Errorf("remediation: provider %s cannot reboot", px.Spec.Provider)
		}
		if err := r.patchRemediation(ctx, s, d.Record, false); err != nil {
			return 0, false, err
		}
		if err := rb.Reboot(ctx, px.Status.ProviderID); err != nil {
			s.event(corev1.EventTypeWarning, d.Record.Reason, string(remediation.ActionReboot), "rebooting instance %s failed: %v; the next attempt replaces it", px.Status.ProviderID, err)
			return 0, false, fmt.Errorf("remediation: rebooting instance %s: %w", px.Status.ProviderID, err)
		}
	case d.Action == remediation.ActionReplace && pool != nil:
		if err := r.patchRemediation(ctx, s, d.Record, true); err != nil {
			return 0, false, err
		}
	case d.Action == remediation.ActionReplace:
		if err := r.patchRemediation(ctx, s, d.Record, false); err != nil {
			return 0, false, err
		}
		if err := r.replace(ctx, s, p, px.Status.ProviderID, "remediation attempt "+fmt.Sprint(d.Record.Attempt)); err != nil {
			return 0, false, err
		}
		replaced = true
	default:
		if err := r.patchRemediation(ctx, s, d.Record, false); err != nil {
			return 0, false, err
		}
	}
	remediation.ObserveConcluded(d.Concluded)
	changed := remediation.SetCondition(px, d.Condition, now)
	switch {
	case d.Action != "":
		s.event(corev1.EventTypeWarning, d.Record.Reason, string(d.Action), "%s", d.Condition.Message)
	case changed && d.Held:
		s.event(corev1.EventTypeWarning, d.Condition.Reason, common.ActionReconcile, "%s", d.Condition.Message)
	case d.Concluded != nil && d.Concluded.Outcome == remediation.OutcomeSucceeded:
		s.event(corev1.EventTypeNormal, "Remediated", common.ActionReconcile, "%s", d.Message)
	}
	if d.Next.IsZero() || replaced {
		return 0, replaced, nil
	}
	return max(d.Next.Sub(now), time.Second), replaced, nil
}

// reportHostBrake records, on the provider's ProviderHealth, a Warning Event
// TooManyUnhealthy when the brake of its standalone Proxies (group g) engages and a
// Normal RemediationResumed when it releases, once per change as this process saw it.
func (r *ProxyReconciler) reportHostBrake(ctx context.Context, providerName string, g remediation.GroupState) {
	prev, _ := r.brakes.Swap(g.Name, g.Held)
	if was, _ := prev.(bool); was == g.Held || r.NoProviderEvents || r.Recorder == nil { // unseen: not engaged
		return
	}
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	ph := &v1alpha1.ProviderHealth{}
	if err := reader.Get(ctx, client.ObjectKey{Name: providerName}, ph); err != nil {
		ctrl.LoggerFrom(ctx).V(1).Info("no ProviderHealth to report the remediation brake on", "provider", providerName, "error", err.Error())
		return
	}
	if g.Held {
		r.Recorder.Eventf(ph, nil, corev1.EventTypeWarning, remediation.ReasonTooManyUnhealthy, common.ActionReconcile, "standalone proxies of %s: %s", g.Name, g.Message)
		return
	}
	r.Recorder.Eventf(ph, nil, corev1.EventTypeNormal, common.EventRemediationResumed, common.ActionReconcile, "standalone proxies of %s: %s", g.Name, g.Message)
}

// exhausted is the Remediating condition of a Proxy remediation gave up on after rec,
// its last attempt, of maxAttempts: False, AttemptsExhausted, saying what the user does.
func exhausted(rec *remediation.Record, maxAttempts int32) *metav1.Condition {
	msg := fmt.Sprintf("gave up after %d attempts (spec.remediation.maxAttempts %d; the last, %s at %s, did not mend it): %s. Fix the cause, then delete the Proxy's instance with the annotation %s, or remove the annotation %s to start over",
		rec.Attempt, maxAttempts, rec.Action, rec.At.Format(time.RFC3339), remediationFault(rec), v1alpha1.ReplaceAnnotation, remediation.RecordAnnotation)
	return &metav1.Condition{Type: remediation.ConditionRemediating, Status: metav1.ConditionFalse, Reason: common.ReasonAttemptsExhausted, Message: msg}
}

// remediationFault says what fault rec was made for.
func remediationFault(rec *remediation.Record) string {
	if rec.Reason == remediation.ReasonBootTimeout {
		return fmt.Sprintf("the proxy has not answered a probe since its instance started at %s (boot timeout)", rec.FaultSince.Format(time.RFC3339))
	}
	return fmt.Sprintf("the proxy has failed its probes since %s (unhealthy timeout)", rec.FaultSince.Format(time.RFC3339))
}

// controllingPool is the ProxyPool that controls px, nil for a standalone Proxy (or one
// whose pool is gone).
func (r *ProxyReconciler) controllingPool(ctx context.Context, px *v1alpha1.Proxy) (*v1alpha1.ProxyPool, error) {
	ref, ok := v1alpha1.ControllingPool(px)
	if !ok {
		return nil, nil
	}
	pool := &v1alpha1.ProxyPool{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: px.Namespace, Name: ref.Name}, pool)
	switch {
	case apierrors.IsNotFound(err) || (err == nil && pool.UID != ref.UID):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("getting proxy pool %s/%s of proxy %s: %w", px.Namespace, ref.Name, px.Name, err)
	}
	return pool, nil
}

// remediationGroup lists the members of px's group (the pool's children, or the
// standalone Managed Proxies of its provider and zone) and the group's own brake.
func (r *ProxyReconciler) remediationGroup(ctx context.Context, px *v1alpha1.Proxy, pool *v1alpha1.ProxyPool) ([]v1alpha1.Proxy, map[string]remediation.GroupSpec, error) {
	list := &v1alpha1.ProxyList{}
	if pool != nil {
		if err := r.Client.List(ctx, list, client.InNamespace(pool.Namespace), client.MatchingLabels{v1alpha1.PoolLabel: pool.Name}); err != nil {
			return nil, nil, fmt.Errorf("listing the children of proxy pool %s/%s: %w", pool.Namespace, pool.Name, err)
		}
		var out []v1alpha1.Proxy
		for _, m := range list.Items {
			if metav1.IsControlledBy(&m, pool) {
				out = append(out, m)
			}
		}
		var groups map[string]remediation.GroupSpec
		if rem := pool.Spec.Remediation; rem != nil && rem.MaxUnhealthy != nil {
			groups = map[string]remediation.GroupSpec{remediation.PoolGroup(pool.Namespace, pool.Name): {
				MaxUnhealthy: *rem.MaxUnhealthy, Field: fmt.Sprintf("proxy pool %s/%s: spec.remediation.maxUnhealthy", pool.Namespace, pool.Name)}}
		}
		return out, groups, nil
	}
	if err := r.Client.List(ctx, list); err != nil {
		return nil, nil, fmt.Errorf("listing proxies for the remediation group of provider %s: %w", px.Spec.Provider, err)
	}
	var out []v1alpha1.Proxy
	for _, m := range list.Items {
		if standaloneOf(&m, px.Spec.Provider) && m.Spec.Placement.Zone == px.Spec.Placement.Zone {
			out = append(out, m)
		}
	}
	return out, nil, nil
}

// standaloneOf reports whether m is a standalone Managed Proxy of provider: a member of
// one of the provider's host groups, not of a pool's.
func standaloneOf(m *v1alpha1.Proxy, provider string) bool {
	_, pooled := v1alpha1.ControllingPool(m)
	return m.Spec.Mode != v1alpha1.ProxyModeExternal && !pooled && m.Spec.Provider == provider
}

// ProviderRemediation is the RemediationAllowed condition of provider's ProviderHealth
// at now: the brake of each host group of its standalone Proxies (one per zone), worked
// out from the Proxies as the reconciler would. False (TooManyUnhealthy) naming every
// held group and its counts, True (WithinMaxUnhealthy) otherwise. The provider health
// monitor publishes it every round, so it is right again after a restart even where no
// reconcile has looked at the group.
func (r *ProxyReconciler) ProviderRemediation(ctx context.Context, providerName string, now time.Time) (metav1.Condition, error) {
	list := &v1alpha1.ProxyList{}
	if err := r.Client.List(ctx, list); err != nil {
		return metav1.Condition{}, fmt.Errorf("listing proxies for the remediation brake of provider %s: %w", providerName, err)
	}
	var states []remediation.State
	for i := range list.Items {
		if m := &list.Items[i]; standaloneOf(m, providerName) {
			states = append(states, r.remediationState(m, m.Spec.Remediation, false))
		}
	}
	res, _ := remediation.Plan(remediation.Input{Now: now, Policy: r.Remediation, Proxies: states}) // a held group's message says why
	c := metav1.Condition{Type: common.ConditionRemediationAllowed, Status: metav1.ConditionTrue, Reason: common.PoolReasonWithinMaxUnhealthy}
	var held, allowed []string
	for _, g := range res.Groups {
		line := "standalone proxies of " + g.Name + ": " + g.Message
		if g.Held {
			held = append(held, line)
		} else {
			allowed = append(allowed, line)
		}
	}
	switch {
	case len(held) > 0:
		c.Status, c.Reason = metav1.ConditionFalse, remediation.ReasonTooManyUnhealthy
		c.Message = strings.Join(held, "; ")
	case len(allowed) > 0:
		c.Message = strings.Join(allowed, "; ")
	default:
		c.Message = "no standalone Managed proxies of provider " + providerName + ": remediation allowed"
	}
	return c, nil
}

// remediationSpec is the spec.remediation that applies to px: its pool's template's for
// a pool child (read afresh, so a changed template applies without replacing children),
// else its own.
func remediationSpec(px *v1alpha1.Proxy, pool *v1alpha1.ProxyPool) *v1alpha1.ProxyRemediation {
	if pool != nil && metav1.IsControlledBy(px, pool) {
		return pool.Spec.Template.Spec.Remediation
	}
	return px.Spec.Remediation
}

// remediationState is px's State with what the Proxy does not say: whether its provider
// reboots, the probe target, its timeouts. booting: its instance runs without an
// address yet, so its boot clock starts when its build began.
func (r *ProxyReconciler) remediationState(px *v1alpha1.Proxy, spec *v1alpha1.ProxyRemediation, booting bool) remediation.State {
	st, _ := remediation.FromProxy(px) // a bad record is logged for the Proxy itself
	if p, ok := r.Providers[px.Spec.Provider]; ok {
		_, st.CanReboot = provider.RebooterOf(p)
	}
	if booting && st.Started.IsZero() {
		if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned); c != nil && c.Status == metav1.ConditionFalse {
			st.Started = c.LastTransitionTime.Time
		}
	}
	if r.ProbeTarget != nil {
		st.TargetDown, _ = r.ProbeTarget.ProbeTargetDown()
		st.TargetUpSince = r.ProbeTarget.ProbeTargetUpSince()
	}
	switch {
	case st.NotRemediable != "":
	case px.Annotations[common.RemediationReplaceAnnotation] != "":
		st.NotRemediable = notRemediableHandedOver
	case spec != nil && spec.Disabled:
		st.NotRemediable = "spec.remediation.disabled is true"
	}
	if spec != nil {
		if spec.BootTimeout != nil {
			st.BootTimeout = spec.BootTimeout.Duration
		}
		if spec.UnhealthyTimeout != nil {
			st.UnhealthyTimeout = spec.UnhealthyTimeout.Duration
		}
	}
	return st
}

// patchRemediation writes rec to the Proxy's RecordAnnotation (nil: removes it) and,
// with handOver, marks it for its pool to replace (common.RemediationReplaceAnnotation). Only
// the annotations are patched; the reconcile's status changes are kept, and its status
// write carries the new version.
func (r *ProxyReconciler) patchRemediation(ctx context.Context, s *scope, rec *remediation.Record, handOver bool) error {
	obj := s.base.DeepCopy()
	before := obj.DeepCopy()
	changed := remediation.SetRecord(obj, rec)
	if handOver && obj.Annotations[common.RemediationReplaceAnnotation] == "" {
		obj.Annotations[common.RemediationReplaceAnnotation] = rec.At.Format(time.RFC3339)
		changed = true
	}
	if !changed {
		return nil
	}
	err := r.Client.Patch(ctx, obj, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	switch {
	case apierrors.IsConflict(err):
		return fmt.Errorf("writing the remediation record of proxy %s: %w", s.px.Name, errStaleRead)
	case err != nil:
		return fmt.Errorf("writing the remediation record of proxy %s: %w", s.px.Name, err)
	}
	for _, px := range []*v1alpha1.Proxy{s.px, s.base} {
		px.Annotations, px.ResourceVersion = maps.Clone(obj.Annotations), obj.ResourceVersion
	}
	if s.lock != "" {
		s.lock = obj.ResourceVersion
	}
	return nil
}
