package pool

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// A wg0.conf the parser takes (the keys are 32 zero and 32 one bytes, base64).
const poolTestWGConf = `[Interface]
PrivateKey = AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=
Address = 10.64.0.2/32

[Peer]
PublicKey = AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=
Endpoint = 192.0.2.1:51820
AllowedIPs = 0.0.0.0/0, ::/0
`

// exitSecret creates an opted-in WireGuard Secret labelled exits=news.
func (e *poolEnv) exitSecret(name string) {
	e.T.Helper()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.NS, Name: name,
		Labels: map[string]string{v1alpha1.CredentialsLabel: "true", "exits": "news"}},
		Data: map[string][]byte{"wg0.conf": []byte(poolTestWGConf)}}
	if err := e.C.Create(e.Ctx, sec); err != nil {
		e.T.Fatalf("creating secret %s: %v", name, err)
	}
}

// wireGuardPool is a pool of replicas handing out the Secrets labelled exits=news.
func (e *poolEnv) wireGuardPool(name string, replicas int32, selector map[string]string) *v1alpha1.ProxyPool {
	return wireGuardPool(e.NewPool(name, replicas), selector)
}

// wireGuardPool makes p hand out the Secrets selector matches.
func wireGuardPool(p *v1alpha1.ProxyPool, selector map[string]string) *v1alpha1.ProxyPool {
	p.Spec.Template.Spec.Proxy = &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"}}
	p.Spec.Egress = &v1alpha1.PoolEgress{WireGuard: &v1alpha1.PoolWireGuard{
		SecretSelector: metav1.LabelSelector{MatchLabels: selector}}}
	return p
}

// assignments are the Secrets the children hold, by child; it fails the test when two
// children (being deleted or not) hold one Secret, or a child holds none.
func assignments(t testing.TB, kids []v1alpha1.Proxy) map[string]string {
	t.Helper()
	out := map[string]string{}
	holder := map[string]string{}
	for i := range kids {
		name := assignedWireGuard(&kids[i])
		if name == "" {
			t.Fatalf("child %s holds no WireGuard configuration", kids[i].Name)
		}
		if other, dup := holder[name]; dup {
			t.Fatalf("children %s and %s both hold WireGuard secret %s", other, kids[i].Name, name)
		}
		holder[name] = kids[i].Name
		out[kids[i].Name] = name
	}
	return out
}

func held(m map[string]string) string {
	var v []string
	for _, s := range m {
		v = append(v, s)
	}
	slices.Sort(v)
	return strings.Join(v, ",")
}

func egressExhausted(status metav1.ConditionStatus, reason string, msgHas ...string) func(*v1alpha1.ProxyPool, []v1alpha1.Proxy) bool {
	return func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
		c := controllertest.PoolCondition(p, v1alpha1.PoolConditionEgressExhausted)
		if c.Status != status || c.Reason != reason {
			return false
		}
		for _, s := range msgHas {
			if !strings.Contains(c.Message, s) {
				return false
			}
		}
		return true
	}
}

