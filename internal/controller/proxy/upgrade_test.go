package proxy

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
)

const (
	upgradePw1 = "Pw1-before.rotation_17"
	upgradePw2 = "Pw2-after.rotation_93"
)

func outdatedWith(reason string) func(*v1alpha1.Proxy) bool {
	return func(p *v1alpha1.Proxy) bool {
		c := controllertest.ConfigOutdated(p)
		return c.Status == metav1.ConditionTrue && c.Reason == reason
	}
}

// runningAuthProxy creates a Proxy with basic auth from a Secret holding upgradePw1 and
// waits for it to run.
func (e *proxyEnv) runningAuthProxy(name, secret string, mutate func(*v1alpha1.Proxy)) *v1alpha1.Proxy {
	e.t.Helper()
	e.putSecret(secret, map[string]string{"username": "crawler", "password": upgradePw1})
	px := e.authProxy(name, secret)
	if mutate != nil {
		mutate(px)
	}
	e.create(px)
	return e.waitProxy(name, "running and up to date", func(p *v1alpha1.Proxy) bool {
		c := controllertest.ConfigOutdated(p)
		return p.Status.Phase == v1alpha1.PhaseRunning && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonUpToDate
	})
}

// annotate sets the Proxy's replace annotation to value.
func (e *proxyEnv) annotateReplace(name, value string) {
	e.t.Helper()
	px := e.get(name)
	base := px.DeepCopy()
	if px.Annotations == nil {
		px.Annotations = map[string]string{}
	}
	px.Annotations[v1alpha1.ReplaceAnnotation] = value
	if err := e.c.Patch(e.ctx, px, client.MergeFrom(base)); err != nil {
		e.t.Fatalf("annotating proxy %s: %v", name, err)
	}
}

// snapshotOf reads the Proxy's credentials snapshot Secret.
func (e *proxyEnv) snapshotOf(px *v1alpha1.Proxy) *corev1.Secret {
	e.t.Helper()
	sec := &corev1.Secret{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Namespace: e.ns, Name: proxyconfig.SnapshotName(px)}, sec); err != nil {
		e.t.Fatalf("reading the credentials snapshot of %s: %v", px.Name, err)
	}
	return sec
}

// probeCredentials are the credentials the health probe and discovery use for px.
func (e *proxyEnv) probeCredentials(px *v1alpha1.Proxy) *proxyconfig.Credentials {
	e.t.Helper()
	c, err := proxyconfig.SnapshotCredentials{Reader: e.c}.Credentials(e.ctx, px)
	if err != nil {
		e.t.Fatalf("credentials of %s for the probe: %v", px.Name, err)
	}
	return c
}

