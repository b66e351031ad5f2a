package proxy

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
)

// wantCond is a condition a Proxy shows: status, reason and message ("" status: absent).
type wantCond struct {
	status          metav1.ConditionStatus
	reason, message string
}

// Every condition the reconciler sets on a Proxy (Provisioned, ConfigOutdated,
// Preempted, Remediating, and the kstatus trio Ready, Reconciling, Stalled), from what a
// reconcile observed: the judges' verdict carried out on the Proxy and the status
// settled as before a write (settle), without an API server or a provider.
func TestProxyConditionsTable(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	fresh := holdFacts{now: now}
	running := "instance " + fenceInstance + " is running at 10.0.0.7"
	waitingForProbe := "the instance runs; waiting for the health probe through the proxy to pass"
	lostMsg := "instance " + fenceInstance + " is running but no longer reports its address (it was 10.0.0.7): its network may have failed; waiting for it to report one"
	cerr := func(msg string) string { return "creating instance " + fenceInstance + ": " + msg }
	missing := fmt.Errorf("%w: secret crawl/auth-v2 (spec.proxy.basicAuth.secretRef) does not exist", proxyconfig.ErrSecretMissing)
	badWG := fmt.Errorf("%w: secret crawl/wg has no wg0.conf", proxyconfig.ErrWireGuardSecret)
	want := &hashes{intent: vIntent, rendered: vRendered}
	verdict := func(judge func(px *v1alpha1.Proxy) phaseVerdict) func(*scope) {
		return func(s *scope) { s.enact(judge(s.px)) }
	}
	createFails := func(err error) func(*scope) {
		return verdict(func(px *v1alpha1.Proxy) phaseVerdict { return judgeCreated(px, created{err: err, want: want}, tm) })
	}
	build := func(f buildFacts) func(*scope) {
		return func(s *scope) {
			if err := s.r.carryOut(context.Background(), s, judgeBuild(s.px, f), nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	rec := &remediation.Record{Reason: remediation.ReasonUnhealthy, Attempt: 5, Action: remediation.ActionReplace,
		At: now.Add(-time.Hour), FaultSince: now.Add(-2 * time.Hour)}
	exhaustedMsg := fmt.Sprintf("gave up after 5 attempts (spec.remediation.maxAttempts 5; the last, Replace at %s, did not mend it): the proxy has failed its probes since %s (unhealthy timeout). Fix the cause, then delete the Proxy's instance with the annotation %s, or remove the annotation %s to start over",
		rec.At.Format(time.RFC3339), rec.FaultSince.Format(time.RFC3339), v1alpha1.ReplaceAnnotation, remediation.RecordAnnotation)
	absent := wantCond{}
	inProgress := func(reason, message string) map[string]wantCond {
		return map[string]wantCond{
			v1alpha1.ConditionReady:       {metav1.ConditionFalse, reason, message},
			v1alpha1.ConditionReconciling: {metav1.ConditionTrue, reason, message},
			v1alpha1.ConditionStalled:     absent,
		}
	}
	stalled := func(reason, message string) map[string]wantCond {
		return map[string]wantCond{
			v1alpha1.ConditionReady:       {metav1.ConditionFalse, reason, message},
			v1alpha1.ConditionReconciling: absent,
			v1alpha1.ConditionStalled:     {metav1.ConditionTrue, reason, message},
		}
	}
	with := func(m map[string]wantCond, typ string, c wantCond) map[string]wantCond {
		m[typ] = c
		return m
	}

	for _, tc := range []struct {
		name    string
		px      *v1alpha1.Proxy
		observe func(*scope)
		want    map[string]wantCond // by type
	}{
		{"new: Pending", verdictProxy(noInstance), verdict(func(px *v1alpha1.Proxy) phaseVerdict { return judgeStart(px, true, []string{"home"}) }),
			with(inProgress(string(v1alpha1.PhasePending), "instance "+fenceInstance+" will be created by provider home"), v1alpha1.ConditionProvisioned, absent)},
		{"creating", verdictProxy(noInstance, at(v1alpha1.PhasePending, "")), verdict(func(px *v1alpha1.Proxy) phaseVerdict {
			v, _ := judgeProvision(px, v1alpha1.PhasePending)
			return v
		}), with(inProgress(string(v1alpha1.PhaseProvisioning), "creating instance "+fenceInstance+" with provider home"),
			v1alpha1.ConditionProvisioned, wantCond{metav1.ConditionFalse, v1alpha1.ReasonProvisioning, "creating instance " + fenceInstance + " with provider home"})},
		{"image downloading", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")),
			createFails(provider.Pending(provider.Progress{Reason: v1alpha1.ReasonImageDownloading, Message: "downloading image", Done: 3, Total: 4})),
			with(inProgress(string(v1alpha1.PhaseProvisioning), "downloading image (75%)"),
				v1alpha1.ConditionProvisioned, wantCond{metav1.ConditionFalse, v1alpha1.ReasonImageDownloading, "downloading image (75%)"})},
		{"booting: no address yet", verdictProxy(at(v1alpha1.PhaseProvisioning, "")), verdict(func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeInstance(px, inst(provider.StateRunning, ""), fresh, tm)
		}), with(inProgress(string(v1alpha1.PhaseProvisioning), "instance "+fenceInstance+" is running; waiting for it to report an address"),
			v1alpha1.ConditionProvisioned, wantCond{metav1.ConditionFalse, v1alpha1.ReasonProvisioning, "instance " + fenceInstance + " is running; waiting for it to report an address"})},
		{"running, not probed yet", verdictProxy(at(v1alpha1.PhaseProvisioning, "")), verdict(func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeInstance(px, inst(provider.StateRunning, "10.0.0.7"), fresh, tm)
		}), with(inProgress(string(v1alpha1.PhaseRunning), waitingForProbe), v1alpha1.ConditionProvisioned, wantCond{metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning, running})},
		{"running and probed healthy: Ready, the Preempted notice gone", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7"), probedHealthy(true)), verdict(func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeInstance(px, inst(provider.StateRunning, "10.0.0.7"), fresh, tm)
		}), map[string]wantCond{
			v1alpha1.ConditionProvisioned: {metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning, running},
			v1alpha1.ConditionReady:       {metav1.ConditionTrue, v1alpha1.ReasonProbeSucceeded, "the proxy runs and its health probe passes"},
			v1alpha1.ConditionReconciling: absent, v1alpha1.ConditionStalled: absent, v1alpha1.ConditionPreempted: absent,
		}},
		{"Ready, probes failing: Running, the Preempted notice kept", verdictProxy(at(v1alpha1.PhaseReady, "10.0.0.7"), probedHealthy(false)), verdict(func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeInstance(px, inst(provider.StateRunning, "10.0.0.7"), fresh, tm)
		}), with(with(inProgress(string(v1alpha1.PhaseRunning), waitingForProbe),
			v1alpha1.ConditionProvisioned, wantCond{metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning, running}),
			v1alpha1.ConditionPreempted, wantCond{metav1.ConditionTrue, v1alpha1.ReasonPreempted, "preempted"})},
		{"preempted: Preempted until the successor is Ready", verdictProxy(at(v1alpha1.PhaseReady, "10.0.0.7"), func(px *v1alpha1.Proxy) { px.Spec.Placement.Zone = "conditions-table" }),
			func(s *scope) {
				gone, ok := judgeGone(s.px, provider.Preempted(errors.New("spot VM reclaimed")))
				if !ok {
					t.Fatal("a preempted instance is not gone")
				}
				forget(s, gone)
			}, map[string]wantCond{v1alpha1.ConditionPreempted: {metav1.ConditionTrue, v1alpha1.ReasonPreempted,
				"spot VM reclaimed; building its successor " + fenceInstance + "; this condition stays until the successor is Ready"}}},
		{"address lost", verdictProxy(at(v1alpha1.PhaseReady, "10.0.0.7")), verdict(func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeInstance(px, inst(provider.StateRunning, ""), holdFacts{since: now.Add(-time.Minute), now: now}, tm)
		}), with(inProgress(string(v1alpha1.PhaseProvisioning), lostMsg), v1alpha1.ConditionProvisioned, wantCond{metav1.ConditionTrue, v1alpha1.ReasonAddressLost, lostMsg})},
		{"quota exceeded", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), createFails(provider.QuotaExceeded(errors.New("no capacity"))),
			with(inProgress(string(v1alpha1.PhaseProvisioning), cerr("no capacity; retrying in 5m0s")),
				v1alpha1.ConditionProvisioned, wantCond{metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded, cerr("no capacity; retrying in 5m0s")})},
		{"transient Create error", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), createFails(provider.Transient(errors.New("timeout"))),
			with(inProgress(string(v1alpha1.PhaseProvisioning), cerr("timeout")), v1alpha1.ConditionProvisioned, wantCond{metav1.ConditionFalse, v1alpha1.ReasonTransientError, cerr("timeout")})},
		{"permanent Create error", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), createFails(provider.Permanent(errors.New("image not found"))),
			with(stalled(v1alpha1.ReasonPermanentError, cerr("image not found")), v1alpha1.ConditionProvisioned, wantCond{metav1.ConditionFalse, v1alpha1.ReasonPermanentError, cerr("image not found")})},
		{"an instance of another owner", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), createFails(provider.OwnedByOther(errors.New("taken"))),
			with(stalled(v1alpha1.ReasonOwnedByOther, cerr("taken; checked again every 10m0s, and as soon as orphan GC deletes that instance")),
				v1alpha1.ConditionProvisioned, wantCond{metav1.ConditionFalse, v1alpha1.ReasonOwnedByOther, cerr("taken; checked again every 10m0s, and as soon as orphan GC deletes that instance")})},
		{"provider not configured", verdictProxy(noInstance), verdict(func(px *v1alpha1.Proxy) phaseVerdict { return judgeStart(px, false, []string{"gce"}) }),
			with(stalled(v1alpha1.ReasonProviderNotConfigured, `provider "home" is not configured (configured: gce)`),
				v1alpha1.ConditionProvisioned, wantCond{metav1.ConditionFalse, v1alpha1.ReasonProviderNotConfigured, `provider "home" is not configured (configured: gce)`})},
		{"basic-auth Secret missing", verdictProxy(noInstance), verdict(func(px *v1alpha1.Proxy) phaseVerdict { return judgeCredentials(px, missing) }),
			with(stalled(v1alpha1.ReasonCredentialsUnavailable, missing.Error()+"; waiting for the Secret to be fixed"),
				v1alpha1.ConditionProvisioned, wantCond{metav1.ConditionFalse, v1alpha1.ReasonCredentialsUnavailable, missing.Error() + "; waiting for the Secret to be fixed"})},
		{"WireGuard Secret unusable", verdictProxy(noInstance), verdict(func(px *v1alpha1.Proxy) phaseVerdict { return judgeCredentials(px, badWG) }),
			with(stalled(v1alpha1.ReasonEgressUnavailable, badWG.Error()+"; waiting for the Secret to be fixed"),
				v1alpha1.ConditionProvisioned, wantCond{metav1.ConditionFalse, v1alpha1.ReasonEgressUnavailable, badWG.Error() + "; waiting for the Secret to be fixed"})},
		{"created: up to date", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, ""), outdatedAs(v1alpha1.ReasonRenderingChanged)), verdict(func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeCreated(px, created{inst: inst(provider.StateRunning, "10.0.0.7"), want: want, hold: fresh}, tm)
		}), map[string]wantCond{v1alpha1.ConditionConfigOutdated: {metav1.ConditionFalse, v1alpha1.ReasonUpToDate, upToDateMessage(verdictProxy())}}},
		{"another rendering: ConfigOutdated", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7"), recordedHashes(vIntent, vOtherRender)),
			build(buildFacts{want: hashes{intent: vIntent, rendered: vRendered}, state: provider.StateRunning}),
			map[string]wantCond{v1alpha1.ConditionConfigOutdated: {metav1.ConditionTrue, v1alpha1.ReasonRenderingChanged, "instance " + fenceInstance +
				" was built from another rendering (rendered hash " + vOtherRender + ") than this operator version makes of the spec (" + vRendered + "): " +
				"another operator version built it, or an earlier one kept it when spec.proxy.allowedDestinations or allowOpenProxy was edited; it keeps running as it is; " +
				"to build it again: kubectl annotate proxy -n crawl fence " + v1alpha1.ReplaceAnnotation + `="$(date +%s)" --overwrite`}}},
		{"a pool child's credentials changed: ConfigOutdated", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7"), poolChild, recordedHashes(vOlder, vRendered)),
			build(buildFacts{want: hashes{intent: vIntent, rendered: vRendered}, partialIntent: vPartial, onlyCredentialsChanged: true, state: provider.StateRunning}),
			map[string]wantCond{v1alpha1.ConditionConfigOutdated: {metav1.ConditionTrue, v1alpha1.ReasonCredentialsChanged, credsOld.message}}},
		{"being remediated", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7"), func(px *v1alpha1.Proxy) {
			px.Status.Conditions = append(px.Status.Conditions, metav1.Condition{Type: remediation.ConditionRemediating, Status: metav1.ConditionTrue,
				Reason: remediation.ReasonUnhealthy, Message: "replacing: attempt 2"})
		}), func(*scope) {}, inProgress(remediation.ReasonUnhealthy, "replacing: attempt 2")},
		{"remediation gave up", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7")), func(s *scope) { remediation.SetCondition(s.px, exhausted(rec, 5), now) },
			with(stalled(common.ReasonAttemptsExhausted, exhaustedMsg), remediation.ConditionRemediating, wantCond{metav1.ConditionFalse, common.ReasonAttemptsExhausted, exhaustedMsg})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := (&ProxyReconciler{}).newScope(context.Background(), tc.px)
			tc.observe(s)
			s.settle()
			for typ, w := range tc.want {
				c := meta.FindStatusCondition(s.px.Status.Conditions, typ)
				switch {
				case w.status == "" && c != nil:
					t.Errorf("%s: %s %s %q, want none", typ, c.Status, c.Reason, c.Message)
				case w.status == "":
				case c == nil:
					t.Errorf("%s: none, want %s %s %q", typ, w.status, w.reason, w.message)
				case c.Status != w.status || c.Reason != w.reason || c.Message != w.message:
					t.Errorf("%s: %s %s %q, want %s %s %q", typ, c.Status, c.Reason, c.Message, w.status, w.reason, w.message)
				case c.ObservedGeneration != s.px.Generation:
					t.Errorf("%s: of generation %d, want %d", typ, c.ObservedGeneration, s.px.Generation)
				}
			}
		})
	}
}
