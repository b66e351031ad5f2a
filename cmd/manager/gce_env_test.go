package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/gcefake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

const gceConfig = `providers:
  - name: gcp-eu
    type: gce
    gce:
      project: epo-env-project
      zones: [europe-west1-b]
      machineTypes: {small: e2-small}
      images: {ubuntu-2404: projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64}
      endpoint: %s
      withoutAuthentication: true
`

// gceFake starts the in-process Compute API, which gives instances the address of a
// forward proxy of the test's own, and writes a providers config with one gce entry for it.
func gceFake(t *testing.T) (*healthtest.ForwardProxy, *gcefake.Server, string) {
	t.Helper()
	fp := healthtest.New(t, "127.0.0.9")
	fake := gcefake.New("epo-env-project", "europe-west1-b")
	t.Cleanup(fake.Close)
	fake.SetNATAddress(fp.Host)
	return fp, fake, writeFile(t, "providers.yaml", fmt.Sprintf(gceConfig, fake.URL))
}

// TestManagerRunsAProxyOnGCE: the manager binary with a gce provider entry pointed at the
// in-process Compute API runs a Managed Proxy end to end. The instance is inserted with
// the Proxy's user-data, the fake hands out a loopback NAT IP where a forward proxy
// listens, the Proxy goes Running, with its cost by gce's default price table, and then
// Ready with its egress IP, ProviderHealth reports the zone, and deleting the Proxy
// deletes the instance, leaving none.
func TestManagerRunsAProxyOnGCE(t *testing.T) {
	t.Parallel()
	env := testenv.StartT(t)
	c := env.Client
	fp, fake, providers := gceFake(t)
	disc := freeAddr(t)
	mgr := startManager(t, env, "--providers-config", providers,
		"--health-probe-bind-address", freeAddr(t), "--metrics-bind-address", "0",
		"--discovery-bind-address", disc, "--proxy-probe-url", "http://"+disc+"/v1/whoami",
		"--proxy-check-interval", "1s", "--provider-check-interval", "1s", "--provider-check-timeout", "2s",
		"--deletion-drain", "1s")

	ctx := context.Background()
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "gce-edge", Namespace: "default"},
		Spec: v1alpha1.ProxySpec{Provider: "gcp-eu", Port: fp.Port,
			Placement: v1alpha1.ProxyPlacement{Region: "europe-west1", Zone: "europe-west1-b", MachineType: "small", Image: "ubuntu-2404"},
			CloudInit: "#cloud-config\npackages: [tinyproxy]\n"}}
	if err := c.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKeyFromObject(px)
	got := &v1alpha1.Proxy{}
	mgr.waitUntil("the Proxy to be Running on a gce instance", func() (bool, error) {
		if err := c.Get(ctx, key, got); err != nil {
			return false, err
		}
		return strings.HasPrefix(got.Status.ProviderID, "gce://epo-env-project/europe-west1-b/proxy-") && got.Status.IP == fp.Host,
			fmt.Errorf("providerID %q, ip %q, phase %s", got.Status.ProviderID, got.Status.IP, got.Status.Phase)
	})
	// The cost controller prices it by gce's default table: e2-small and its external IPv4.
	mgr.waitUntil("the Proxy's status.cost", func() (bool, error) {
		if err := c.Get(ctx, key, got); err != nil {
			return false, err
		}
		cost := got.Status.Cost
		return cost != nil && cost.Hourly == "0.021751" && cost.Currency == "USD",
			fmt.Errorf("status.cost %+v, want 0.021751 USD", cost)
	})
	name := got.Status.ProviderID[strings.LastIndex(got.Status.ProviderID, "/")+1:]
	inst := fake.Instance("europe-west1-b", name)
	if inst == nil || inst.GetLabels()["epo-uid"] != string(got.UID) {
		t.Fatalf("instance %s in the fake: %v", name, inst)
	}
	var userData string
	for _, it := range inst.GetMetadata().GetItems() {
		if it.GetKey() == "user-data" {
			userData = it.GetValue()
		}
	}
	if !strings.Contains(userData, "#cloud-config") {
		t.Errorf("user-data metadata %q holds no cloud-config", userData)
	}
	readyThenDeleted(t, mgr, c, key, "127.0.0.9", "gcp-eu")
	if n := fake.Instances(); n != 0 {
		t.Errorf("%d instances left in the fake after the Proxy was deleted", n)
	}
	if fake.CallCount(gcefake.InstancesDelete) == 0 {
		t.Error("the instance was never deleted through the API")
	}
	mgr.stop()
}
