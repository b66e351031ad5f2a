//go:build integration

package integration

import (
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2"
)

// TestOrphanGCTwoInstalls_realHost: two installs of the operator (two provider instances
// with different install IDs, as two clusters would run) share the real host. Each one's
// orphan GC collects its own true orphan and leaves every domain of the other install
// alone, orphans included, and neither install's Delete touches the other's domain; all
// of it checked with virsh.
func TestOrphanGCTwoInstalls_realHost(t *testing.T) {
	env := loadEnv(t)
	token := "epo-it-" + randomHex(t) + "-inst"
	imgKey := token + "-img"
	t.Cleanup(func() { sweep(t, env, token) })

	type install struct {
		id     string
		p      *kvm2.Provider
		owned  *v1alpha1.Proxy
		kept   provider.Instance
		orphan provider.Instance
	}
	installs := []*install{{id: token + "-a"}, {id: token + "-b"}}
	for _, in := range installs {
		in.p = newProvider(t, env, imgKey, kvm2.WithInstallID(in.id))
		in.owned = &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "owned", UID: types.UID(in.id + "-owned")}}
		in.kept = createTiny(t, in.p, imgKey, in.id+"-kept", string(in.owned.UID), "spec-"+in.id)
		in.orphan = createTiny(t, in.p, imgKey, in.id+"-orphan", in.id+"-gone", "spec-"+in.id)
	}

	// What lands on the host: the mark names the install and the spec hash.
	a, b := installs[0], installs[1]
	out, err := virsh("metadata", a.kept.Name, "--uri", kvm2.MetadataURI(provider.TypeKVM2))
	if err != nil || !strings.Contains(out, "<install>"+a.id+"</install>") || !strings.Contains(out, "<specHash>spec-"+a.id+"</specHash>") {
		t.Fatalf("virsh metadata %s: %q %v, want the install and the spec hash", a.kept.Name, out, err)
	}

	running := func(name string) bool {
		out, err := virsh("domstate", name)
		return err == nil && strings.TrimSpace(out) == "running"
	}
	gone := func(name string) bool {
		_, err := virsh("dominfo", name)
		return err != nil
	}
	for i, in := range installs {
		other := installs[1-i]
		res := sweepScoped(t, in.p, token, in.owned)
		if got := res.Deleted["kvm2-it"]; !slices.Equal(got, []string{in.orphan.ProviderID}) || len(res.Skipped) != 0 {
			t.Fatalf("install %s: sweep deleted %v (skipped %v), want exactly its own orphan %s", in.id, res.Deleted, res.Skipped, in.orphan.ProviderID)
		}
		if !gone(in.orphan.Name) {
			t.Errorf("install %s: its orphan %s is still on the host", in.id, in.orphan.Name)
		}
		if !running(in.kept.Name) || !running(other.kept.Name) {
			t.Errorf("install %s: a kept domain went: %s running %v, %s running %v", in.id,
				in.kept.Name, running(in.kept.Name), other.kept.Name, running(other.kept.Name))
		}
		if i == 0 && !running(other.orphan.Name) {
			t.Errorf("install %s collected install %s's orphan %s", in.id, other.id, other.orphan.Name)
		}
	}

	// Neither install's Delete touches the other's domain.
	if err := a.p.Delete(ctx(t), b.kept.ProviderID); err != nil || !running(b.kept.Name) {
		t.Fatalf("install a's delete of install b's domain: %v, running %v", err, running(b.kept.Name))
	}
	vols := volumes(t, env["KVM2_TEST_POOL"])
	for _, v := range []string{b.kept.Name + ".qcow2", b.kept.Name + "-seed.iso"} {
		if !slices.Contains(vols, v) {
			t.Errorf("install a's delete removed install b's volume %s", v)
		}
	}
	for _, in := range installs {
		if err := in.p.Delete(ctx(t), in.kept.ProviderID); err != nil {
			t.Fatalf("install %s: delete: %v", in.id, err)
		}
		if !gone(in.kept.Name) {
			t.Errorf("install %s: %s survived its own delete", in.id, in.kept.Name)
		}
	}
	for _, v := range []string{"base-" + imgKey + ".qcow2.sha256", "base-" + imgKey + ".qcow2"} {
		if _, err := virsh("vol-delete", "--pool", env["KVM2_TEST_POOL"], v); err != nil {
			t.Errorf("removing the cached image: %v", err)
		}
	}
	for _, v := range volumes(t, env["KVM2_TEST_POOL"]) {
		if strings.Contains(v, token) {
			t.Errorf("volume %s left in the pool", v)
		}
	}
}
