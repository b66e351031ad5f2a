package controller

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// kstatusOf is what cli-utils' kstatus (the library kubectl wait, Flux and Argo CD's
// health checks follow) says about obj.
func kstatusOf(t testing.TB, obj client.Object) *status.Result {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	res, err := status.Compute(&unstructured.Unstructured{Object: m})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// Every phase of a Proxy's life, with the conditions the reconciler sets before a write,
// reads as a user would expect: Ready is Current, a permanent error or a Secret the user
// must fix is Failed, everything else is InProgress; a generation not yet observed is
// InProgress whatever the conditions say.
func TestProxyKstatusForEachPhase(t *testing.T) {
	prov := func(st metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: v1alpha1.ConditionProvisioned, Status: st, Reason: reason, Message: reason + " (test)"}
	}
	for _, tc := range []struct {
		name   string
		phase  v1alpha1.ProxyPhase
		conds  []metav1.Condition
		behind bool
		want   status.Status
		reason string
	}{
		{"new", "", nil, false, status.InProgressStatus, "Pending"},
		{"pending on quota", v1alpha1.PhasePending, []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded)}, false, status.InProgressStatus, "Pending"},
		{"provisioning", v1alpha1.PhaseProvisioning, []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonImageDownloading)}, false, status.InProgressStatus, "Provisioning"},
		{"running, probe not passed yet", v1alpha1.PhaseRunning, []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning)}, false, status.InProgressStatus, "Running"},
		{"ready", v1alpha1.PhaseReady, []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning)}, false, status.CurrentStatus, v1alpha1.ReasonProbeSucceeded},
		{"ready, spec changed since", v1alpha1.PhaseReady, []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning)}, true, status.InProgressStatus, ""},
		{"failed", v1alpha1.PhaseFailed, []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonPermanentError)}, false, status.FailedStatus, v1alpha1.ReasonPermanentError},
		{"unlabelled Secret", v1alpha1.PhasePending, []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonCredentialsUnavailable)}, false, status.FailedStatus, v1alpha1.ReasonCredentialsUnavailable},
		{"broken WireGuard Secret", v1alpha1.PhasePending, []metav1.Condition{prov(metav1.ConditionFalse, v1alpha1.ReasonEgressUnavailable)}, false, status.FailedStatus, v1alpha1.ReasonEgressUnavailable},
		{"being remediated", v1alpha1.PhaseRunning, []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning),
			{Type: remediation.ConditionRemediating, Status: metav1.ConditionTrue, Reason: remediation.ReasonBootTimeout, Message: "attempt 1"}}, false, status.InProgressStatus, remediation.ReasonBootTimeout},
		{"remediation held by the brake", v1alpha1.PhaseRunning, []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning),
			{Type: remediation.ConditionRemediating, Status: metav1.ConditionFalse, Reason: remediation.ReasonTooManyUnhealthy, Message: "held"}}, false, status.InProgressStatus, remediation.ReasonTooManyUnhealthy},
		{"remediation gave up", v1alpha1.PhaseRunning, []metav1.Condition{prov(metav1.ConditionTrue, v1alpha1.ReasonInstanceRunning),
			{Type: remediation.ConditionRemediating, Status: metav1.ConditionFalse, Reason: ReasonAttemptsExhausted, Message: "gave up"}}, false, status.FailedStatus, ReasonAttemptsExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			px := managedProxy("k")
			px.Generation = 2
			px.Status = v1alpha1.ProxyStatus{Phase: tc.phase, Message: "set by the test", Conditions: tc.conds, ObservedGeneration: 2}
			setKstatus(&px.Status.Conditions, px.Generation, proxyKstate(px))
			if tc.behind {
				px.Generation = 3
			}
			res := kstatusOf(t, px)
			if res.Status != tc.want {
				t.Errorf("kstatus %s (%s), want %s", res.Status, res.Message, tc.want)
			}
			if tc.reason != "" {
				ready := poolCondition(&v1alpha1.ProxyPool{Status: v1alpha1.ProxyPoolStatus{Conditions: px.Status.Conditions}}, v1alpha1.ConditionReady)
				if ready.Reason != tc.reason || (ready.Status == metav1.ConditionTrue) != (tc.want == status.CurrentStatus) {
					t.Errorf("Ready %+v, want reason %s, True only when Current", ready, tc.reason)
				}
			}
		})
	}
	// Deleting is Terminating, from the deletion timestamp.
	px := managedProxy("k")
	px.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	px.Status.Phase = v1alpha1.PhaseDeleting
	setKstatus(&px.Status.Conditions, px.Generation, proxyKstate(px))
	if res := kstatusOf(t, px); res.Status != status.TerminatingStatus {
		t.Errorf("a deleting Proxy: kstatus %s, want Terminating", res.Status)
	}
}