// An operator upgrade that changes the rendering keeps a standalone Proxy's instance
// and says so (ConfigOutdated=True, RenderingChanged, with the kubectl line); a new value
// of the replace annotation builds it again, once per value.
func TestProxyUpgradeKeepsInstanceUntilReplaceAnnotation(t *testing.T) {
	e := newProxyEnv(t)
	const name = "upgraded"
	before := e.runningAuthProxy(name, "upgrade-auth", nil)
	creates := e.fake.CountOf(providertest.OpCreate)

	controllertest.UpgradeRendering(t, "next-release")
	if _, err := e.reconcileNow(name); err != nil {
		t.Fatalf("reconcile after the upgrade: %v", err)
	}
	got := e.waitProxy(name, "ConfigOutdated=True RenderingChanged", outdatedWith(v1alpha1.ReasonRenderingChanged))
	if got.Status.ProviderID != before.Status.ProviderID || got.Status.RenderedHash != before.Status.RenderedHash ||
		got.Status.SpecHash != before.Status.SpecHash || got.Status.Phase != v1alpha1.PhaseRunning {
		t.Errorf("after the upgrade: %+v, want the instance and hashes of %+v", got.Status, before.Status)
	}
	if n := e.fake.CountOf(providertest.OpDelete); n != 0 || e.fake.CountOf(providertest.OpCreate) != creates {
		t.Fatalf("ops %v: the upgrade replaced the instance", e.ops())
	}
	wantLine := "kubectl annotate proxy -n " + e.ns + " " + name + ` egress.hrajfrisbee.cz/replace="$(date +%s)" --overwrite`
	if msg := controllertest.ConfigOutdated(got).Message; !strings.Contains(msg, wantLine) {
		t.Errorf("ConfigOutdated message %q lacks %q", msg, wantLine)
	}
	e.waitEvent(name, v1alpha1.ReasonRenderingChanged, "keeps running as it is")

	e.annotateReplace(name, "2026-12-01")
	got = e.waitProxy(name, "built again and up to date", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseRunning && p.Status.RenderedHash != before.Status.RenderedHash &&
			controllertest.ConfigOutdated(p).Reason == v1alpha1.ReasonUpToDate
	})
	if got.Status.ObservedReplace != "2026-12-01" || got.Status.SpecHash != before.Status.SpecHash {
		t.Errorf("after the replacement: observedReplace %q specHash %q, want 2026-12-01 and %q", got.Status.ObservedReplace, got.Status.SpecHash, before.Status.SpecHash)
	}
	if n := e.fake.CountOf(providertest.OpDelete); n != 1 {
		t.Errorf("ops %v: want exactly one Delete for the annotation", e.ops())
	}
	cs := e.creates()
	if last := cs[len(cs)-1]; !strings.Contains(string(last.CloudInit), "rendering variant next-release") || last.SpecHash != got.Status.RenderedHash {
		t.Errorf("the replacement was not built from the new rendering (mark %q, want %q)", last.SpecHash, got.Status.RenderedHash)
	}
	// The same value again asks for nothing more.
	if _, err := e.reconcileNow(name); err != nil {
		t.Fatal(err)
	}
	if n := e.fake.CountOf(providertest.OpDelete); n != 1 {
		t.Errorf("ops %v: the annotation acted on twice", e.ops())
	}
}

// A pool child is never replaced by its own reconciler for a rendering or credentials
// change: it shows ConfigOutdated=True for its pool, keeps its instance and its snapshot,
// and the probe keeps sending the password the instance was built with. The replace
// annotation is the pool's business on a child.
func TestPoolChildNotReplacedByItsReconciler(t *testing.T) {
	e := newProxyEnv(t)
	const name, secret = "child", "pool-auth"
	before := e.runningAuthProxy(name, secret, func(px *v1alpha1.Proxy) {
		px.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyPool",
			Name: "crawlers", UID: types.UID("0d1e-pool-uid"), Controller: ptrTo(true)}}
	})

	// A rotation: CredentialsChanged, the old password kept for the old instance.
	e.putSecret(secret, map[string]string{"username": "crawler", "password": upgradePw2})
	got := e.waitProxy(name, "ConfigOutdated=True CredentialsChanged", outdatedWith(v1alpha1.ReasonCredentialsChanged))
	if n := e.fake.CountOf(providertest.OpDelete); n != 0 || got.Status.SpecHash != before.Status.SpecHash {
		t.Fatalf("ops %v, specHash %q (was %q): the child was replaced by its reconciler", e.ops(), got.Status.SpecHash, before.Status.SpecHash)
	}
	if msg := controllertest.ConfigOutdated(got).Message; !strings.Contains(msg, "ProxyPool crawlers replaces it") {
		t.Errorf("ConfigOutdated message %q does not name the pool", msg)
	}
	if pw := string(e.snapshotOf(got).Data["password"]); pw != upgradePw1 {
		t.Errorf("the snapshot holds %q after the rotation, want the password the instance was built with", pw)
	}
	if c := e.probeCredentials(got); c == nil || c.Password != upgradePw1 {
		t.Errorf("the probe would send %+v, want the old password", c)
	}

	// An upgrade on top: still no replacement.
	controllertest.UpgradeRendering(t, "next-release")
	if _, err := e.reconcileNow(name); err != nil {
		t.Fatal(err)
	}
	// The Secret back to the password of the instance: the intent matches again, and only
	// the rendering differs.
	e.putSecret(secret, map[string]string{"username": "crawler", "password": upgradePw1})
	got = e.waitProxy(name, "ConfigOutdated=True RenderingChanged", outdatedWith(v1alpha1.ReasonRenderingChanged))
	if msg := controllertest.ConfigOutdated(got).Message; !strings.Contains(msg, "ProxyPool crawlers replaces it surge-first") {
		t.Errorf("ConfigOutdated message %q does not name the pool", msg)
	}

	// The replace annotation is refused on a child, with an Event, once.
	e.annotateReplace(name, "1")
	e.waitEvent(name, v1alpha1.ReasonReplaceIgnored, "the pool replaces its children")
	got = e.waitProxy(name, "the annotation observed", func(p *v1alpha1.Proxy) bool { return p.Status.ObservedReplace == "1" })
	if n := e.fake.CountOf(providertest.OpDelete); n != 0 || got.Status.ProviderID != before.Status.ProviderID {
		t.Errorf("ops %v: the child was replaced", e.ops())
	}
}

