package health

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// The probe of a Managed Proxy sends the credentials of its snapshot (what its instance
// was built with), not those of the Secret it references, which were rotated since; a
// Proxy without a snapshot is probed with the referenced Secret's.
func TestProbeUsesCredentialsSnapshot(t *testing.T) {
	var e *engineEnv
	e = newEngineEnv(t, func(o *Options) {
		o.Credentials = func(ctx context.Context, px *v1alpha1.Proxy) (*proxyconfig.Credentials, error) {
			return proxyconfig.SnapshotCredentials{Reader: e.mgr.GetClient()}.Credentials(ctx, px)
		}
	})
	built := proxyconfig.Credentials{Username: "crawler", Password: "Built-with.this_one1"}
	rotated := proxyconfig.Credentials{Username: "crawler", Password: "Rotated.since_two2"}
	e.putSecret("source", rotated, nil)

	probed := func(name string, snapshot bool) *v1alpha1.Proxy {
		t.Helper()
		fp := healthtest.New(t, "127.0.0.9")
		fp.RequireAuth(&healthtest.Auth{Username: built.Username, Password: built.Password})
		px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
			Spec: v1alpha1.ProxySpec{Provider: "fake-home", Port: fp.Port, Proxy: &v1alpha1.ProxyConfig{
				AllowedSourceRanges: []v1alpha1.CIDR{"127.0.0.0/8"},
				BasicAuth:           &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "source"}}}}}
		if err := e.c.Create(e.ctx, px); err != nil {
			t.Fatal(err)
		}
		st := v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseRunning, IP: fp.Host, ProviderID: "fake/" + name,
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionProvisioned, Status: metav1.ConditionTrue,
				Reason: v1alpha1.ReasonInstanceRunning, Message: "instance running", LastTransitionTime: metav1.Now()}}}
		if snapshot {
			st.CredentialsSecret = proxyconfig.SnapshotName(px)
			e.putSecret(st.CredentialsSecret, built, px)
		}
		px.Status = st
		if err := e.c.Status().Update(e.ctx, px); err != nil {
			t.Fatal(err)
		}
		waitFor(t, waitLong, "the engine's cache to see proxy "+name, func() (bool, error) {
			cached := &v1alpha1.Proxy{}
			err := e.mgr.GetClient().Get(e.ctx, client.ObjectKeyFromObject(px), cached)
			return err == nil && cached.Status.Phase == v1alpha1.PhaseRunning, err
		})
		return px
	}
	probed("with-snapshot", true)
	probed("without-snapshot", false)
	e.round()
	if px := e.get("with-snapshot"); shown(px) != v1alpha1.PhaseReady || !px.Status.Healthy {
		t.Errorf("the Proxy with a snapshot: phase %s healthy %v (%s), want Ready: probed with the snapshot's password", shown(px), px.Status.Healthy, px.Status.Message)
	}
	if px := e.get("without-snapshot"); px.Status.Healthy {
		t.Errorf("the Proxy without a snapshot is healthy: it was not probed with the referenced Secret's (rotated) password")
	}
}

// putSecret writes a basic-auth Secret, controlled by owner when not nil.
func (e *engineEnv) putSecret(name string, c proxyconfig.Credentials, owner *v1alpha1.Proxy) {
	e.t.Helper()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name,
		Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}}, Data: proxyconfig.SnapshotData(c)}
	if owner != nil {
		sec.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Proxy",
			Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}
	}
	if err := e.c.Create(e.ctx, sec); err != nil {
		e.t.Fatalf("creating secret %s: %v", name, err)
	}
}
