package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud/hcloudfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// TestManagerRunsAProxyOnHCloud: the manager binary with an hcloud provider entry pointed
// at the in-process Hetzner Cloud API runs a Managed Proxy end to end. The server is
// created with the Proxy's user-data and labels, the fake gives it a loopback IPv4 where a
// forward proxy listens and an IPv6 /64, the Proxy goes Running with both addresses and
// then Ready with its egress IP, ProviderHealth reports the location, and deleting the
// Proxy deletes the server, leaving none.
func TestManagerRunsAProxyOnHCloud(t *testing.T) {
	t.Parallel()
	env := testenv.StartT(t)
	c := env.Client
	fp := healthtest.New(t, "127.0.0.10")
	fake := hcloudfake.New()
	t.Cleanup(fake.Close)
	fake.SetIPv4Address(fp.Host)
	fake.SetIPv6Network("2001:db8:46::/64")
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(hcloudfake.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	providers := writeFile(t, "providers.yaml", fake.ProvidersConfig("hetzner-eu", tokenFile))
	disc := freeAddr(t)
	mgr := startManager(t, env, "--providers-config", providers,
		"--health-probe-bind-address", freeAddr(t), "--metrics-bind-address", "0",
		"--discovery-bind-address", disc, "--proxy-probe-url", "http://"+disc+"/v1/whoami",
		"--proxy-check-interval", "1s", "--provider-check-interval", "1s", "--provider-check-timeout", "2s",
		"--deletion-drain", "1s")

	ctx := context.Background()
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "hcloud-edge", Namespace: "default"},
		Spec: v1alpha1.ProxySpec{Provider: "hetzner-eu", Port: fp.Port,
			Placement: v1alpha1.ProxyPlacement{Zone: "fsn1", MachineType: "cx23", Image: "ubuntu-24.04"},
			CloudInit: "#cloud-config\npackages: [tinyproxy]\n"}}
	if err := c.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(px)
	got := &v1alpha1.Proxy{}
	mgr.waitUntil("the Proxy to be Running on an hcloud server with its IPv4 and IPv6", func() (bool, error) {
		if err := c.Get(ctx, key, got); err != nil {
			return false, err
		}
		return strings.HasPrefix(got.Status.ProviderID, "hcloud://proxy-") && got.Status.IP == fp.Host && got.Status.IPv6 == "2001:db8:46::1",
			fmt.Errorf("providerID %q, ip %q, ipv6 %q, phase %s", got.Status.ProviderID, got.Status.IP, got.Status.IPv6, got.Status.Phase)
	})
	name := strings.TrimPrefix(got.Status.ProviderID, "hcloud://")
	srv, ok := fake.ServerByName(name)
	if !ok || srv.Labels["epo-uid"] != string(got.UID) || srv.Labels["epo-install"] == "" {
		t.Fatalf("server %s in the fake: %+v", name, srv)
	}
	if ud := fake.UserData(srv.ID); !strings.Contains(ud, "#cloud-config") {
		t.Errorf("user_data %q holds no cloud-config", ud)
	}
	readyThenDeleted(t, mgr, c, key, "127.0.0.10", "hetzner-eu")
	if n := len(fake.Servers()); n != 0 {
		t.Errorf("%d servers left in the fake after the Proxy was deleted", n)
	}
	if fake.CallCount(hcloudfake.ServersDelete) == 0 {
		t.Error("the server was never deleted through the API")
	}
	mgr.stop()
}

// readyThenDeleted waits for the Proxy of key to be Ready and healthy with egressIP and
// for the ProviderHealth of provider to report its one target ready, then deletes the
// Proxy and waits until it is gone.
func readyThenDeleted(t *testing.T, mgr *managerProc, c client.Client, key client.ObjectKey, egressIP, provider string) {
	t.Helper()
	ctx := context.Background()
	got := &v1alpha1.Proxy{}
	mgr.waitUntil("the Proxy to be Ready with egress IP "+egressIP, func() (bool, error) {
		if err := c.Get(ctx, key, got); err != nil {
			return false, err
		}
		return got.Status.Phase == v1alpha1.PhaseReady && got.Status.Healthy && got.Status.EgressIP == egressIP,
			fmt.Errorf("phase %s, healthy %t, egress IP %q, message %q", got.Status.Phase, got.Status.Healthy, got.Status.EgressIP, got.Status.Message)
	})
	mgr.waitUntil("ProviderHealth "+provider+" with its target ready", func() (bool, error) {
		ph := &v1alpha1.ProviderHealth{}
		if err := c.Get(ctx, client.ObjectKey{Name: provider}, ph); err != nil {
			return false, err
		}
		return ph.Status.TotalTargets == 1 && ph.Status.Ready == "1/1",
			fmt.Errorf("%d targets, ready %q", ph.Status.TotalTargets, ph.Status.Ready)
	})
	if err := c.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	mgr.waitUntil("the Proxy to be gone", func() (bool, error) {
		err := c.Get(ctx, key, got)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("get: %v, phase %s", err, got.Status.Phase)
	})
}
