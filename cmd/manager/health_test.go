package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// The manager binary end to end for the health side: an External Proxy in front of a
// forward proxy on loopback is probed through it (the probe target being the manager's
// own /v1/whoami), becomes Ready with its egress IP, and the discovery API, behind a
// bearer token, hands it out from the cache; the ProviderHealth object appears.
func TestManagerHealthAndDiscovery(t *testing.T) {
	env := testenv.StartT(t)
	c := env.Client
	fp := healthtest.New(t, "127.0.0.9")

	providers := writeFile(t, "providers.yaml", fmt.Sprintf(goodConfig, t.TempDir()))
	token := writeFile(t, "token", "t0ken\n")
	probe, disc := freeAddr(t), freeAddr(t)
	mgr := startManager(t, env, "--providers-config", providers,
		"--health-probe-bind-address", probe, "--metrics-bind-address", "0",
		"--discovery-bind-address", disc, "--discovery-token-file", token,
		"--proxy-probe-url", "http://"+disc+"/v1/whoami", "--proxy-check-interval", "1s",
		"--provider-check-interval", "1s", "--provider-check-timeout", "500ms")

	ctx := context.Background()
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: "default", Labels: map[string]string{"pool": "crawl"}},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: fp.Host, Port: fp.Port}}
	if err := c.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	mgr.waitUntil("the External Proxy to be Ready with egress IP 127.0.0.9", func() (bool, error) {
		got := &v1alpha1.Proxy{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(px), got); err != nil {
			return false, err
		}
		st := got.Status
		return st.Phase == v1alpha1.PhaseReady && st.Healthy && st.EgressIP == "127.0.0.9",
			fmt.Errorf("phase %q, healthy %v, egress IP %q", st.Phase, st.Healthy, st.EgressIP)
	})

	get := func(path, tok string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+disc+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, _ := get("/v1/proxies", ""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", code)
	}
	want := fmt.Sprintf("http://%s:%d\n", fp.Host, fp.Port)
	mgr.waitUntil("the discovery API to list the healthy proxy", func() (bool, error) {
		code, body := get("/v1/proxies?format=text&labelSelector=pool%3Dcrawl", "t0ken")
		return code == http.StatusOK && body == want, fmt.Errorf("%d %q", code, body)
	})
	code, body := get("/v1/proxies/pick?key=session-1", "t0ken")
	var picked struct{ Name, URL, EgressIP string }
	if err := json.Unmarshal([]byte(body), &picked); code != http.StatusOK || err != nil || picked.Name != "edge" || picked.EgressIP != "127.0.0.9" {
		t.Errorf("pick: %d %s", code, body)
	}

	mgr.waitUntil("ProviderHealth kvm2-home with one target per host", func() (bool, error) {
		ph := &v1alpha1.ProviderHealth{}
		if err := c.Get(ctx, client.ObjectKey{Name: "kvm2-home"}, ph); err != nil {
			return false, err
		}
		st := ph.Status
		return st.TotalTargets >= 1 && st.LastChecked != nil && strings.Contains(st.Ready, "/"),
			fmt.Errorf("%d targets, ready %q, last checked %v", st.TotalTargets, st.Ready, st.LastChecked)
	})

	// The proxy goes away: after three failed probes discovery stops handing it out.
	fp.SetMode(healthtest.Fail)
	mgr.waitUntil("discovery to stop listing the failing proxy", func() (bool, error) {
		code, body := get("/v1/proxies?format=text", "t0ken")
		return code == http.StatusOK && body == "", fmt.Errorf("%d %q", code, body)
	})
	if code, _ := get("/v1/proxies/pick?key=session-1", "t0ken"); code != http.StatusServiceUnavailable {
		t.Errorf("pick with nothing healthy: %d, want 503", code)
	}

	mgr.stop()
}