// Against the API server, with the reconciler and a stand-in for the health engine: a
// standalone Proxy is InProgress while it boots and Current once Ready; a pool is
// InProgress while its children come up, Current when complete, InProgress while it
// scales, and Failed while the Secret its template names is gone; the conditions have
// one writer each (Reconciling and Stalled never both).
func TestKstatusThroughLife(t *testing.T) {
	env := testenv.StartT(t)
	e := newPoolEnv(t, env)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "k-auth", Namespace: e.ns, Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}},
		Data:       map[string][]byte{"username": []byte("crawler"), "password": []byte("Pass-word.1")},
	}
	if err := e.c.Create(e.ctx, sec); err != nil {
		t.Fatal(err)
	}
	pool := e.newPool("k", 2)
	pool.Spec.Template.Spec.Proxy = &v1alpha1.ProxyConfig{
		AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"},
		BasicAuth:           &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "k-auth"}},
	}
	// The health stand-in leaves every child unprobed until released.
	var holding atomic.Bool
	holding.Store(true)
	e.mu.Lock()
	e.holdIf = func(*v1alpha1.Proxy) bool { return holding.Load() }
	e.mu.Unlock()
	e.create(pool)
	e.waitPool("k", "the pool to be InProgress with its children Running", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return kstatusOf(t, p).Status == status.InProgressStatus && p.Status.ObservedGeneration == p.Generation && len(kids) == 2
	})
	holding.Store(false)
	e.clock.Step(time.Duration(pool.Spec.MinReadySeconds) * time.Second)
	e.poke("k")
	e.waitPool("k", "the pool to be Current", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return kstatusOf(t, p).Status == status.CurrentStatus
	})
	for _, kid := range e.children("k") {
		if res := kstatusOf(t, &kid); res.Status != status.CurrentStatus {
			t.Errorf("child %s of a complete pool: kstatus %s (%s), want Current", kid.Name, res.Status, res.Message)
		}
	}

	// Scaling up: InProgress until the new child is available.
	holding.Store(true)
	e.scale("k", 3)
	e.waitPool("k", "the scaling pool to be InProgress", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return kstatusOf(t, p).Status == status.InProgressStatus && p.Status.ObservedGeneration == p.Generation && len(kids) == 3
	})
	holding.Store(false)
	e.clock.Step(time.Duration(pool.Spec.MinReadySeconds) * time.Second)
	e.poke("k")
	e.waitPool("k", "the scaled pool to be Current", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return kstatusOf(t, p).Status == status.CurrentStatus
	})

	// The Secret goes: the pool cannot go on without the user, Failed with the reason.
	if err := e.c.Delete(e.ctx, sec); err != nil {
		t.Fatal(err)
	}
	got := e.waitPool("k", "the pool without its Secret to be Failed", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return kstatusOf(t, p).Status == status.FailedStatus
	})
	stalled := poolCondition(got, v1alpha1.ConditionStalled)
	if stalled.Reason != v1alpha1.PoolReasonCredentialsUnavailable || poolCondition(got, v1alpha1.ConditionReconciling).Type != "" {
		t.Errorf("Stalled %+v, Reconciling %+v: want Stalled CredentialsUnavailable alone", stalled, poolCondition(got, v1alpha1.ConditionReconciling))
	}
	if owners := testenv.StatusManagers(got); len(owners) != 1 {
		t.Errorf("pool status managers %v, want proxypool-controller alone", owners)
	}

	// A standalone Proxy: InProgress while Running without a probe, Current once Ready.
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "alone", Namespace: e.ns},
		Spec: v1alpha1.ProxySpec{Provider: testProvider,
			Placement: v1alpha1.ProxyPlacement{Zone: "beelink", MachineType: "small", Image: "debian-12"}}}
	e.hold("alone")
	if err := e.c.Create(e.ctx, px); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "proxy alone to be Running and InProgress", func() (bool, error) {
		cur := &v1alpha1.Proxy{}
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(px), cur); err != nil {
			return false, err
		}
		res := kstatusOf(t, cur)
		return cur.Status.Phase == v1alpha1.PhaseRunning && res.Status == status.InProgressStatus,
			fmt.Errorf("phase %s, kstatus %s (%s)", cur.Status.Phase, res.Status, res.Message)
	})
	e.mu.Lock()
	delete(e.unhealth, "alone")
	e.mu.Unlock()
	waitFor(t, waitLong, "proxy alone to be Ready and Current", func() (bool, error) {
		cur := &v1alpha1.Proxy{}
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(px), cur); err != nil {
			return false, err
		}
		res := kstatusOf(t, cur)
		return cur.Status.Phase == v1alpha1.PhaseReady && res.Status == status.CurrentStatus,
			fmt.Errorf("phase %s, kstatus %s (%s)", cur.Status.Phase, res.Status, res.Message)
	})
}