// Each child of a pool with spec.egress.wireguard holds a Secret no other child holds;
// with none free the pool makes no child and says so in EgressExhausted, and a new
// Secret lets it go on; a deleted child's Secret goes to its successor once it is gone;
// a rollout's surge child takes a free one.
func testPoolWireGuardAssignment(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	e.exitSecret("exit-1")
	e.exitSecret("exit-2")
	e.CreateSettled(e.wireGuardPool("wg", 2, map[string]string{"exits": "news"}))
	if got := held(assignments(t, e.Children("wg"))); got != "exit-1,exit-2" {
		t.Fatalf("children hold %s, want exit-1 and exit-2", got)
	}
	e.WaitPool("wg", "EgressExhausted=False", egressExhausted(metav1.ConditionFalse, v1alpha1.PoolReasonEgressAvailable,
		"0 of the 2 WireGuard configurations spec.egress.wireguard.secretSelector matches are free"))

	e.Update("wg", func(p *v1alpha1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(3)) })
	e.WaitPool("wg", "EgressExhausted=True for the third child", egressExhausted(metav1.ConditionTrue, v1alpha1.PoolReasonNoFreeEgress,
		"has 0 free WireGuard configurations and needs 1: spec.egress.wireguard.secretSelector (exits=news) matches 2"))
	if kids := e.Children("wg"); len(kids) != 2 {
		t.Fatalf("%d children with 2 configurations, want 2 (no doubling up)", len(kids))
	}

	e.exitSecret("exit-3")
	e.WaitPool("wg", "a third child with exit-3", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		return len(kids) == 3 && held(assignments(t, kids)) == "exit-1,exit-2,exit-3" &&
			egressExhausted(metav1.ConditionFalse, v1alpha1.PoolReasonEgressAvailable)(p, kids)
	})
	e.WaitSettled("wg", 3)

	// A deleted child's Secret goes to its successor, once the child is gone.
	kids := e.Children("wg")
	gone := kids[0]
	freed := assignedWireGuard(&gone)
	if err := e.C.Delete(e.Ctx, &gone); err != nil {
		t.Fatal(err)
	}
	e.WaitPool("wg", "the successor of "+gone.Name+" holding "+freed, func(_ *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		a := assignments(t, kids)
		_, old := a[gone.Name]
		return !old && len(kids) == 3 && held(a) == "exit-1,exit-2,exit-3"
	})

	// A rollout's surge child takes the free Secret, and every replacement one freed.
	e.WaitSettled("wg", 3)
	e.exitSecret("exit-4")
	before := controllertest.Names(e.Children("wg"))
	e.Update("wg", func(p *v1alpha1.ProxyPool) { p.Spec.Template.Metadata.Labels["team"] = "sports" })
	e.WaitPool("wg", "the surge child holding exit-4", func(_ *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		for name, sec := range assignments(t, kids) {
			if !slices.Contains(before, name) && sec == "exit-4" {
				return true
			}
		}
		return false
	})
	e.WaitPool("wg", "rolled out", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		assignments(t, kids)
		if len(kids) != 3 || p.Status.UpToDateReplicas != 3 {
			return false
		}
		for _, k := range kids {
			if slices.Contains(before, k.Name) {
				return false
			}
		}
		return true
	})
}

// A selector that matches no Secret makes no child and names the selector and namespace.
// One pass decides it: the synchronous layer.
func testPoolWireGuardNoMatch(t *testing.T, env *testenv.Env) {
	e := newSyncEnv(t, env)
	pool := wireGuardPool(e.NewPool("nomatch", 2), map[string]string{"exits": "none"})
	e.Create(pool)
	if !egressExhausted(metav1.ConditionTrue, v1alpha1.PoolReasonNoFreeEgress,
		fmt.Sprintf("spec.egress.wireguard.secretSelector (exits=none) matches no WireGuard Secret (labelled %s=true, holding wg0.conf) in namespace %s; 2 children wait for one each",
			v1alpha1.CredentialsLabel, e.NS))(pool, nil) {
		t.Errorf("after one reconcile: EgressExhausted %+v, want True naming the selector", controllertest.PoolCondition(pool, v1alpha1.PoolConditionEgressExhausted))
	}
	if kids := e.Children("nomatch"); len(kids) != 0 {
		t.Errorf("%d children without a configuration, want none", len(kids))
	}
}

// Without a free configuration a rollout cannot surge: with maxUnavailable 0 it waits
// (EgressExhausted=True); with maxUnavailable 1 it replaces delete-first, the successor
// taking the configuration its predecessor freed.
func testPoolWireGuardDeleteFirst(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	e.exitSecret("exit-1")
	e.exitSecret("exit-2")
	e.CreateSettled(e.wireGuardPool("df", 2, map[string]string{"exits": "news"}))
	before := controllertest.Names(e.Children("df"))
	e.Update("df", func(p *v1alpha1.ProxyPool) { p.Spec.Template.Metadata.Labels["team"] = "sports" })
	e.WaitPool("df", "EgressExhausted=True for the surge child", egressExhausted(metav1.ConditionTrue, v1alpha1.PoolReasonNoFreeEgress,
		"has 0 free WireGuard configurations and needs 1"))
	if got := controllertest.Names(e.Children("df")); !slices.Equal(got, before) {
		t.Fatalf("children %v with maxUnavailable 0 and no free configuration, want %v untouched", got, before)
	}
	one := intstr.FromInt32(1)
	e.Update("df", func(p *v1alpha1.ProxyPool) { p.Spec.Strategy.RollingUpdate.MaxUnavailable = &one })
	e.WaitPool("df", "rolled out delete-first", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		assignments(t, kids)
		if len(kids) != 2 || p.Status.UpToDateReplicas != 2 || p.Status.AvailableReplicas != 2 {
			return false
		}
		for _, k := range kids {
			if slices.Contains(before, k.Name) {
				return false
			}
		}
		return egressExhausted(metav1.ConditionFalse, v1alpha1.PoolReasonEgressAvailable)(p, kids)
	})
}

