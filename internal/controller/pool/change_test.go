package pool

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// What a pool does when the configuration changes under its children: a password
// rotation and an operator upgrade both roll it surge-first, with the Proxy reconciler
// of the same manager replacing no child in place.

// newAuthPool makes a settled pool of 3 whose template uses the basic-auth Secret
// "shared-auth" (holding password pw) and returns the Secret.
func newAuthPool(t *testing.T, e *poolEnv, name, pw string) *corev1.Secret {
	t.Helper()
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "shared-auth", Namespace: e.NS, Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}},
		Data:       map[string][]byte{"username": []byte("crawler"), "password": []byte(pw)},
	}
	if err := e.C.Create(e.Ctx, sec); err != nil {
		t.Fatal(err)
	}
	pool := e.NewPool(name, 3)
	pool.Spec.Template.Spec.Proxy = &v1alpha1.ProxyConfig{
		AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"},
		BasicAuth:           &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "shared-auth"}},
	}
	e.CreateSettled(pool)
	return sec
}

// changeSampler samples the pool's children until stopped: the most that existed, the
// fewest available, and every time a live child's probe credentials (the health
// engine's lookup, proxyconfig.SnapshotCredentials) were not those it must demand.
type changeSampler struct {
	stop func()
	mu   sync.Mutex
	// maxTotal, minAvail and samples as in bounds; wrong lists credential mismatches.
	maxTotal, minAvail, samples int
	wrong                       []string
	atMin                       string // the children when the fewest were available
}

// sampleChange starts a sampler; wantPw says which password a live child must be
// probed with ("" = do not check).
func (e *poolEnv) sampleChange(pool string, wantPw func(px *v1alpha1.Proxy) string) *changeSampler {
	s := &changeSampler{maxTotal: -1, minAvail: 1 << 30}
	lookup := proxyconfig.SnapshotCredentials{Reader: e.C}.Credentials
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			list := &v1alpha1.ProxyList{}
			if err := e.C.List(ctx, list, client.InNamespace(e.NS), client.MatchingLabels{v1alpha1.PoolLabel: pool}); err == nil {
				avail := 0
				var wrong []string
				for i := range list.Items {
					px := &list.Items[i]
					if availableAt(px, e.Clock.Now(), 0) {
						avail++
					}
					want := wantPw(px)
					if want == "" || !px.DeletionTimestamp.IsZero() || px.Status.Phase != v1alpha1.PhaseReady {
						continue
					}
					c, err := lookup(ctx, px)
					if ctx.Err() != nil {
						break
					}
					if err != nil || c == nil || c.Password != want {
						got := "none"
						if c != nil {
							got = "another password"
						}
						wrong = append(wrong, fmt.Sprintf("%s probed with %s (err %v)", px.Name, got, err))
					}
				}
				if ctx.Err() != nil {
					break // stopped mid-sample: not a sample
				}
				s.mu.Lock()
				if avail < s.minAvail {
					s.atMin = fmt.Sprintf("at %s: %s", e.Clock.Now().UTC().Format(time.RFC3339Nano), describeStatus(list.Items))
				}
				s.maxTotal, s.minAvail = max(s.maxTotal, len(list.Items)), min(s.minAvail, avail)
				s.samples++
				s.wrong = append(s.wrong, wrong...)
				s.mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond) // sampling period, not a wait for a condition
		}
	}()
	s.stop = func() { cancel(); <-done }
	return s
}

func (s *changeSampler) check(t *testing.T, maxTotal, minAvail int) {
	t.Helper()
	s.stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	checkSamples(t, s.samples, s.maxTotal, s.minAvail, maxTotal, minAvail, s.atMin)
	if len(s.wrong) > 0 {
		t.Errorf("%d samples of a child probed with other credentials than its instance demands, first: %s", len(s.wrong), s.wrong[0])
	}
}

// waitReplaced waits until the pool holds 3 available children, none of them in old.
func (e *poolEnv) waitReplaced(pool string, old []string) {
	e.T.Helper()
	e.WaitPool(pool, "3 new children available", func(p *v1alpha1.ProxyPool, kids []v1alpha1.Proxy) bool {
		if len(kids) != 3 || p.Status.AvailableReplicas != 3 {
			return false
		}
		for _, k := range kids {
			if slices.Contains(old, k.Name) {
				return false
			}
		}
		return true
	})
}

// A pool of 3 sharing one Secret; the password is rotated: the pool replaces its
// children surge-first (never fewer than 3 available, never more than 4), each old
// child is probed with the old password until it goes and each new one with the new.
func testPoolPasswordRotation(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	const pw1, pw2 = "Pool-pw.one_1", "Pool-pw.two_2"
	sec := newAuthPool(t, e, "rot-pw", pw1)
	old := controllertest.Names(e.Children("rot-pw"))
	s := e.sampleChange("rot-pw", func(px *v1alpha1.Proxy) string {
		if slices.Contains(old, px.Name) {
			return pw1
		}
		return pw2
	})
	sec.Data["password"] = []byte(pw2)
	if err := e.C.Update(e.Ctx, sec); err != nil {
		t.Fatal(err)
	}
	e.waitReplaced("rot-pw", old)
	s.check(t, 4, 3)
	for _, ev := range e.WaitPoolEvents("rot-pw", EventChildDeleted, "one per replaced child", controllertest.AtLeast(len(old))) {
		if !strings.Contains(ev, "older template") && !strings.Contains(ev, "ConfigOutdated") {
			t.Errorf("deletion event %q: want a child replaced for its credentials", ev)
		}
	}
}

// An operator upgrade that changes the rendering (the renderer's variant hook): every
// child shows ConfigOutdated and the pool replaces them surge-first.
func testPoolUpgradeRolls(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	sec := newAuthPool(t, e, "upgr", "Pool-pw.one_1")
	old := controllertest.Names(e.Children("upgr"))
	s := e.sampleChange("upgr", func(*v1alpha1.Proxy) string { return "" })
	controllertest.UpgradeRendering(t, "next-release")
	// The upgraded manager's first pass over every Proxy: a label on the Secret wakes
	// each child's reconciler (its Secret watch) without changing a credential.
	sec.Labels["test.egress.hrajfrisbee.cz/restart"] = "1"
	if err := e.C.Update(e.Ctx, sec); err != nil {
		t.Fatal(err)
	}
	e.waitReplaced("upgr", old)
	s.check(t, 4, 3)
	for _, px := range e.Children("upgr") {
		if c := controllertest.ConfigOutdated(&px); c.Status == metav1.ConditionTrue {
			t.Errorf("new child %s shows ConfigOutdated %+v", px.Name, c)
		}
	}
}

// describeStatus is each child's name, phase, healthy, deletion and ConfigOutdated.
func describeStatus(kids []v1alpha1.Proxy) string {
	var parts []string
	for i := range kids {
		k := &kids[i]
		parts = append(parts, fmt.Sprintf("%s(%s,healthy=%v,deleting=%v,outdated=%s,ready since %s)", k.Name, k.Status.Phase, k.Status.Healthy,
			!k.DeletionTimestamp.IsZero(), controllertest.ConfigOutdated(k).Reason, readySince(k).UTC().Format(time.RFC3339Nano)))
	}
	return strings.Join(parts, " ")
}
