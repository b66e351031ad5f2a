package proxy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// reconcileManaged makes sure the Proxy's instance exists, matches the spec and runs.
func (r *ProxyReconciler) reconcileManaged(ctx context.Context, s *scope) (ctrl.Result, error) {
	px := s.px
	p, ok := r.Providers[px.Spec.Provider]
	if !ok {
		return r.providerNotConfigured(s), nil
	}
	if latchedFailure(px) {
		// A permanent error stands until the spec changes; retrying cannot help.
		return ctrl.Result{}, nil
	}
	if px.Status.Phase == "" {
		s.setPhase(v1alpha1.PhasePending, EventPending,
			fmt.Sprintf("instance %s will be created by provider %s", px.InstanceName(), px.Spec.Provider))
	}
	rendered, creds, done, res, err := r.renderConfig(ctx, s) // config.go
	if done {
		return res, err
	}
	intent, err := IntentHash(px, creds, rendered.WireGuard)
	if err != nil {
		return r.providerError(s, common.ActionReconcile, err, false)
	}
	want := hashes{intent: intent, rendered: RenderedHash(px, rendered.HashInput)}

	if id := px.Status.ProviderID; id != "" {
		inst, err := p.Get(ctx, id)
		gone, isGone := judgeGone(px, err) // verdict.go
		switch {
		case isGone:
			forget(s, gone)
		case err != nil:
			return r.providerError(s, common.ActionGet, fmt.Errorf("getting instance %s: %w", id, err), false)
		default:
			v, err := r.judge(ctx, s, want, inst.State, creds, rendered.WireGuard) // verdict.go, intent.go
			switch {
			case errors.Is(err, errSnapshotTaken):
				return r.snapshotTaken(s, err), nil
			case err != nil:
				return r.providerError(s, common.ActionReconcile, err, false)
			case v.action == buildReplace:
				if err := r.replace(ctx, s, p, id, v.why); err != nil {
					return r.providerError(s, common.ActionDelete, err, true)
				}
			case v.action == buildRestart:
				// Create starts an existing instance that is not running, as it was built.
				return r.restart(ctx, s, p, rendered.UserData)
			default:
				res := r.publishInstance(s, inst)
				if inst.State != provider.StateRunning {
					return res, nil
				}
				after, replaced, err := r.remediate(ctx, s, p, inst.IP == "") // remediation.go
				if err != nil {
					return ctrl.Result{}, err
				}
				if !replaced {
					if after > 0 && (res.RequeueAfter == 0 || after < res.RequeueAfter) {
						res.RequeueAfter = after
					}
					return res, nil
				}
				// The instance was deleted for a replacement: build it again below.
			}
		}
	}
	return r.create(ctx, s, p, want, rendered.UserData, creds)
}

var preemptionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "proxy_operator_preemptions_total",
	Help: "Instances reclaimed by their cloud (Spot VMs preempted) and built again, by provider and zone.",
}, []string{"provider", "zone"})

func init() { metrics.Registry.MustRegister(preemptionsTotal) }

// forget carries out the verdict on an instance the provider no longer has: a preempted
// one is counted in its zone, the Event is recorded and the Preempted condition set; the
// instance is forgotten, to be created again.
func forget(s *scope, v goneVerdict) {
	px := s.px
	if v.preempted != nil {
		preemptionsTotal.WithLabelValues(px.Spec.Provider, v.zone).Inc()
		s.log.Info("instance preempted", "providerID", px.Status.ProviderID, "zone", v.zone, "error", v.err.Error())
		meta.SetStatusCondition(&px.Status.Conditions, *v.preempted)
	}
	s.event(v.event.typ, v.event.reason, common.ActionGet, "%s", v.event.message)
	px.Status.ProviderID, px.Status.IP, px.Status.IPv6 = "", "", ""
}

