package proxy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// newLaggingEnv is a syncEnv whose reconciler reads the Proxy name through a
// controllertest.LaggingCache (APIReader stays the server), with the credentials Secret "creds"
// holding upgradePw1, and the Proxy reconciled to Running. It returns the Proxy and its
// version as created, with the finalizer on and no status: a copy a cache may still
// hold when the reconciler has written several since.
func newLaggingEnv(t *testing.T, name string, mutate func(*v1alpha1.Proxy)) (e *syncEnv, lag *controllertest.LaggingCache, px, created *v1alpha1.Proxy) {
	e = newSyncEnv(t)
	lag = &controllertest.LaggingCache{Client: e.c}
	e.r.Client = lag
	e.putSecret("creds", upgradePw1)
	px = authProxyIn(e.ns, name, "creds")
	px.Finalizers = []string{Finalizer}
	if mutate != nil {
		mutate(px)
	}
	if err := e.c.Create(e.ctx, px); err != nil {
		t.Fatalf("creating proxy %s: %v", name, err)
	}
	created = px.DeepCopy()
	for i := 0; px.Status.Phase != v1alpha1.PhaseRunning; i++ {
		if i == 5 {
			t.Fatalf("proxy %s not Running after 5 reconciles: phase %s, %s", name, px.Status.Phase, px.Status.Message)
		}
		e.reconcile(px)
	}
	return e, lag, px, created
}

func (e *syncEnv) putSecret(name, password string) {
	e.t.Helper()
	writeSecretIn(e.t, e.ctx, e.c, e.ns, name, map[string]string{"username": "crawler", "password": password},
		map[string]string{v1alpha1.CredentialsLabel: "true"})
}

// reconcileLagging runs one reconcile through the lagging cache, which answers stale
// for the Proxy; it wants the reconcile to decide nothing: no provider call, nothing
// written, and a quick requeue.
func (e *syncEnv) reconcileLagging(lag *controllertest.LaggingCache, stale *v1alpha1.Proxy) {
	e.t.Helper()
	before, ops := e.getProxy(stale.Name), len(e.ops())
	lag.Stale = stale
	res, err := e.r.Reconcile(e.ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(stale)})
	lag.Stale = nil
	if err != nil || res.RequeueAfter != staleRetry {
		e.t.Errorf("a reconcile from a copy (version %s) older than the reconciler's last write = %+v, %v; want a requeue after %v",
			stale.ResourceVersion, res, err, staleRetry)
	}
	if got := e.ops()[ops:]; len(got) != 0 {
		e.t.Errorf("a reconcile from a stale copy called the provider: %v", got)
	}
	if after := e.getProxy(stale.Name); after.ResourceVersion != before.ResourceVersion {
		e.t.Errorf("a reconcile from a stale copy wrote the Proxy: version %s -> %s, status %+v", before.ResourceVersion, after.ResourceVersion, after.Status)
	}
}

func (e *syncEnv) getProxy(name string) *v1alpha1.Proxy {
	e.t.Helper()
	return getProxyIn(e.t, e.ctx, e.c, e.ns, name)
}

// A reconcile handed a copy of the Proxy older than the reconciler's own last write of it
// (the cache behind, woken by a Secret event) decides nothing from it: it neither acts
// on the provider or the credentials snapshot for a state already left behind, nor takes
// its status for current when nothing differs from that old copy. Both were seen under
// load: a pool child's snapshot overwritten with a rotated password and the child then
// replaced by its own reconciler; a Proxy kept waiting for a Secret created again.
func TestReconcileBehindItsOwnWriteDecidesNothing(t *testing.T) {
	t.Parallel()
	t.Run("a pool child's rotated password", func(t *testing.T) {
		t.Parallel()
		e, lag, px, created := newLaggingEnv(t, "child", func(px *v1alpha1.Proxy) {
			px.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyPool",
				Name: "crawlers", UID: "0d1e-pool-uid", Controller: ptrTo(true)}}
		})
		e.putSecret("creds", upgradePw2)
		e.reconcileLagging(lag, created)
		snap := &corev1.Secret{}
		if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: px.Status.CredentialsSecret}, snap); err != nil {
			t.Fatal(err)
		}
		if pw := string(snap.Data["password"]); pw != upgradePw1 {
			t.Errorf("the snapshot holds %q, want the password the instance was built with", pw)
		}
		// Once the cache has caught up: the pool's to replace, the instance kept.
		e.reconcile(px)
		if c := controllertest.ConfigOutdated(px); c.Reason != v1alpha1.ReasonCredentialsChanged {
			t.Errorf("ConfigOutdated %+v, want CredentialsChanged", c)
		}
		if n := e.fake.CountOf(providertest.OpDelete); n != 0 {
			t.Errorf("ops %v: the child was replaced by its own reconciler", e.ops())
		}
	})
	t.Run("a Secret created again", func(t *testing.T) {
		t.Parallel()
		e, lag, px, _ := newLaggingEnv(t, "solo", nil)
		running := px.DeepCopy()
		if err := e.c.Delete(e.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "creds"}}); err != nil {
			t.Fatal(err)
		}
		e.reconcile(px)
		if c := provisioned(px); c.Reason != v1alpha1.ReasonCredentialsUnavailable {
			t.Fatalf("Provisioned %+v with the Secret gone, want CredentialsUnavailable", c)
		}
		e.putSecret("creds", upgradePw1)
		// The copy from before the wait, Provisioned True as the reconciler wants it again:
		// without the check it writes nothing and nothing wakes the Proxy after.
		e.reconcileLagging(lag, running)
		e.reconcile(px)
		if c := provisioned(px); c.Status != metav1.ConditionTrue {
			t.Errorf("Provisioned %+v once the cache caught up, want True", c)
		}
	})
}
