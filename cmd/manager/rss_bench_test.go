//go:build rssbench

package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// The number and size of the unrelated Secrets of TestManagerRSSWithUnrelatedSecrets,
// like a cluster's Helm release Secrets.
const (
	noiseSecrets    = 5000
	noiseSecretSize = 4 << 10
)

// The manager's resident memory does not grow with Secrets that are none of its
// business: its RSS once its caches have synced (an External Proxy with an opted-in
// Secret became Running, which the reconciler does only after every watch, Secrets
// included, has synced), against an empty cluster and then against the same cluster
// holding 5,000 unrelated 4 KiB Secrets. Run by hack/bench/manager-rss.sh (build tag
// rssbench; it takes a minute or two), which can also run it on another git ref.
func TestManagerRSSWithUnrelatedSecrets(t *testing.T) {
	env := testenv.StartT(t)
	c := env.Client
	ctx := context.Background()
	// The Proxy that says the caches synced, its Secret labelled (ignored by a manager
	// that predates the label).
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "edge-auth", Namespace: "default",
		Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}},
		Data: map[string][]byte{"username": []byte("crawler"), "password": []byte("Pw-one.1")}}
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: "default"},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "192.0.2.1", Port: 3128,
			Proxy: &v1alpha1.ProxyConfig{BasicAuth: &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "edge-auth"}}}}}
	for _, obj := range []client.Object{sec, px} {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}

	empty := measureManagerRSS(t, env, px)
	createNoiseSecrets(t, c)
	noisy := measureManagerRSS(t, env, px)

	delta := noisy.rss - empty.rss
	t.Logf("manager RSS after its caches synced: %.1f MiB with no other Secrets, %.1f MiB with %d unrelated %d KiB Secrets (%+.1f MiB); peak (VmHWM) %.1f and %.1f MiB",
		mib(empty.rss), mib(noisy.rss), noiseSecrets, noiseSecretSize>>10, mib(delta), mib(empty.hwm), mib(noisy.hwm))
	if out := os.Getenv("RSS_RESULT_FILE"); out != "" {
		line := fmt.Sprintf("empty_rss_mib=%.1f noisy_rss_mib=%.1f delta_mib=%.1f empty_hwm_mib=%.1f noisy_hwm_mib=%.1f\n",
			mib(empty.rss), mib(noisy.rss), mib(delta), mib(empty.hwm), mib(noisy.hwm))
		if err := os.WriteFile(out, []byte(line), 0o644); err != nil {
			t.Error(err)
		}
	}
	// The Secrets' data alone is 19.5 MiB: a cache that held them would grow by at least that.
	if limit := int64(8 << 20); delta > limit {
		t.Errorf("the manager's RSS grew by %.1f MiB with %d unrelated Secrets, want under %.0f MiB: it caches Secrets it has no use for",
			mib(delta), noiseSecrets, mib(limit))
	}
}

type rssSample struct{ rss, hwm int64 }

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// measureManagerRSS starts the manager against env, waits until px is Running (the
// caches synced), lets it settle, and returns its largest VmRSS over five seconds and
// its VmHWM, then stops it.
func measureManagerRSS(t *testing.T, env *testenv.Env, px *v1alpha1.Proxy) rssSample {
	t.Helper()
	ctx := context.Background()
	c := env.Client
	providers := writeFile(t, "providers.yaml", fmt.Sprintf(goodConfig, t.TempDir()))
	probe := freeAddr(t)
	mgr := startManager(t, env, "--providers-config", providers, "--health-probe-bind-address", probe,
		"--metrics-bind-address", "0", "--proxy-check-interval", "1h", "--provider-check-interval", "1h")
	mgr.waitUntil("the manager to answer /readyz", func() (bool, error) {
		res, err := http.Get("http://" + probe + "/readyz")
		if err != nil {
			return false, err
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK, fmt.Errorf("/readyz %d", res.StatusCode)
	})
	// A fresh generation for the reconciler to observe: the caches synced once it did.
	cur := &v1alpha1.Proxy{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(px), cur); err != nil {
		t.Fatal(err)
	}
	cur.Spec.Port++
	if err := c.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	mgr.waitUntil("the reconciler to publish the External Proxy's new port (its caches synced)", func() (bool, error) {
		got := &v1alpha1.Proxy{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(px), got); err != nil {
			return false, err
		}
		return got.Status.Phase == v1alpha1.PhaseRunning && got.Status.ObservedGeneration == got.Generation,
			fmt.Errorf("phase %s, observed generation %d of %d", got.Status.Phase, got.Status.ObservedGeneration, got.Generation)
	})
	var s rssSample
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		cur := procStatus(t, mgr.cmd.Process.Pid)
		s.rss = max(s.rss, cur.rss)
		s.hwm = cur.hwm
	}
	mgr.stop()
	return s
}

// procStatus reads VmRSS and VmHWM of pid from /proc.
func procStatus(t *testing.T, pid int) rssSample {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var s rssSample
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("/proc/%d/status %s: %v", pid, k, err)
		}
		if k == "VmRSS" {
			s.rss = kb << 10
		} else {
			s.hwm = kb << 10
		}
	}
	return s
}

// createNoiseSecrets creates noiseSecrets Secrets of noiseSecretSize random bytes each in
// a namespace of their own, none labelled.
func createNoiseSecrets(t *testing.T, c client.Client) {
	t.Helper()
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "helm-releases"}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < noiseSecrets; i += 8 {
				data := make([]byte, noiseSecretSize)
				_, _ = rand.Read(data)
				s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "helm-releases", Name: fmt.Sprintf("sh.helm.release.v1.app-%04d.v1", i),
					Labels: map[string]string{"owner": "helm"}}, Type: "helm.sh/release.v1", Data: map[string][]byte{"release": data}}
				if err := c.Create(ctx, s); err != nil {
					errs <- fmt.Errorf("creating secret %s: %w", s.Name, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d unrelated Secrets of %d KiB created in %s", noiseSecrets, noiseSecretSize>>10, time.Since(start).Round(time.Second))
}