// replace deletes an instance built from an older spec (or one the replace annotation
// asks to build again), so that a new one is created.
func (r *ProxyReconciler) replace(ctx context.Context, s *scope, p provider.Provider, id, why string) error {
	px := s.px
	s.event(corev1.EventTypeNormal, EventReplacing, common.ActionDelete,
		"%s: deleting instance %s to create it again", why, id)
	s.setPhase(v1alpha1.PhaseProvisioning, v1alpha1.ReasonProvisioning,
		fmt.Sprintf("replacing instance %s: %s", px.InstanceName(), why))
	s.setProvisioned(metav1.ConditionFalse, v1alpha1.ReasonProvisioning, px.Status.Message)
	if err := p.Delete(ctx, id); err != nil && !s.leftBehind(id, err) {
		return fmt.Errorf("deleting instance %s for replacement: %w", id, err)
	}
	px.Status.ProviderID, px.Status.IP, px.Status.SpecHash, px.Status.RenderedHash = "", "", "", ""
	px.Status.IPv6 = ""
	px.Status.ObservedReplace = px.Annotations[v1alpha1.ReplaceAnnotation]
	return nil
}

// publishInstance lays what the provider reports about a live instance on the status.
func (r *ProxyReconciler) publishInstance(s *scope, inst provider.Instance) ctrl.Result {
	px := s.px
	if left, ok := r.holdAddress(s, inst); ok {
		return ctrl.Result{RequeueAfter: min(r.PollInterval, left)}
	}
	if lost, msg := addressLost(px, inst); lost {
		px.Status.IP, px.Status.IPv6 = "", ""
		s.setPhase(v1alpha1.PhaseProvisioning, v1alpha1.ReasonAddressLost, msg)
		s.setProvisioned(metav1.ConditionTrue, v1alpha1.ReasonAddressLost, msg)
		return ctrl.Result{RequeueAfter: r.PollInterval}
	}
	px.Status.ProviderID = inst.ProviderID
	px.Status.IP, px.Status.IPv6 = inst.IP, inst.IPv6
	if inst.State != provider.StateRunning || inst.IP == "" {
		msg := fmt.Sprintf("instance %s is %s; waiting for it to run and report an address", inst.Name, strings.ToLower(orState(inst.State)))
		if inst.State == provider.StateRunning {
			msg = fmt.Sprintf("instance %s is running; waiting for it to report an address", inst.Name)
		}
		s.setPhase(v1alpha1.PhaseProvisioning, v1alpha1.ReasonProvisioning, msg)
		s.setProvisioned(metav1.ConditionFalse, v1alpha1.ReasonProvisioning, msg)
		return ctrl.Result{RequeueAfter: r.PollInterval}
	}
	msg := fmt.Sprintf("instance %s is running at %s", inst.Name, inst.IP)
	s.setPhase(v1alpha1.PhaseRunning, v1alpha1.ReasonInstanceRunning, msg)
	s.setProvisioned(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning, msg)
	return ctrl.Result{RequeueAfter: r.ResyncInterval}
}

// addressLost reports whether inst, the Proxy's running instance, no longer reports the
// address the Proxy had it at (once the address hold is over), or still does not since
// that was seen, and the Provisioned message saying so. Such an instance stays
// Provisioned (it runs: the instance's start, which remediation times from, is kept) with
// reason AddressLost, and its Proxy goes back to phase Provisioning without an address.
func addressLost(px *v1alpha1.Proxy, inst provider.Instance) (bool, string) {
	if inst.State != provider.StateRunning || inst.IP != "" || inst.ProviderID != px.Status.ProviderID {
		return false, ""
	}
	c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned)
	if c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonAddressLost {
		return true, c.Message // still lost: the message keeps the address it had
	}
	if px.Status.IP == "" || (px.Status.Phase != v1alpha1.PhaseRunning && px.Status.Phase != v1alpha1.PhaseReady) {
		return false, ""
	}
	return true, fmt.Sprintf("instance %s is running but no longer reports its address (it was %s): its network may have failed; waiting for it to report one",
		inst.Name, px.Status.IP)
}

func orState(s string) string {
	if s == "" {
		return provider.StateUnknown
	}
	return s
}

// latchedFailure reports a Proxy that failed permanently at its current generation.
func latchedFailure(px *v1alpha1.Proxy) bool {
	return failedWith(px, v1alpha1.ReasonPermanentError)
}

// ownedByOther reports a Proxy failed at its current generation because an instance of
// its name belongs to another owner: a cause that can clear without a spec change, so
// each reconcile (every FailedRecheckInterval, or woken by orphan GC) tries again.
func ownedByOther(px *v1alpha1.Proxy) bool {
	return failedWith(px, v1alpha1.ReasonOwnedByOther)
}

