package proxy

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// The reconciler's intervals in the phase verdict table (the defaults).
var tm = phaseTimings{poll: time.Second, resync: 5 * time.Minute, addressHold: 15 * time.Second,
	quotaRetry: 5 * time.Minute, pendingRetry: 10 * time.Second, failedRecheck: 10 * time.Minute}

// fenceInstance is the instance name of verdictProxy's Proxy.
var fenceInstance = verdictProxy().InstanceName()

// at is a verdictProxy in phase with instance vm-7 at ip ("" for none), Provisioned as
// that phase shows it.
func at(phase v1alpha1.ProxyPhase, ip string) func(*v1alpha1.Proxy) {
	return func(px *v1alpha1.Proxy) {
		px.Status.Phase, px.Status.ProviderID, px.Status.IP = phase, "vm-7", ip
		px.Status.ObservedGeneration = px.Generation
	}
}

func provisionedAs(status metav1.ConditionStatus, reason, message string) func(*v1alpha1.Proxy) {
	return func(px *v1alpha1.Proxy) {
		px.Status.Conditions = append(px.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionProvisioned,
			Status: status, Reason: reason, Message: message, ObservedGeneration: px.Generation})
	}
}

func noInstance(px *v1alpha1.Proxy) { px.Status.ProviderID, px.Status.IP = "", "" }

func inst(state, ip string) provider.Instance {
	return provider.Instance{ProviderID: "vm-7", Name: fenceInstance, State: state, IP: ip}
}

// prov is the Provisioned condition of verdictProxy's generation.
func prov(status metav1.ConditionStatus, reason, message string) metav1.Condition {
	return metav1.Condition{Type: v1alpha1.ConditionProvisioned, Status: status, Reason: reason, Message: message, ObservedGeneration: 3}
}

func warning(reason, action, message string) phaseEvent {
	return phaseEvent{corev1.EventTypeWarning, reason, action, message}
}

func normal(reason, action, message string) phaseEvent {
	return phaseEvent{corev1.EventTypeNormal, reason, action, message}
}

func logged(level int, msg string) verdictLog { return verdictLog{level: level, msg: msg} }

const phaseChanged = "proxy phase changed"

// errAny stands for an error of any kind in a table's want.
var errAny = errors.New("any error")

