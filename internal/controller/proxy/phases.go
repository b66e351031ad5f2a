package proxy

import (
	"context"
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// reconcileManaged makes sure the Proxy's instance exists, matches the spec and runs.
// Each step observes (the providers config, the provider's answer), has a judge decide
// (phaseverdict.go), and carries the verdict out: its status and Events (enact), then the
// provider call it names (next).
func (r *ProxyReconciler) reconcileManaged(ctx context.Context, s *scope) (ctrl.Result, error) {
	p, ok := r.Providers[s.px.Spec.Provider]
	v := judgeStart(s.px, ok, r.providerNames())
	if s.enact(v); v.act != actRender {
		return v.result, v.err
	}
	rendered, creds, done, res, err := r.renderConfig(ctx, s) // config.go
	if done {
		return res, err
	}
	intent, err := IntentHash(s.px, creds, rendered.WireGuard)
	if err != nil {
		return r.providerError(s, common.ActionReconcile, err, false)
	}
	b := build{p: p, want: hashes{intent: intent, rendered: RenderedHash(s.px, rendered.HashInput)}, userData: rendered.UserData, creds: creds}
	v = phaseVerdict{act: actCreate}
	if id := s.px.Status.ProviderID; id != "" {
		v = r.look(ctx, s, b, id, rendered.WireGuard)
	}
	return r.next(ctx, s, b, v)
}

// build is what a reconcile builds an instance with: the provider, the hashes, the
// user-data and the credentials it was rendered with.
type build struct {
	p        provider.Provider
	want     hashes
	userData []byte
	creds    *proxyconfig.Credentials
}

// look asks the provider for the Proxy's recorded instance id and judges the answer: an
// instance gone is forgotten (judgeGone) and created again; one found is judged against
// the spec (judgeBuild, carried out but for its action) and then by judgeLooked.
func (r *ProxyReconciler) look(ctx context.Context, s *scope, b build, id string, wg *proxyconfig.WireGuard) phaseVerdict {
	inst, err := b.p.Get(ctx, id)
	if gone, isGone := judgeGone(s.px, err); isGone { // verdict.go
		forget(s, gone)
		return phaseVerdict{act: actCreate}
	}
	l := looked{id: id, inst: inst, err: err}
	if err == nil {
		l.build, l.buildErr = r.judge(ctx, s, b.want, inst.State, b.creds, wg) // verdict.go, intent.go
		l.hold = r.holdFacts(s.px.UID)
	}
	v := judgeLooked(s.px, l, r.timings())
	s.enact(v)
	return v
}

// next makes the provider call v names, and those the verdicts on their answers name,
// until one ends the reconcile.
func (r *ProxyReconciler) next(ctx context.Context, s *scope, b build, v phaseVerdict) (ctrl.Result, error) {
	for {
		switch v.act {
		case actCreate:
			return r.create(ctx, s, b.p, b.want, b.userData, b.creds)
		case actRestart:
			return r.restart(ctx, s, b.p, b.userData)
		case actReplace:
			if err := r.replace(ctx, s, b.p, s.px.Status.ProviderID, v.why); err != nil {
				return r.providerError(s, common.ActionDelete, err, true)
			}
			v = phaseVerdict{act: actCreate}
		case actRemediate:
			after, replaced, err := r.remediate(ctx, s, b.p, v.booting) // remediation.go
			if err != nil {
				return ctrl.Result{}, err
			}
			if replaced { // the instance was deleted for a replacement: build it again
				v = phaseVerdict{act: actCreate}
				continue
			}
			res := v.result
			if after > 0 && (res.RequeueAfter == 0 || after < res.RequeueAfter) {
				res.RequeueAfter = after
			}
			return res, nil
		default:
			return v.result, v.err
		}
	}
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
	s.enact(judgeReplace(s.px, id, why))
	if err := p.Delete(ctx, id); err != nil && !s.leftBehind(id, err) {
		return fmt.Errorf("deleting instance %s for replacement: %w", id, err)
	}
	s.enact(judgeReplaced(s.px))
	return nil
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

// providerNames are the configured providers' names, sorted.
func (r *ProxyReconciler) providerNames() []string {
	names := make([]string, 0, len(r.Providers))
	for n := range r.Providers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
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
