//go:build integration

package crawl

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// TestGatewayFromZero: a pool at zero (the ProxyPool exists, no child serves) behind the
// gateway binary over envtest. The first request for it is held: the gateway's
// held-requests gauge says so and its demand Lease (the wake) carries held 1 at once, in
// the demand namespace (--demand-namespace, not the pool's), labelled with the pool's
// name and namespace.
// Then a child appears, an External stand-in at a forward proxy on loopback, owned by
// the pool and made Ready as the health engine would; the held request is answered
// through it, and the wait is logged by the gateway, counted in its histogram and
// measured here.
func TestGatewayFromZero(t *testing.T) {
	env := testenv.StartT(t)
	ctx := context.Background()
	const ns, podName = "default", "gw-fromzero-0"
	const demandNS = "egress-system"
	t.Setenv("POD_NAME", podName) // the gateway's demand source
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demandNS}}); err != nil {
		t.Fatal(err)
	}

	pool := testbuild.Pool(ns, "news", 0, testbuild.Managed(), testbuild.WithProvider("fake"), testbuild.WithPort(3128),
		testbuild.Autoscaled(0, 1, 1))
	if err := env.Client.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		src, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "%s from %s", r.URL.Path, src)
	}))
	t.Cleanup(site.Close)
	exit := healthtest.New(t, "127.0.0.7")

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	tokenFile := filepath.Join(dir, "token")
	for p, content := range map[string]string{kubeconfig: string(env.KubeConfig), tokenFile: token + "\n"} {
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	gw := &gatewayProc{bin: buildGateway(t, dir), kubeconfig: kubeconfig, tokenFile: tokenFile,
		listen: testutil.FreeAddr(t), socks: testutil.FreeAddr(t), probe: testutil.FreeAddr(t), metrics: testutil.FreeAddr(t),
		args: []string{"--demand-namespace", demandNS}}
	gw.start(t)
	t.Cleanup(func() { gw.kill(t) })

	// The first request: held until a child serves.
	proxyURL := &url.URL{Scheme: "http", User: url.UserPassword("me+pool=news", token), Host: gw.listen}
	type answer struct {
		status int
		exit   string
		body   string
		err    error
		at     time.Time
	}
	answered := make(chan answer, 1)
	sent := time.Now()
	go func() {
		hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: 3 * time.Minute}
		res, err := hc.Get(site.URL + "/first")
		if err != nil {
			answered <- answer{err: err, at: time.Now()}
			return
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		answered <- answer{status: res.StatusCode, exit: res.Header.Get("X-Egress-Proxy"), body: string(b), at: time.Now()}
	}()
	testutil.WaitFor(t, time.Minute, "the gateway to hold the request for default/news (proxy_operator_gateway_held_requests 1)", func() (bool, error) {
		v, err := gatewayMetric(gw.metrics, `proxy_operator_gateway_held_requests{namespace="default",pool="news"}`)
		return v == 1, fmt.Errorf("held %v, %v", v, err)
	}, testutil.Every(50*time.Millisecond))

	// The wake: the gateway's demand Lease for the pool says held 1.
	leaseName := demand.LeaseName(ctrlclient.ObjectKeyFromObject(pool), podName)
	testutil.WaitFor(t, 30*time.Second, "the gateway's demand Lease "+leaseName+" with held 1", func() (bool, error) {
		var l coordinationv1.Lease
		if err := env.Client.Get(ctx, ctrlclient.ObjectKey{Namespace: demandNS, Name: leaseName}, &l); err != nil {
			return false, err
		}
		return l.Annotations[demand.AnnotationHeld] == "1" && l.Labels[demand.LabelSource] == demand.KindGateway && l.Labels[demand.LabelFor] == "news" &&
				l.Labels[demand.LabelNamespace] == ns,
			fmt.Errorf("labels %v, annotations %v", l.Labels, l.Annotations)
	}, testutil.Every(50*time.Millisecond))
	select {
	case a := <-answered:
		t.Fatalf("the request was answered while the pool had no child: %+v", a)
	default:
	}

	// A child appears and becomes Ready: an External stand-in controlled by the pool.
	child := testbuild.Proxy(ns, "news-0", testbuild.External(exit.Host), testbuild.WithPort(exit.Port),
		testbuild.WithLabel(v1alpha1.PoolLabel, "news"),
		testbuild.WithOwners(metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: pool.Name,
			UID: pool.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}))
	if err := env.Client.Create(ctx, child); err != nil {
		t.Fatal(err)
	}
	readyAt := time.Now()
	child.Status = v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, IP: exit.Host, Healthy: true, EgressIP: "127.0.0.7"}
	if err := env.Client.Status().Update(ctx, child); err != nil {
		t.Fatal(err)
	}

	var a answer
	select {
	case a = <-answered:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the held request was not answered within 2 minutes of its child becoming Ready\n%s", gw.stderr.String())
	}
	if a.err != nil || a.status != http.StatusOK || a.exit != ns+"/news-0" || a.body != "/first from 127.0.0.7" {
		t.Fatalf("the held request: %+v; want 200 through default/news-0 from 127.0.0.7", a)
	}
	wait := a.at.Sub(sent)
	t.Logf("from zero: the first request waited %s in all (held %s before the child appeared; answered %s after it was made Ready)",
		wait.Round(time.Millisecond), readyAt.Sub(sent).Round(time.Millisecond), a.at.Sub(readyAt).Round(time.Millisecond))
	if a.at.Sub(readyAt) > 10*time.Second {
		t.Errorf("answered %s after the child became Ready: the gateway should be woken by its informer, not a slow poll", a.at.Sub(readyAt))
	}

	// The wait is reported: the gateway's log line and its histogram.
	testutil.WaitFor(t, 30*time.Second, "the gateway's log line of the held request's end", func() (bool, error) {
		for _, line := range strings.Split(gw.stderr.String(), "\n") {
			if strings.Contains(line, "held request ended") && strings.Contains(line, `"outcome":"served"`) && strings.Contains(line, `"pool":"news"`) {
				t.Logf("gateway: %s", line)
				return true, nil
			}
		}
		return false, fmt.Errorf("not in the gateway's log")
	}, testutil.Every(50*time.Millisecond))
	n, err := gatewayMetric(gw.metrics, `proxy_operator_gateway_activation_wait_seconds_count{namespace="default",outcome="served",pool="news"}`)
	if err != nil || n != 1 {
		t.Errorf("activation waits served: %v, %v; want 1", n, err)
	}
	sum, err := gatewayMetric(gw.metrics, `proxy_operator_gateway_activation_wait_seconds_sum{namespace="default",outcome="served",pool="news"}`)
	if err != nil || sum <= 0 || time.Duration(sum*float64(time.Second)) > wait {
		t.Errorf("activation wait reported %vs (%v); the client measured %s", sum, err, wait)
	}
	t.Logf("the gateway reported the wait as %.3fs", sum)
	if v, _ := gatewayMetric(gw.metrics, `proxy_operator_gateway_held_requests{namespace="default",pool="news"}`); v != 0 {
		t.Errorf("still %v held after the answer", v)
	}
}

// gatewayMetric reads one sample, by its exact series text, from the gateway's /metrics.
func gatewayMetric(addr, series string) (float64, error) {
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(rest, 64)
		}
	}
	return 0, sc.Err()
}
