package proxy

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// fencedProxy is a Managed Proxy, without credentials, whose fence lets it reach dests.
func (e *proxyEnv) fencedProxy(name string, dests ...v1alpha1.CIDR) *v1alpha1.Proxy {
	px := e.newProxy(name)
	px.Spec.Proxy = &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"}, AllowedDestinations: dests}
	return px
}

// upToDate: the instance runs what this operator version builds for the spec.
func upToDate(p *v1alpha1.Proxy) bool {
	c := controllertest.ConfigOutdated(p)
	return p.Status.Phase == v1alpha1.PhaseRunning && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonUpToDate &&
		c.ObservedGeneration == p.Generation
}

// Narrowing a standalone Proxy's fence (allowedDestinations) replaces its instance with
// one built with the narrower fence, as any spec change does; it is not shown as an
// operator's rendering change while the old, wider fence keeps running.
func TestNarrowedAllowedDestinationsReplacesInstance(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	const name = "fenced"
	e.create(e.fencedProxy(name, "192.168.7.0/24", "10.20.0.0/16"))
	before := e.waitProxy(name, "running and up to date", upToDate)
	if cs := e.creates(); len(cs) != 1 || !strings.Contains(string(cs[0].CloudInit), "192.168.7.0/24") {
		t.Fatalf("creates %d, want one whose fence admits 192.168.7.0/24", len(cs))
	}

	edit := func(dests ...v1alpha1.CIDR) {
		t.Helper()
		e.edit(name, "spec.proxy.allowedDestinations", func(px *v1alpha1.Proxy) { px.Spec.Proxy.AllowedDestinations = dests })
	}
	for i, step := range []struct {
		dests []v1alpha1.CIDR
		gone  string
	}{
		{[]v1alpha1.CIDR{"10.20.0.0/16"}, "192.168.7.0/24"}, // one internal destination removed
		{nil, "10.20.0.0/16"},                               // the last one removed
	} {
		edit(step.dests...)
		got := e.waitProxy(name, "replaced with the narrower fence", func(p *v1alpha1.Proxy) bool {
			return upToDate(p) && p.Status.SpecHash != before.Status.SpecHash
		})
		if n := e.fake.CountOf(providertest.OpDelete); n != i+1 {
			t.Errorf("ops %v after removing %s: want the instance replaced (%d Deletes)", e.ops(), step.gone, i+1)
		}
		cs := e.creates()
		if last := cs[len(cs)-1]; len(cs) != i+2 || strings.Contains(string(last.CloudInit), step.gone) || last.SpecHash != got.Status.RenderedHash {
			t.Errorf("creates %d: the last one still admits %s, or is not marked with rendered hash %s", len(cs), step.gone, got.Status.RenderedHash)
		}
		before = got
	}
	evs, err := e.events(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Reason == v1alpha1.ReasonRenderingChanged {
			t.Errorf("event %s %q: a narrowed fence was taken for a rendering change", ev.Reason, ev.Note)
		}
	}
}

// setStatusHashes writes the Proxy's status hashes as an earlier operator version left
// them.
func (e *proxyEnv) setStatusHashes(name, specHash, renderedHash string) {
	e.t.Helper()
	px := e.get(name)
	base := px.DeepCopy()
	px.Status.SpecHash, px.Status.RenderedHash = specHash, renderedHash
	if err := e.c.Status().Patch(e.ctx, px, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		e.t.Fatalf("writing the status hashes of proxy %s: %v", name, err)
	}
}

// A status.specHash recorded by an operator version whose intent hash missed
// allowedDestinations and allowOpenProxy is adopted when it matches the spec: the
// instance stays when it was built from this version's rendering, and a pool child stays
// in any case (its pool replaces it surge-first). A standalone Proxy built from another
// rendering is replaced: its fence may have been edited under that version.
func TestPartialIntentAdopted(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	const name, child = "partial", "partial-child"
	e.create(e.fencedProxy(name, "192.168.7.0/24"))
	built := e.waitProxy(name, "running and up to date", upToDate)
	partial, err := partialIntentHash(built, nil, nil)
	if err != nil || partial == built.Status.SpecHash {
		t.Fatalf("partial intent hash %q (%v), want one other than %q", partial, err, built.Status.SpecHash)
	}

	// The same rendering: kept, this version's hash recorded.
	e.setStatusHashes(name, partial, built.Status.RenderedHash)
	if _, err := e.reconcileNow(name); err != nil {
		t.Fatal(err)
	}
	got := e.waitProxy(name, "adopted", func(p *v1alpha1.Proxy) bool { return p.Status.SpecHash == built.Status.SpecHash })
	if n := e.fake.CountOf(providertest.OpDelete); n != 0 || !upToDate(got) {
		t.Errorf("ops %v, ConfigOutdated %+v: want the instance kept and up to date", e.ops(), controllertest.ConfigOutdated(got))
	}
	e.waitEvent(name, v1alpha1.ReasonAdopted, "over part of spec.proxy")

	// Another rendering: the fence may be an older spec's; replaced.
	e.setStatusHashes(name, partial, "0123456789abcdef")
	if _, err := e.reconcileNow(name); err != nil {
		t.Fatal(err)
	}
	e.waitProxy(name, "replaced", func(p *v1alpha1.Proxy) bool {
		return upToDate(p) && p.Status.RenderedHash == built.Status.RenderedHash && p.Status.SpecHash == built.Status.SpecHash
	})
	if n := e.fake.CountOf(providertest.OpDelete); n != 1 {
		t.Errorf("ops %v: want the instance of another rendering replaced once", e.ops())
	}
	e.waitEvent(name, EventReplacing, "allowedDestinations or allowOpenProxy may have been edited")

	// A pool child of another rendering: kept for its pool, shown outdated.
	px := e.fencedProxy(child, "192.168.7.0/24")
	px.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyPool",
		Name: "crawlers", UID: types.UID("0d1e-pool-uid"), Controller: ptrTo(true)}}
	e.create(px)
	kid := e.waitProxy(child, "running and up to date", upToDate)
	deletes := e.fake.CountOf(providertest.OpDelete)
	e.setStatusHashes(child, partial, "0123456789abcdef")
	if _, err := e.reconcileNow(child); err != nil {
		t.Fatal(err)
	}
	got = e.waitProxy(child, "ConfigOutdated=True RenderingChanged", outdatedWith(v1alpha1.ReasonRenderingChanged))
	if got.Status.SpecHash != kid.Status.SpecHash || e.fake.CountOf(providertest.OpDelete) != deletes {
		t.Errorf("specHash %q (want %q), ops %v: want the child adopted and kept", got.Status.SpecHash, kid.Status.SpecHash, e.ops())
	}
	if msg := controllertest.ConfigOutdated(got).Message; !strings.Contains(msg, "ProxyPool crawlers replaces it surge-first") {
		t.Errorf("ConfigOutdated message %q does not name the pool", msg)
	}
}