// The replace annotation on an External Proxy is refused with a message naming it.
func TestReplaceAnnotationRefusedOnExternalProxy(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	px := testbuild.Proxy(e.ns, "ext", testbuild.WithAnnotation(v1alpha1.ReplaceAnnotation, "now"), testbuild.External("192.0.2.10"))
	e.create(px)
	want := "annotation egress.hrajfrisbee.cz/replace is ignored: an External proxy (spec.mode) has no instance the operator could build again"
	got := e.waitProxy("ext", "refusing the annotation", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseRunning && strings.Contains(p.Status.Message, want)
	})
	if got.Status.ObservedReplace != "now" {
		t.Errorf("observedReplace %q, want now", got.Status.ObservedReplace)
	}
	ev := e.waitEvent("ext", v1alpha1.ReasonReplaceIgnored, want)
	if ev.Type != corev1.EventTypeWarning {
		t.Errorf("event %s, want a Warning", ev.Type)
	}
}

// The snapshot is made at Create, controlled by the Proxy and labelled as a credentials
// Secret; a rotation replaces a standalone Proxy and snapshots the new password; a Secret
// of the snapshot's name that is not the Proxy's is never written.
func TestCredentialsSnapshot(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	const name, secret = "snap", "snap-auth"
	got := e.runningAuthProxy(name, secret, nil)
	sec := e.snapshotOf(got)
	if got.Status.CredentialsSecret != sec.Name || !metav1.IsControlledBy(sec, got) || sec.Labels[v1alpha1.CredentialsLabel] != "true" ||
		string(sec.Data["username"]) != "crawler" || string(sec.Data["password"]) != upgradePw1 {
		t.Fatalf("snapshot %s (status %q): owners %+v labels %v, keys %d", sec.Name, got.Status.CredentialsSecret, sec.OwnerReferences, sec.Labels, len(sec.Data))
	}
	if !strings.HasPrefix(sec.Name, got.InstanceName()) {
		t.Errorf("snapshot name %q, want one from the instance name %s", sec.Name, got.InstanceName())
	}

	// A rotation on a standalone Proxy replaces it, with a new snapshot.
	e.putSecret(secret, map[string]string{"username": "crawler", "password": upgradePw2})
	got = e.waitProxy(name, "replaced after the rotation", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhaseRunning && p.Status.SpecHash != got.Status.SpecHash && p.Status.ProviderID != ""
	})
	if n := e.fake.CountOf(providertest.OpDelete); n != 1 {
		t.Errorf("ops %v, want the instance replaced once", e.ops())
	}
	if pw := string(e.snapshotOf(got).Data["password"]); pw != upgradePw2 {
		t.Errorf("snapshot password %q after the rotation, want the new one", pw)
	}
	if c := e.probeCredentials(got); c == nil || c.Password != upgradePw2 {
		t.Errorf("the probe would send %+v, want the new password", c)
	}

	// A Secret someone else made under the snapshot's name.
	other := e.authProxy("taken", secret)
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: proxyconfig.SnapshotName(other)},
		Data: map[string][]byte{"note": []byte("someone else's")}}
	if err := e.c.Create(e.ctx, foreign); err != nil {
		t.Fatal(err)
	}
	e.create(other)
	want := "secret " + e.ns + "/" + foreign.Name + " exists and is not controlled by proxy taken"
	e.waitProxy("taken", "refusing the foreign Secret", func(p *v1alpha1.Proxy) bool {
		return p.Status.Phase == v1alpha1.PhasePending && provisioned(p).Reason == v1alpha1.ReasonCredentialsUnavailable &&
			strings.Contains(p.Status.Message, want)
	})
	e.waitEvent("taken", v1alpha1.ReasonCredentialsUnavailable, want)
	after := &corev1.Secret{}
	if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(foreign), after); err != nil || len(after.Data) != 1 || string(after.Data["note"]) != "someone else's" || len(after.OwnerReferences) != 0 {
		t.Errorf("the foreign Secret was changed: %v %+v", err, after)
	}
	for _, c := range e.creates() {
		if c.Name == other.InstanceName() {
			t.Errorf("instance %s created without its snapshot", c.Name)
		}
	}
}