func failedWith(px *v1alpha1.Proxy, reason string) bool {
	if px.Status.Phase != v1alpha1.PhaseFailed || px.Status.ObservedGeneration != px.Generation {
		return false
	}
	c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned)
	return c != nil && c.Reason == reason
}

// providerNotConfigured fails a Proxy naming a provider that is not in the providers
// config. It is not retried: the config is read once per process.
func (r *ProxyReconciler) providerNotConfigured(s *scope) ctrl.Result {
	names := make([]string, 0, len(r.Providers))
	for n := range r.Providers {
		names = append(names, n)
	}
	slices.Sort(names)
	msg := fmt.Sprintf("provider %q is not configured (configured: %s)", s.px.Spec.Provider, strings.Join(names, ", "))
	if len(names) == 0 {
		msg = fmt.Sprintf("provider %[1]q is not configured (no providers are configured: the manager was started without a providers config, or with one listing none); add %[1]q to the manager's --providers-config and restart it", s.px.Spec.Provider)
	}
	if s.px.Status.Phase != v1alpha1.PhaseFailed {
		s.setPhase(v1alpha1.PhaseFailed, v1alpha1.ReasonProviderNotConfigured, msg)
	}
	s.px.Status.Message = msg
	s.setProvisioned(metav1.ConditionFalse, v1alpha1.ReasonProviderNotConfigured, msg)
	return ctrl.Result{}
}

// reconcileExternal publishes an existing proxy: nothing is created, spec.address becomes
// status.ip. An instance left from a time the Proxy was Managed is deleted first, also
// one whose providerID was never recorded (found by the Proxy's UID, as on deletion).
// A Proxy with spec.proxy.basicAuth is published only while its credentials can be had:
// otherwise it waits in Pending without status.ip, so the health engine sends nothing
// to spec.address and discovery lists nothing (waitForCredentials).
func (r *ProxyReconciler) reconcileExternal(ctx context.Context, s *scope) (ctrl.Result, error) {
	px := s.px
	if p, ok := r.Providers[px.Spec.Provider]; ok && mayHaveInstance(px) {
		ids, err := r.instanceIDs(ctx, px, p)
		if err != nil {
			return r.providerError(s, common.ActionList, err, false)
		}
		for _, id := range ids {
			err := p.Delete(ctx, id)
			switch {
			case s.leftBehind(id, err):
			case err != nil:
				return r.providerError(s, common.ActionDelete, fmt.Errorf("deleting instance %s left from Managed mode: %w", id, err), false)
			default:
				s.event(corev1.EventTypeNormal, EventInstanceDeleted, common.ActionDelete, "deleted instance %s: the proxy is External now", id)
			}
		}
	}
	if err := r.deleteSnapshot(ctx, s); err != nil {
		return ctrl.Result{}, err
	}
	px.Status.ProviderID, px.Status.SpecHash, px.Status.RenderedHash = "", "", ""
	meta.RemoveStatusCondition(&px.Status.Conditions, v1alpha1.ConditionConfigOutdated)
	if _, err := r.credentials()(ctx, px); err != nil {
		if !waitsForUser(err) { // a failed read: retried with backoff, the status left as it is
			return r.providerError(s, common.ActionReconcile, err, false)
		}
		px.Status.IP, px.Status.EgressIP = "", ""
		r.waitForCredentials(s, err)
		return ctrl.Result{}, nil
	}
	px.Status.IP = px.Spec.Address
	msg := fmt.Sprintf("external proxy at %s:%d", px.Spec.Address, px.Spec.Port)
	if v := px.Annotations[v1alpha1.ReplaceAnnotation]; v != "" {
		// No webhook can refuse the annotation, nor a CRD rule see it: say it here.
		ignored := fmt.Sprintf("annotation %s is ignored: an External proxy (spec.mode) has no instance the operator could build again; remove the annotation", v1alpha1.ReplaceAnnotation)
		if v != px.Status.ObservedReplace {
			s.event(corev1.EventTypeWarning, v1alpha1.ReasonReplaceIgnored, common.ActionReconcile, "%s (value %q)", ignored, v)
			px.Status.ObservedReplace = v
		}
		msg += "; " + ignored
	}
	s.setPhase(v1alpha1.PhaseRunning, v1alpha1.ReasonExternal, msg)
	s.setProvisioned(metav1.ConditionTrue, v1alpha1.ReasonExternal, msg)
	return ctrl.Result{}, nil
}
