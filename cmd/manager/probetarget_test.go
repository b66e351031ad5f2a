package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// metricValue reads one unlabelled sample from a Prometheus text exposition; ok false
// when it is not there.
func metricValue(exposition, name string) (float64, bool) {
	sc := bufio.NewScanner(strings.NewReader(exposition))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			return v, err == nil
		}
	}
	return 0, false
}

// The manager binary with its defaults (--probe-target-direct-check on) and a probe
// target outside the cluster: while the target is dead for many rounds, the Proxy stays
// Ready and healthy with no failure counted, the gauge says the target is down, and the
// ProviderHealth gets one Warning Event; when the target is back, failures count again
// and a proxy that really fails is taken out.
func TestManagerProbeTargetOutageLeavesProxiesReady(t *testing.T) {
	env := testenv.StartT(t)
	c := env.Client
	ctx := context.Background()
	var down atomic.Bool
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close() // a dead target: no answer at all
			}
			return
		}
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		_, _ = io.WriteString(w, host+"\n")
	}))
	t.Cleanup(target.Close)
	fp := healthtest.New(t, "127.0.0.12")

	providers := writeFile(t, "providers.yaml", fmt.Sprintf(goodConfig, t.TempDir()))
	metrics := freeAddr(t)
	mgr := startManager(t, env, "--providers-config", providers, "--health-probe-bind-address", freeAddr(t),
		"--metrics-bind-address", metrics, "--metrics-secure=false", "--discovery-bind-address", "0",
		"--proxy-probe-url", target.URL+"/", "--proxy-check-interval", "1s")
	scrape := func() string {
		res, err := http.Get("http://" + metrics + "/metrics")
		if err != nil {
			return ""
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}

	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: "default"},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: fp.Host, Port: fp.Port}}
	if err := c.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	read := func() *v1alpha1.Proxy {
		got := &v1alpha1.Proxy{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(px), got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	mgr.waitUntil("the Proxy to be Ready with egress IP 127.0.0.12", func() (bool, error) {
		got := read()
		return got.Status.Phase == v1alpha1.PhaseReady && got.Status.EgressIP == "127.0.0.12",
			fmt.Errorf("phase %s, egress IP %q", got.Status.Phase, got.Status.EgressIP)
	})
	mgr.waitUntil("ProviderHealth kvm2-home", func() (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Name: "kvm2-home"}, &v1alpha1.ProviderHealth{})
		return err == nil, err
	})

	down.Store(true)
	mgr.waitUntil("five probe rounds with the target down and the gauge at 0", func() (bool, error) {
		m := scrape()
		rounds, _ := metricValue(m, "proxy_operator_probe_target_down_rounds_total")
		up, ok := metricValue(m, "proxy_operator_probe_target_up")
		return rounds >= 5 && ok && up == 0, fmt.Errorf("rounds %v, up %v (present %v)", rounds, up, ok)
	})
	got := read()
	if got.Status.Phase != v1alpha1.PhaseReady || !got.Status.Healthy || got.Status.ConsecutiveProbeFailures != 0 {
		t.Fatalf("after five rounds with the probe target down: phase %s, healthy %v, %d failures; want it Ready, healthy, none counted",
			got.Status.Phase, got.Status.Healthy, got.Status.ConsecutiveProbeFailures)
	}
	event := func(reason string) func() (bool, error) {
		return func() (bool, error) {
			var list eventsv1.EventList
			if err := c.List(ctx, &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
				return false, err
			}
			for _, ev := range list.Items {
				if ev.Regarding.Kind == "ProviderHealth" && ev.Regarding.Name == "kvm2-home" && ev.Reason == reason {
					return true, nil
				}
			}
			return false, nil
		}
	}
	mgr.waitUntil("a ProbeTargetDown event on ProviderHealth kvm2-home", event(health.ReasonProbeTargetDown))
	if n := strings.Count(mgr.stderr.String(), "probe target down:"); n != 1 {
		t.Errorf("%d log lines of the outage's start, want 1", n)
	}

	down.Store(false)
	mgr.waitUntil("a ProbeTargetUp event and the gauge at 1", func() (bool, error) {
		ok, err := event(health.ReasonProbeTargetUp)()
		up, _ := metricValue(scrape(), "proxy_operator_probe_target_up")
		return ok && up == 1, err
	})
	if n := strings.Count(mgr.stderr.String(), "probe target up again"); n != 1 {
		t.Errorf("%d log lines of the outage's end, want 1", n)
	}
	fp.SetMode(healthtest.Fail)
	mgr.waitUntil("the proxy that really fails to be taken out", func() (bool, error) {
		got := read()
		return got.Status.Phase == v1alpha1.PhaseRunning && !got.Status.Healthy,
			fmt.Errorf("phase %s, healthy %v, %d failures", got.Status.Phase, got.Status.Healthy, got.Status.ConsecutiveProbeFailures)
	})
	mgr.stop()
}