// A Proxy built by the release before (status.specHash over the rendered text, no
// rendered hash, no snapshot) is adopted on the first reconcile when that hash still
// matches: the instance stays, the new hashes and a snapshot are recorded. One whose old
// hash does not match is replaced, as that release would have.
func TestLegacyProxyAdopted(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	const name, secret = "legacy", "legacy-auth"
	built := e.runningAuthProxy(name, secret, nil)
	legacy := func(specHash string) {
		t.Helper()
		px := e.get(name)
		base := px.DeepCopy()
		px.Status.SpecHash, px.Status.RenderedHash, px.Status.CredentialsSecret = specHash, "", ""
		meta.RemoveStatusCondition(&px.Status.Conditions, v1alpha1.ConditionConfigOutdated)
		if err := e.c.Status().Patch(e.ctx, px, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			t.Fatal(err)
		}
		if err := e.c.Delete(e.ctx, e.snapshotOf(px)); err != nil {
			t.Fatal(err)
		}
	}
	legacy(built.Status.RenderedHash) // what the release before wrote into status.specHash
	if _, err := e.reconcileNow(name); err != nil {
		t.Fatal(err)
	}
	got := e.waitProxy(name, "adopted", func(p *v1alpha1.Proxy) bool { return p.Status.RenderedHash != "" && p.Status.CredentialsSecret != "" })
	if got.Status.SpecHash != built.Status.SpecHash || got.Status.RenderedHash != built.Status.RenderedHash || got.Status.ProviderID != built.Status.ProviderID {
		t.Errorf("adopted as %+v, want the hashes and instance of %+v", got.Status, built.Status)
	}
	if n := e.fake.CountOf(providertest.OpDelete); n != 0 {
		t.Fatalf("ops %v: the legacy instance was replaced", e.ops())
	}
	if c := controllertest.ConfigOutdated(got); c.Reason != v1alpha1.ReasonUpToDate {
		t.Errorf("ConfigOutdated %+v after the adoption, want UpToDate", c)
	}
	if pw := string(e.snapshotOf(got).Data["password"]); pw != upgradePw1 {
		t.Errorf("adoption snapshot password %q", pw)
	}
	e.waitEvent(name, v1alpha1.ReasonAdopted, "is kept as it is")

	// An old-style hash that does not match: an earlier version's other rendering (or a
	// change made while no operator ran, which cannot be told from it). Kept, and shown
	// ConfigOutdated, never replaced on the guess.
	legacy("0123456789abcdef")
	if _, err := e.reconcileNow(name); err != nil {
		t.Fatal(err)
	}
	got = e.waitProxy(name, "adopted as outdated", func(p *v1alpha1.Proxy) bool {
		return p.Status.RenderedHash == "0123456789abcdef" && p.Status.CredentialsSecret != ""
	})
	if n := e.fake.CountOf(providertest.OpDelete); n != 0 || got.Status.ProviderID != built.Status.ProviderID {
		t.Errorf("ops %v: the mismatching legacy instance was replaced", e.ops())
	}
	if c := controllertest.ConfigOutdated(got); c.Reason != v1alpha1.ReasonRenderingChanged || c.Status != metav1.ConditionTrue {
		t.Errorf("ConfigOutdated %+v after adopting another rendering, want True RenderingChanged", c)
	}
	e.waitEvent(name, v1alpha1.ReasonAdopted, "from another rendering")
}

func ptrTo[T any](v T) *T { return &v }