// A selector matching the opt-in label alone also matches the template's basic-auth
// Secret and each child's credentials snapshot. Neither is a WireGuard exit: the children
// get the real exits alone, EgressExhausted counts only those and names the others, and
// each new snapshot adds no exit.
func TestPoolWireGuardIdentitiesSkipNonExits(t *testing.T) {
	t.Parallel()
	e := newPoolEnv(t, shared.Env(t))
	auth := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.NS, Name: "crawl-auth",
		Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}},
		Data: map[string][]byte{"username": []byte("crawler"), "password": []byte("Pass-word.1")}}
	if err := e.C.Create(e.Ctx, auth); err != nil {
		t.Fatal(err)
	}
	e.exitSecret("exit-1")
	e.exitSecret("exit-2")
	pool := e.wireGuardPool("natural", 2, map[string]string{v1alpha1.CredentialsLabel: "true"})
	pool.Spec.Template.Spec.Proxy.BasicAuth = &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "crawl-auth"}}
	e.Create(pool)
	e.WaitPool("natural", "2 children", func(_ *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool { return len(kids) == 2 })
	if got := held(assignments(t, e.Children("natural"))); got != "exit-1,exit-2" {
		t.Fatalf("children hold %s, want exit-1 and exit-2 (crawl-auth holds no wg0.conf)", got)
	}
	e.WaitSettled("natural", 2)
	snapshots := func() []string {
		var out []string
		for _, k := range e.Children("natural") {
			if k.Status.CredentialsSecret != "" {
				out = append(out, fmt.Sprintf("%s (the credentials snapshot of proxy %s)", k.Status.CredentialsSecret, k.Name))
			}
		}
		return out
	}
	if snaps := snapshots(); len(snaps) != 2 {
		t.Fatalf("credentials snapshots %v, want one per child", snaps)
	}

	e.scale("natural", 3)
	p := e.WaitPool("natural", "EgressExhausted=True counting 2 exits", egressExhausted(metav1.ConditionTrue, v1alpha1.PoolReasonNoFreeEgress,
		"has 0 free WireGuard configurations and needs 1: spec.egress.wireguard.secretSelector ("+v1alpha1.CredentialsLabel+"=true) matches 2",
		"; it also matches 3 Secrets that are not WireGuard exits and are never handed out: crawl-auth (no key wg0.conf), "))
	msg := controllertest.PoolCondition(p, v1alpha1.PoolConditionEgressExhausted).Message
	for _, s := range snapshots() {
		if !strings.Contains(msg, s) {
			t.Errorf("EgressExhausted message %q does not name %s", msg, s)
		}
	}
	controllertest.Consistently(t, "no third child on a Secret that is not an exit", func() (bool, error) {
		kids := e.Children("natural")
		return len(kids) == 2, fmt.Errorf("children %s", controllertest.Describe(kids))
	})

	e.exitSecret("exit-3")
	e.WaitSettled("natural", 3)
	if got := held(assignments(t, e.Children("natural"))); got != "exit-1,exit-2,exit-3" {
		t.Fatalf("children hold %s, want exit-1, exit-2 and exit-3", got)
	}
	e.WaitPool("natural", "EgressExhausted=False with 3 snapshots skipped", egressExhausted(metav1.ConditionFalse, v1alpha1.PoolReasonEgressAvailable,
		"0 of the 3 WireGuard configurations spec.egress.wireguard.secretSelector matches are free; it also matches 4 Secrets that are not WireGuard exits"))
}
