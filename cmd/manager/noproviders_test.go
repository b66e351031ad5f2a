package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// Which providers config the manager reads, and when it runs with none.
func TestLoadProvidersConfig(t *testing.T) {
	absent := filepath.Join(t.TempDir(), "absent.yaml")
	empty := writeFile(t, "providers.yaml", "providers: []\n")
	good := writeFile(t, "providers.yaml", fmt.Sprintf(goodConfig, t.TempDir()))
	for _, tc := range []struct {
		name        string
		path        string
		given       bool
		providers   int
		none, error string // substrings; "" wants none
	}{
		{"default path absent", absent, false, 0, "not given and nothing at its default path " + absent, ""},
		{"given empty", "", true, 0, "--providers-config is empty", ""},
		{"given and absent", absent, true, 0, "", "--providers-config " + absent + ": no such file"},
		{"given, lists none", empty, true, 0, "the providers config " + empty + " lists none", ""},
		{"default path present", good, false, 1, "", ""},
		{"given and present", good, true, 1, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, none, err := loadProvidersConfig(tc.path, tc.given)
			if tc.error != "" {
				if err == nil || !strings.Contains(err.Error(), tc.error) {
					t.Fatalf("error %v, want one containing %q", err, tc.error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Providers) != tc.providers || (tc.none == "") != (none == "") || !strings.Contains(none, tc.none) {
				t.Errorf("%d providers, none %q; want %d providers, none containing %q", len(cfg.Providers), none, tc.providers, tc.none)
			}
		})
	}
}

// Without --providers-config and with nothing at its default path, the manager starts,
// says so, serves an External Proxy, and fails a Managed one naming the missing provider
// and what to do.
func TestManagerWithoutProvidersConfig(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(defaultProvidersConfig); err == nil {
		t.Skipf("%s exists on this machine", defaultProvidersConfig)
	}
	env := testenv.StartT(t)
	ctx := context.Background()
	fp := healthtest.New(t, "127.0.0.2")
	token := writeFile(t, "token", "t0ken\n")
	disc := freeAddr(t)
	mgr := startManager(t, env, "--health-probe-bind-address", freeAddr(t), "--metrics-bind-address", "0",
		"--discovery-bind-address", disc, "--discovery-token-file", token,
		"--proxy-probe-url", "http://"+disc+"/v1/whoami", "--proxy-check-interval", "1s")

	ext := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "office", Namespace: "default"},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: fp.Host, Port: fp.Port}}
	managed := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "crawler-1", Namespace: "default"},
		Spec: v1alpha1.ProxySpec{Provider: "kvm2-home"}}
	for _, px := range []*v1alpha1.Proxy{ext, managed} {
		if err := env.Client.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
	}
	mgr.waitUntil("the External Proxy to be handed out by discovery", func() (bool, error) {
		code, body := discoveryGet(disc, "/v1/proxies?format=text", "t0ken")
		return code == 200 && strings.TrimSpace(body) == fmt.Sprintf("http://%s:%d", fp.Host, fp.Port), fmt.Errorf("%d %q", code, body)
	})
	want := `provider "kvm2-home" is not configured (no providers are configured: the manager was started without a providers config`
	mgr.waitUntil("the Managed Proxy to fail naming its provider", func() (bool, error) {
		var got v1alpha1.Proxy
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(managed), &got); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionProvisioned)
		return got.Status.Phase == v1alpha1.PhaseFailed && c != nil && c.Reason == v1alpha1.ReasonProviderNotConfigured &&
			strings.Contains(c.Message, want), fmt.Errorf("phase %q, Provisioned %+v", got.Status.Phase, c)
	})
	if log := mgr.stderr.String(); !strings.Contains(log, "starting with no providers") || !strings.Contains(log, "nothing at its default path "+defaultProvidersConfig) {
		t.Errorf("the log does not say the manager runs with no providers, and why:\n%s", log)
	}
	mgr.stop()
}
