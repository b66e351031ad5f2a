package pool

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// Against the API server, with the reconciler and a stand-in for the health engine: a
// standalone Proxy is InProgress while it boots and Current once Ready; a pool is
// InProgress while its children come up, Current when complete, InProgress while it
// scales, and Failed while the Secret its template names is gone; the conditions have
// one writer each (Reconciling and Stalled never both).
func TestKstatusThroughLife(t *testing.T) {
	t.Parallel()
	e := newPoolEnv(t, shared.Env(t))
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "k-auth", Namespace: e.NS, Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}},
		Data:       map[string][]byte{"username": []byte("crawler"), "password": []byte("Pass-word.1")},
	}
	if err := e.C.Create(e.Ctx, sec); err != nil {
		t.Fatal(err)
	}
	pool := e.NewPool("k", 2)
	pool.Spec.Template.Spec.Proxy = &v1alpha1.ProxyConfig{
		AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"},
		BasicAuth:           &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "k-auth"}},
	}
	// The health stand-in leaves every child unprobed until released.
	var holding atomic.Bool
	holding.Store(true)
	e.HoldWhere(func(*v1alpha1.Proxy) bool { return holding.Load() })
	e.Create(pool)
	e.WaitPool("k", "the pool to be InProgress with its children Running", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return controllertest.KstatusOf(t, p).Status == status.InProgressStatus && p.Status.ObservedGeneration == p.Generation && len(kids) == 2
	})
	holding.Store(false)
	e.Clock.Step(time.Duration(pool.Spec.MinReadySeconds) * time.Second)
	e.Poke("k")
	e.WaitPool("k", "the pool to be Current", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return controllertest.KstatusOf(t, p).Status == status.CurrentStatus
	})
	for _, kid := range e.Children("k") {
		if res := controllertest.KstatusOf(t, &kid); res.Status != status.CurrentStatus {
			t.Errorf("child %s of a complete pool: kstatus %s (%s), want Current", kid.Name, res.Status, res.Message)
		}
	}

	// Scaling up: InProgress until the new child is available.
	holding.Store(true)
	e.scale("k", 3)
	e.WaitPool("k", "the scaling pool to be InProgress", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return controllertest.KstatusOf(t, p).Status == status.InProgressStatus && p.Status.ObservedGeneration == p.Generation && len(kids) == 3
	})
	holding.Store(false)
	e.Clock.Step(time.Duration(pool.Spec.MinReadySeconds) * time.Second)
	e.Poke("k")
	e.WaitPool("k", "the scaled pool to be Current", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return controllertest.KstatusOf(t, p).Status == status.CurrentStatus
	})

	// The Secret goes: the pool cannot go on without the user, Failed with the reason.
	if err := e.C.Delete(e.Ctx, sec); err != nil {
		t.Fatal(err)
	}
	got := e.WaitPool("k", "the pool without its Secret to be Failed", func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		return controllertest.KstatusOf(t, p).Status == status.FailedStatus
	})
	stalled := controllertest.PoolCondition(got, v1alpha1.ConditionStalled)
	if stalled.Reason != v1alpha1.PoolReasonCredentialsUnavailable || controllertest.PoolCondition(got, v1alpha1.ConditionReconciling).Type != "" {
		t.Errorf("Stalled %+v, Reconciling %+v: want Stalled CredentialsUnavailable alone", stalled, controllertest.PoolCondition(got, v1alpha1.ConditionReconciling))
	}
	if owners := testenv.StatusManagers(got); len(owners) != 1 {
		t.Errorf("pool status managers %v, want proxypool-controller alone", owners)
	}

	// A standalone Proxy: InProgress while Running without a probe, Current once Ready.
	px := testbuild.Proxy(e.NS, "alone", testbuild.WithProvider(testProvider),
		testbuild.WithPlacement(v1alpha1.ProxyPlacement{Zone: "beelink", MachineType: "small", Image: "debian-12"}))
	e.Hold("alone")
	if err := e.C.Create(e.Ctx, px); err != nil {
		t.Fatal(err)
	}
	waitFor(t, waitLong, "proxy alone to be Running and InProgress", func() (bool, error) {
		cur := &v1alpha1.Proxy{}
		if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(px), cur); err != nil {
			return false, err
		}
		res := controllertest.KstatusOf(t, cur)
		return cur.Status.Phase == v1alpha1.PhaseRunning && res.Status == status.InProgressStatus,
			fmt.Errorf("phase %s, kstatus %s (%s)", cur.Status.Phase, res.Status, res.Message)
	})
	e.Release("alone")
	waitFor(t, waitLong, "proxy alone to be Ready and Current", func() (bool, error) {
		cur := &v1alpha1.Proxy{}
		if err := e.C.Get(e.Ctx, client.ObjectKeyFromObject(px), cur); err != nil {
			return false, err
		}
		res := controllertest.KstatusOf(t, cur)
		return cur.Status.Phase == v1alpha1.PhaseReady && res.Status == status.CurrentStatus,
			fmt.Errorf("phase %s, kstatus %s (%s)", cur.Status.Phase, res.Status, res.Message)
	})
}