// Every phase transition of a Managed Proxy and every class of provider error, decided
// without the API server or a provider: what the verdict does next (act), the phase and
// message, the conditions, the address and hashes, the address hold, the log lines (their
// messages), the Events (byte for byte) and what the reconcile returns. No judge changes
// the Proxy.
func TestPhaseVerdict(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	fresh := holdFacts{now: now}
	running := "instance " + fenceInstance + " is running at 10.0.0.7"
	booting := "instance " + fenceInstance + " is running; waiting for it to report an address"
	lostMsg := "instance " + fenceInstance + " is running but no longer reports its address (it was 10.0.0.7): its network may have failed; waiting for it to report one"
	creating := "creating instance " + fenceInstance + " with provider home"
	notConfigured := `provider "home" is not configured (configured: gce, hcloud)`
	noneConfigured := `provider "home" is not configured (no providers are configured: the manager was started without a providers config, or with one listing none); add "home" to the manager's --providers-config and restart it`
	cerr := func(err error) string { return "creating instance " + fenceInstance + ": " + err.Error() }
	timeout := provider.Transient(errors.New("timeout"))
	quota := provider.QuotaExceeded(errors.New("no capacity in zone b"))
	denied := provider.Permanent(errors.New("image not found"))
	owned := provider.OwnedByOther(errors.New("domain belongs to UID 9"))
	download := provider.Pending(provider.Progress{Reason: v1alpha1.ReasonImageDownloading, Message: "downloading image", Done: 1, Total: 4})
	limited := provider.Transient(waitError{1500 * time.Millisecond})
	missing := fmt.Errorf("%w: secret crawl/auth-v2 (spec.proxy.basicAuth.secretRef) does not exist", proxyconfig.ErrSecretMissing)
	badWG := fmt.Errorf("%w: secret crawl/wg has no wg0.conf", proxyconfig.ErrWireGuardSecret)
	taken := fmt.Errorf("secret crawl/fence-credentials exists and is not the Proxy's: %w", errSnapshotTaken)
	want := &hashes{intent: vIntent, rendered: vRendered}
	keep := buildVerdict{action: buildKeep}

	for _, c := range []struct {
		name  string
		px    *v1alpha1.Proxy
		judge func(px *v1alpha1.Proxy) phaseVerdict
		want  phaseVerdict
		err   error // errors.Is the verdict's error; nil: none
	}{
		// The start: a provider that is not configured, a latched failure, a new Proxy.
		{"new: Pending", verdictProxy(noInstance), func(px *v1alpha1.Proxy) phaseVerdict { return judgeStart(px, true, []string{"home"}) },
			phaseVerdict{act: actRender, phase: v1alpha1.PhasePending, message: "instance " + fenceInstance + " will be created by provider home",
				logs:   []verdictLog{logged(0, phaseChanged)},
				events: []phaseEvent{normal(EventPending, common.ActionReconcile, "Pending: instance "+fenceInstance+" will be created by provider home")}}, nil},
		{"Provisioning: goes on", verdictProxy(at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict { return judgeStart(px, true, []string{"home"}) },
			phaseVerdict{act: actRender}, nil},
		{"provider not configured: Failed", verdictProxy(noInstance), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeStart(px, false, []string{"gce", "hcloud"})
		}, phaseVerdict{phase: v1alpha1.PhaseFailed, message: notConfigured,
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonProviderNotConfigured, notConfigured)},
			logs:       []verdictLog{logged(0, phaseChanged)},
			events:     []phaseEvent{warning(v1alpha1.ReasonProviderNotConfigured, common.ActionReconcile, "Failed: "+notConfigured)}}, nil},
		{"no provider configured at all", verdictProxy(noInstance), func(px *v1alpha1.Proxy) phaseVerdict { return judgeStart(px, false, nil) },
			phaseVerdict{phase: v1alpha1.PhaseFailed, message: noneConfigured,
				conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonProviderNotConfigured, noneConfigured)},
				logs:       []verdictLog{logged(0, phaseChanged)},
				events:     []phaseEvent{warning(v1alpha1.ReasonProviderNotConfigured, common.ActionReconcile, "Failed: "+noneConfigured)}}, nil},
		{"provider not configured, already Failed: no Event", verdictProxy(noInstance, at(v1alpha1.PhaseFailed, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeStart(px, false, []string{"gce", "hcloud"})
		}, phaseVerdict{message: notConfigured,
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonProviderNotConfigured, notConfigured)}}, nil},
		{"failed permanently at this generation: latched", verdictProxy(at(v1alpha1.PhaseFailed, ""), provisionedAs(metav1.ConditionFalse, v1alpha1.ReasonPermanentError, "image not found")),
			func(px *v1alpha1.Proxy) phaseVerdict { return judgeStart(px, true, []string{"home"}) }, phaseVerdict{}, nil},
		{"failed permanently at an earlier generation: goes on", verdictProxy(at(v1alpha1.PhaseFailed, ""), provisionedAs(metav1.ConditionFalse, v1alpha1.ReasonPermanentError, "image not found"),
			func(px *v1alpha1.Proxy) { px.Status.ObservedGeneration = 2 }),
			func(px *v1alpha1.Proxy) phaseVerdict { return judgeStart(px, true, []string{"home"}) }, phaseVerdict{act: actRender}, nil},

		// The instance looked up: a Get error, the build verdict, the instance kept.
		{"Get fails: retried with backoff, Provisioned untouched", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeLooked(px, looked{id: "vm-7", err: timeout}, tm)
		}, phaseVerdict{events: []phaseEvent{warning(v1alpha1.ReasonTransientError, common.ActionGet, "getting instance vm-7: timeout; retrying")}}, timeout},
		{"Get refused for good: Failed", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeLooked(px, looked{id: "vm-7", err: denied}, tm)
		}, phaseVerdict{phase: v1alpha1.PhaseFailed, message: "getting instance vm-7: image not found",
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonPermanentError, "getting instance vm-7: image not found")},
			logs:       []verdictLog{logged(0, phaseChanged)},
			events:     []phaseEvent{warning(v1alpha1.ReasonPermanentError, common.ActionGet, "getting instance vm-7: image not found; the Proxy stays Failed until its spec changes")}}, nil},
		{"snapshot name taken, instance running: Provisioned False, phase kept", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeLooked(px, looked{id: "vm-7", inst: inst(provider.StateRunning, "10.0.0.7"), build: keep, buildErr: taken}, tm)
		}, phaseVerdict{message: taken.Error(),
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonCredentialsUnavailable, taken.Error())},
			logs:       []verdictLog{logged(0, "proxy cannot keep its credentials snapshot")},
			events:     []phaseEvent{warning(v1alpha1.ReasonCredentialsUnavailable, common.ActionReconcile, taken.Error())},
			result:     ctrl.Result{RequeueAfter: tm.pendingRetry}}, nil},
		{"snapshot name taken, shown already: no Event", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7"), provisionedAs(metav1.ConditionFalse, v1alpha1.ReasonCredentialsUnavailable, taken.Error())),
			func(px *v1alpha1.Proxy) phaseVerdict {
				return judgeLooked(px, looked{id: "vm-7", inst: inst(provider.StateRunning, "10.0.0.7"), build: keep, buildErr: taken}, tm)
			}, phaseVerdict{message: taken.Error(),
				conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonCredentialsUnavailable, taken.Error())},
				result:     ctrl.Result{RequeueAfter: tm.pendingRetry}}, nil},
		{"build verdict not carried out: retried with backoff", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeLooked(px, looked{id: "vm-7", inst: inst(provider.StateRunning, "10.0.0.7"), build: keep, buildErr: timeout}, tm)
		}, phaseVerdict{events: []phaseEvent{warning(v1alpha1.ReasonTransientError, common.ActionReconcile, "timeout; retrying")}}, timeout},
		{"build verdict replace", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeLooked(px, looked{id: "vm-7", inst: inst(provider.StateRunning, "10.0.0.7"), build: buildVerdict{action: buildReplace, why: "spec changed"}}, tm)
		}, phaseVerdict{act: actReplace, why: "spec changed"}, nil},
		{"build verdict restart", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeLooked(px, looked{id: "vm-7", inst: inst(provider.StateStopped, ""), build: buildVerdict{action: buildRestart}}, tm)
		}, phaseVerdict{act: actRestart}, nil},
		{"kept, running at an address: Running, remediation asked", verdictProxy(at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeLooked(px, looked{id: "vm-7", inst: inst(provider.StateRunning, "10.0.0.7"), build: keep, hold: fresh}, tm)
		}, phaseVerdict{act: actRemediate, phase: v1alpha1.PhaseRunning, message: running, dropHold: true,
			address:    &instanceAddress{"vm-7", "10.0.0.7", ""},
			conditions: []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning, running)},
			logs:       []verdictLog{logged(0, phaseChanged)},
			events:     []phaseEvent{normal(v1alpha1.ReasonInstanceRunning, common.ActionReconcile, "Running: "+running)},
			result:     ctrl.Result{RequeueAfter: tm.resync}}, nil},
		{"kept, Ready: stays Ready", verdictProxy(at(v1alpha1.PhaseReady, "10.0.0.7")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeLooked(px, looked{id: "vm-7", inst: inst(provider.StateRunning, "10.0.0.7"), build: keep, hold: fresh}, tm)
		}, phaseVerdict{act: actRemediate, message: running, dropHold: true,
			address:    &instanceAddress{"vm-7", "10.0.0.7", ""},
			conditions: []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning, running)},
			result:     ctrl.Result{RequeueAfter: tm.resync}}, nil},
		{"kept, running without an address yet: booting", verdictProxy(at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeLooked(px, looked{id: "vm-7", inst: inst(provider.StateRunning, ""), build: keep, hold: fresh}, tm)
		}, phaseVerdict{act: actRemediate, booting: true, message: booting, dropHold: true,
			address:    &instanceAddress{"vm-7", "", ""},
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonProvisioning, booting)},
			result:     ctrl.Result{RequeueAfter: tm.poll}}, nil},
		{"kept, not running yet: polled, remediation not asked", verdictProxy(at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeLooked(px, looked{id: "vm-7", inst: inst(provider.StatePending, ""), build: keep, hold: fresh}, tm)
		}, phaseVerdict{message: "instance " + fenceInstance + " is pending; waiting for it to run and report an address", dropHold: true,
			address:    &instanceAddress{"vm-7", "", ""},
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonProvisioning, "instance "+fenceInstance+" is pending; waiting for it to run and report an address")},
			result:     ctrl.Result{RequeueAfter: tm.poll}}, nil},
		{"kept, a state the provider cannot tell: unknown", verdictProxy(at(v1alpha1.PhasePending, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeInstance(px, inst("", ""), fresh, tm)
		}, phaseVerdict{phase: v1alpha1.PhaseProvisioning, message: "instance " + fenceInstance + " is unknown; waiting for it to run and report an address", dropHold: true,
			address:    &instanceAddress{"vm-7", "", ""},
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonProvisioning, "instance "+fenceInstance+" is unknown; waiting for it to run and report an address")},
			logs:       []verdictLog{logged(0, phaseChanged)},
			events:     []phaseEvent{normal(v1alpha1.ReasonProvisioning, common.ActionReconcile, "Provisioning: instance "+fenceInstance+" is unknown; waiting for it to run and report an address")},
			result:     ctrl.Result{RequeueAfter: tm.poll}}, nil},

		// The address hold: a running instance that stops reporting its address.
		{"address just lost: the hold starts", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeLooked(px, looked{id: "vm-7", inst: inst(provider.StateRunning, ""), build: keep, hold: fresh}, tm)
		}, phaseVerdict{act: actRemediate, booting: true, holdFrom: now,
			logs:   []verdictLog{logged(0, "running instance reports no address; keeping the last one for a while")},
			result: ctrl.Result{RequeueAfter: tm.poll}}, nil},
		{"address lost, half a second of the hold left", verdictProxy(at(v1alpha1.PhaseReady, "10.0.0.7")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeInstance(px, inst(provider.StateRunning, ""), holdFacts{since: now.Add(-14500 * time.Millisecond), now: now}, tm)
		}, phaseVerdict{result: ctrl.Result{RequeueAfter: 500 * time.Millisecond}}, nil},
		{"address lost, the hold over: AddressLost", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeInstance(px, inst(provider.StateRunning, ""), holdFacts{since: now.Add(-tm.addressHold), now: now}, tm)
		}, phaseVerdict{phase: v1alpha1.PhaseProvisioning, message: lostMsg, dropHold: true,
			address:    &instanceAddress{providerID: "vm-7"},
			conditions: []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonAddressLost, lostMsg)},
			logs:       []verdictLog{logged(0, phaseChanged)},
			events:     []phaseEvent{normal(v1alpha1.ReasonAddressLost, common.ActionReconcile, "Provisioning: "+lostMsg)},
			result:     ctrl.Result{RequeueAfter: tm.poll}}, nil},
		{"address still lost: the message keeps the address it had", verdictProxy(at(v1alpha1.PhaseProvisioning, ""), provisionedAs(metav1.ConditionTrue, v1alpha1.ReasonAddressLost, lostMsg)),
			func(px *v1alpha1.Proxy) phaseVerdict {
				return judgeInstance(px, inst(provider.StateRunning, ""), fresh, tm)
			},
			phaseVerdict{message: lostMsg, dropHold: true, address: &instanceAddress{providerID: "vm-7"},
				conditions: []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonAddressLost, lostMsg)},
				result:     ctrl.Result{RequeueAfter: tm.poll}}, nil},
		{"address back after AddressLost: Running", verdictProxy(at(v1alpha1.PhaseProvisioning, ""), provisionedAs(metav1.ConditionTrue, v1alpha1.ReasonAddressLost, lostMsg)),
			func(px *v1alpha1.Proxy) phaseVerdict {
				return judgeInstance(px, inst(provider.StateRunning, "10.0.0.7"), fresh, tm)
			},
			phaseVerdict{phase: v1alpha1.PhaseRunning, message: running, dropHold: true, address: &instanceAddress{"vm-7", "10.0.0.7", ""},
				conditions: []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning, running)},
				logs:       []verdictLog{logged(0, phaseChanged)},
				events:     []phaseEvent{normal(v1alpha1.ReasonInstanceRunning, common.ActionReconcile, "Running: "+running)},
				result:     ctrl.Result{RequeueAfter: tm.resync}}, nil},
		{"another instance without an address: not held", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7")), func(px *v1alpha1.Proxy) phaseVerdict {
			i := inst(provider.StateRunning, "")
			i.ProviderID = "vm-8"
			return judgeInstance(px, i, fresh, tm)
		}, phaseVerdict{phase: v1alpha1.PhaseProvisioning, message: booting, dropHold: true, address: &instanceAddress{providerID: "vm-8"},
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonProvisioning, booting)},
			logs:       []verdictLog{logged(0, phaseChanged)},
			events:     []phaseEvent{normal(v1alpha1.ReasonProvisioning, common.ActionReconcile, "Provisioning: "+booting)},
			result:     ctrl.Result{RequeueAfter: tm.poll}}, nil},

		// Before a Create.
		{"Create announced", verdictProxy(noInstance, at(v1alpha1.PhasePending, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			v, announce := judgeProvision(px, v1alpha1.PhasePending)
			if !announce {
				t.Errorf("the status is not written before the Create")
			}
			return v
		}, phaseVerdict{phase: v1alpha1.PhaseProvisioning, message: creating,
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonProvisioning, creating)},
			logs:       []verdictLog{logged(0, phaseChanged)},
			events:     []phaseEvent{normal(v1alpha1.ReasonProvisioning, common.ActionReconcile, "Provisioning: "+creating)}}, nil},
		{"Create repeated: nothing announced", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			v, announce := judgeProvision(px, v1alpha1.PhaseProvisioning)
			if announce {
				t.Errorf("a repeated Create writes the status first")
			}
			return v
		}, phaseVerdict{}, nil},
		{"Create re-checked on another owner's instance: stays Failed", verdictProxy(noInstance, at(v1alpha1.PhaseFailed, ""), provisionedAs(metav1.ConditionFalse, v1alpha1.ReasonOwnedByOther, "taken")),
			func(px *v1alpha1.Proxy) phaseVerdict {
				v, announce := judgeProvision(px, v1alpha1.PhaseFailed)
				if announce {
					t.Errorf("a re-check writes the status first")
				}
				return v
			}, phaseVerdict{logs: []verdictLog{logged(1, "checking a proxy failed on an instance of another owner again")}}, nil},

		// A Create's answer: the instance, or an error of each class.
		{"created: hashes recorded, up to date, Running", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, ""), recordedHashes("", ""), annotated("7", "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeCreated(px, created{inst: inst(provider.StateRunning, "10.0.0.7"), want: want, hold: fresh}, tm)
		}, phaseVerdict{phase: v1alpha1.PhaseRunning, message: running, dropHold: true,
			address: &instanceAddress{"vm-7", "10.0.0.7", ""}, record: &recorded{vIntent, vRendered, "7"},
			conditions: []metav1.Condition{configOutdatedCondition(verdictProxy(), metav1.ConditionFalse, v1alpha1.ReasonUpToDate, upToDateMessage(verdictProxy())),
				prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning, running)},
			logs:   []verdictLog{logged(0, phaseChanged)},
			events: []phaseEvent{normal(v1alpha1.ReasonInstanceRunning, common.ActionReconcile, "Running: "+running)},
			result: ctrl.Result{RequeueAfter: tm.resync}}, nil},
		{"restarted: hashes kept", verdictProxy(at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeCreated(px, created{inst: inst(provider.StateRunning, "10.0.0.7"), hold: fresh}, tm)
		}, phaseVerdict{phase: v1alpha1.PhaseRunning, message: running, dropHold: true, address: &instanceAddress{"vm-7", "10.0.0.7", ""},
			conditions: []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning, running)},
			logs:       []verdictLog{logged(0, phaseChanged)},
			events:     []phaseEvent{normal(v1alpha1.ReasonInstanceRunning, common.ActionReconcile, "Running: "+running)},
			result:     ctrl.Result{RequeueAfter: tm.resync}}, nil},
		{"pending (an image download): its progress, off the backoff curve", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeCreated(px, created{err: download, want: want}, tm)
		}, phaseVerdict{phase: v1alpha1.PhaseProvisioning, message: "downloading image (25%)",
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonImageDownloading, "downloading image (25%)")},
			logs:       []verdictLog{logged(1, "provider work pending; asking again")},
			result:     ctrl.Result{RequeueAfter: tm.pendingRetry}}, nil},
		{"pending without a reason: Provisioning", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeCreated(px, created{err: provider.ErrPending, want: want}, tm)
		}, phaseVerdict{phase: v1alpha1.PhaseProvisioning, message: cerr(provider.ErrPending),
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonProvisioning, cerr(provider.ErrPending))},
			logs:       []verdictLog{logged(1, "provider work pending; asking again")},
			result:     ctrl.Result{RequeueAfter: tm.pendingRetry}}, nil},
		{"quota exceeded: waits QuotaRetry", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeCreated(px, created{err: quota, want: want}, tm)
		}, phaseVerdict{phase: v1alpha1.PhaseProvisioning, message: cerr(quota) + "; retrying in 5m0s",
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded, cerr(quota)+"; retrying in 5m0s")},
			logs:       []verdictLog{logged(0, "provider out of capacity; waiting")},
			events:     []phaseEvent{warning(v1alpha1.ReasonQuotaExceeded, common.ActionCreate, cerr(quota)+"; retrying in 5m0s")},
			result:     ctrl.Result{RequeueAfter: tm.quotaRetry}}, nil},
		{"owned by another: Failed, checked again", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeCreated(px, created{err: owned, want: want}, tm)
		}, phaseVerdict{phase: v1alpha1.PhaseFailed, message: cerr(owned) + "; checked again every 10m0s, and as soon as orphan GC deletes that instance",
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonOwnedByOther, cerr(owned)+"; checked again every 10m0s, and as soon as orphan GC deletes that instance")},
			logs:       []verdictLog{logged(0, phaseChanged)},
			events:     []phaseEvent{warning(v1alpha1.ReasonOwnedByOther, common.ActionCreate, cerr(owned)+"; checked again every 10m0s, and as soon as orphan GC deletes that instance")},
			result:     ctrl.Result{RequeueAfter: tm.failedRecheck}}, nil},
		{"owned by another again: no Event", verdictProxy(noInstance, at(v1alpha1.PhaseFailed, ""), provisionedAs(metav1.ConditionFalse, v1alpha1.ReasonOwnedByOther, "taken")),
			func(px *v1alpha1.Proxy) phaseVerdict { return judgeCreated(px, created{err: owned, want: want}, tm) },
			phaseVerdict{phase: v1alpha1.PhaseFailed, message: cerr(owned) + "; checked again every 10m0s, and as soon as orphan GC deletes that instance",
				conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonOwnedByOther, cerr(owned)+"; checked again every 10m0s, and as soon as orphan GC deletes that instance")},
				result:     ctrl.Result{RequeueAfter: tm.failedRecheck}}, nil},
		{"permanent: Failed until the spec changes", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeCreated(px, created{err: denied, want: want}, tm)
		}, phaseVerdict{phase: v1alpha1.PhaseFailed, message: cerr(denied),
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonPermanentError, cerr(denied))},
			logs:       []verdictLog{logged(0, phaseChanged)},
			events:     []phaseEvent{warning(v1alpha1.ReasonPermanentError, common.ActionCreate, cerr(denied)+"; the Proxy stays Failed until its spec changes")}}, nil},
		{"transient with a wait: rounded up, off the curve", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeCreated(px, created{err: limited, want: want}, tm)
		}, phaseVerdict{message: cerr(limited),
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonTransientError, cerr(limited))},
			events:     []phaseEvent{warning(v1alpha1.ReasonTransientError, common.ActionCreate, cerr(limited)+"; retrying in 2s")},
			result:     ctrl.Result{RequeueAfter: 2 * time.Second}}, nil},
		{"transient: retried with backoff", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeCreated(px, created{err: timeout, want: want}, tm)
		}, phaseVerdict{message: cerr(timeout),
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonTransientError, cerr(timeout))},
			events:     []phaseEvent{warning(v1alpha1.ReasonTransientError, common.ActionCreate, cerr(timeout)+"; retrying")}}, timeout},
		{"unclassified: retried with backoff", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeCreated(px, created{err: errors.New("connection reset"), want: want}, tm)
		}, phaseVerdict{message: "creating instance " + fenceInstance + ": connection reset",
			conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonTransientError, "creating instance "+fenceInstance+": connection reset")},
			events:     []phaseEvent{warning(v1alpha1.ReasonTransientError, common.ActionCreate, "creating instance "+fenceInstance+": connection reset; retrying")}}, errAny},
		{"a stale read: reconciled again, nothing shown", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, "")), func(px *v1alpha1.Proxy) phaseVerdict {
			return judgeProviderError(px, common.ActionCreate, fmt.Errorf("applying: %w", errStaleRead), true, tm)
		}, phaseVerdict{}, errStaleRead},

		// A replacement.
		{"replacing", verdictProxy(at(v1alpha1.PhaseReady, "10.0.0.7")), func(px *v1alpha1.Proxy) phaseVerdict { return judgeReplace(px, "vm-7", "spec changed") },
			phaseVerdict{phase: v1alpha1.PhaseProvisioning, message: "replacing instance " + fenceInstance + ": spec changed",
				conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonProvisioning, "replacing instance "+fenceInstance+": spec changed")},
				logs:       []verdictLog{logged(0, phaseChanged)},
				events: []phaseEvent{normal(EventReplacing, common.ActionDelete, "spec changed: deleting instance vm-7 to create it again"),
					normal(v1alpha1.ReasonProvisioning, common.ActionReconcile, "Provisioning: replacing instance "+fenceInstance+": spec changed")}}, nil},
		{"replaced: forgotten, created next", verdictProxy(at(v1alpha1.PhaseProvisioning, "10.0.0.7"), annotated("8", "7")), func(px *v1alpha1.Proxy) phaseVerdict { return judgeReplaced(px) },
			phaseVerdict{act: actCreate, address: &instanceAddress{}, record: &recorded{observedReplace: "8"}}, nil},

		// Credentials that cannot be had.
		{"basic-auth Secret missing, no instance: Pending", verdictProxy(noInstance, at(v1alpha1.PhaseProvisioning, ""), noInstance), func(px *v1alpha1.Proxy) phaseVerdict { return judgeCredentials(px, missing) },
			phaseVerdict{phase: v1alpha1.PhasePending, message: missing.Error() + "; waiting for the Secret to be fixed",
				conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonCredentialsUnavailable, missing.Error()+"; waiting for the Secret to be fixed")},
				logs:       []verdictLog{logged(0, "proxy waits for its basic-auth secret"), logged(0, phaseChanged)},
				events: []phaseEvent{warning(v1alpha1.ReasonCredentialsUnavailable, common.ActionReconcile, missing.Error()+"; waiting for the Secret to be fixed"),
					normal(v1alpha1.ReasonCredentialsUnavailable, common.ActionReconcile, "Pending: "+missing.Error()+"; waiting for the Secret to be fixed")}}, nil},
		{"basic-auth Secret missing under a running instance: it keeps running", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7")), func(px *v1alpha1.Proxy) phaseVerdict { return judgeCredentials(px, missing) },
			phaseVerdict{message: missing.Error() + "; waiting for the Secret to be fixed (instance " + fenceInstance + " keeps the configuration it was built with)",
				conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonCredentialsUnavailable, missing.Error()+"; waiting for the Secret to be fixed (instance "+fenceInstance+" keeps the configuration it was built with)")},
				logs:       []verdictLog{logged(0, "proxy waits for its basic-auth secret")},
				events:     []phaseEvent{warning(v1alpha1.ReasonCredentialsUnavailable, common.ActionReconcile, missing.Error()+"; waiting for the Secret to be fixed (instance "+fenceInstance+" keeps the configuration it was built with)")}}, nil},
		{"WireGuard Secret unusable, shown already: no Event", verdictProxy(noInstance, at(v1alpha1.PhasePending, ""), noInstance, provisionedAs(metav1.ConditionFalse, v1alpha1.ReasonEgressUnavailable, badWG.Error()+"; waiting for the Secret to be fixed")),
			func(px *v1alpha1.Proxy) phaseVerdict { return judgeCredentials(px, badWG) },
			phaseVerdict{message: badWG.Error() + "; waiting for the Secret to be fixed",
				conditions: []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonEgressUnavailable, badWG.Error()+"; waiting for the Secret to be fixed")}}, nil},

		// Readiness: Running and Ready, by the health engine's probe.
		{"probed healthy: Ready, the Preempted notice gone", verdictProxy(at(v1alpha1.PhaseRunning, "10.0.0.7"), probedHealthy(true)), judgeReadiness,
			phaseVerdict{phase: v1alpha1.PhaseReady, removed: []string{v1alpha1.ConditionPreempted}, logs: []verdictLog{logged(0, phaseChanged)}}, nil},
		{"Ready, probe failing: Running", verdictProxy(at(v1alpha1.PhaseReady, "10.0.0.7"), probedHealthy(false)), judgeReadiness,
			phaseVerdict{phase: v1alpha1.PhaseRunning, logs: []verdictLog{logged(0, phaseChanged)}}, nil},
		{"Ready and healthy: stays", verdictProxy(at(v1alpha1.PhaseReady, "10.0.0.7"), probedHealthy(true)), judgeReadiness,
			phaseVerdict{removed: []string{v1alpha1.ConditionPreempted}}, nil},
		{"Provisioning: not for readiness to move", verdictProxy(at(v1alpha1.PhaseProvisioning, "10.0.0.7"), probedHealthy(true)), judgeReadiness, phaseVerdict{}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := c.px.DeepCopy()
			got := c.judge(c.px)
			if !reflect.DeepEqual(c.px, before) {
				t.Errorf("the judge changed the Proxy: %+v, was %+v", c.px, before)
			}
			switch {
			case c.err == nil && got.err != nil:
				t.Errorf("error %v, want none", got.err)
			case c.err != nil && got.err == nil:
				t.Errorf("no error, want %v", c.err)
			case c.err != nil && c.err != errAny && !errors.Is(got.err, c.err):
				t.Errorf("error %v, want one that is %v", got.err, c.err)
			}
			got.err = nil
			for i := range got.logs {
				got.logs[i].kv = nil // the messages are compared; the values are the Events'
			}
			if diff := cmp.Diff(c.want, got, cmp.AllowUnexported(phaseVerdict{}, instanceAddress{}, recorded{}, phaseEvent{}, verdictLog{})); diff != "" {
				t.Errorf("verdict (-want +got):\n%s", diff)
			}
		})
	}
}

// probedHealthy gives the Proxy the health engine's Healthy condition for its current
// instance and address (healthy or failing), and a Preempted notice.
func probedHealthy(healthy bool) func(*v1alpha1.Proxy) {
	return func(px *v1alpha1.Proxy) {
		px.Status.Healthy, px.Status.ProbeTarget = healthy, px.CurrentProbeTarget()
		c := metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded, ObservedGeneration: px.Generation}
		if !healthy {
			c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonProbeFailed
		}
		px.Status.Conditions = append(px.Status.Conditions, c,
			metav1.Condition{Type: v1alpha1.ConditionPreempted, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonPreempted, Message: "preempted", ObservedGeneration: px.Generation})
	}
}
