//go:build integration

package crawl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud/hcloudfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// v6Host is the site's name; only the IPv6 stand-in of the server resolves it (to ::1).
// serverIPv6 is the stand-in server's IPv6 address, the ::1 of its /64 2001:db8:46::/64,
// which hack/crawl-deps.sh puts on the loopback interface.
const (
	v6Host     = "v6.example.net"
	serverIPv6 = "2001:db8:46::1"
)

// TestHCloudProxyLeavesOverIPv6: a Managed Proxy on hcloud, made through the in-process
// Hetzner Cloud API, whose "server" has the primary IPv4 127.0.0.1 and the IPv6 /64
// 2001:db8:46::/64 (so its status.ipv6 is 2001:db8:46::1), with a forward proxy on each
// address at the Proxy's port, the IPv6 one leaving from 2001:db8:46::1: discovery's
// ipFamily=6 hands it out by http://[2001:db8:46::1]:<port>, and a request through that
// URL, and one through the gateway with ip=6, reach a site that listens only on [::1] and
// sees the request come from 2001:db8:46::1. The health probe goes over the IPv4 address,
// as it does for every Proxy.
func TestHCloudProxyLeavesOverIPv6(t *testing.T) {
	env, _ := startCrawlEnv(t)
	fp4 := healthtest.New(t, "127.0.0.11")
	if l, err := net.Listen("tcp", net.JoinHostPort(serverIPv6, "0")); err != nil {
		t.Fatalf("%s is not an address of this machine (hack/crawl-deps.sh adds it to lo): %v", serverIPv6, err)
	} else {
		l.Close()
	}
	fp6 := healthtest.Listen(t, net.JoinHostPort(serverIPv6, strconv.Itoa(int(fp4.Port))), serverIPv6)
	fp6.Resolve(v6Host, "::1")
	site := newV6Site(t)

	fake := hcloudfake.New()
	t.Cleanup(fake.Close)
	fake.SetIPv4Address(fp4.Host)
	fake.SetIPv6Network("2001:db8:46::/64")
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "hcloud-token")
	if err := os.WriteFile(tokenFile, []byte(hcloudfake.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	disc, discToken := startManagerWithProviders(t, env, fake.ProvidersConfig("hetzner-eu", tokenFile))

	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "hcloud-v6", Namespace: "default"},
		Spec: v1alpha1.ProxySpec{Provider: "hetzner-eu", Port: fp4.Port,
			Placement: v1alpha1.ProxyPlacement{Zone: "fsn1", MachineType: "cx23", Image: "ubuntu-24.04"},
			CloudInit: "#cloud-config\npackages: [tinyproxy]\n"}}
	if err := env.Client.Create(context.Background(), px); err != nil {
		t.Fatal(err)
	}
	want := "http://" + net.JoinHostPort(serverIPv6, strconv.Itoa(int(fp4.Port)))
	testutil.WaitFor(t, 2*time.Minute, "discovery's ipFamily=6 to hand out default/hcloud-v6 by "+want, func() (bool, error) {
		urls, err := v6URLs(disc)
		got := &v1alpha1.Proxy{}
		_ = env.Client.Get(context.Background(), client.ObjectKeyFromObject(px), got)
		return err == nil && len(urls) == 1 && urls[0] == want, fmt.Errorf("urls %v, %v (the Proxy: phase %s, healthy %t, ip %q, ipv6 %q)",
			urls, err, got.Status.Phase, got.Status.Healthy, got.Status.IP, got.Status.IPv6)
	}, testutil.Every(200*time.Millisecond))

	// Through discovery's IPv6 URL.
	proxyURL, _ := url.Parse(want)
	direct := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: 30 * time.Second}
	if src := site.get(t, direct, "/direct"); src != serverIPv6 {
		t.Errorf("through %s the site saw the request from %q, want %s", want, src, serverIPv6)
	}

	// Through the gateway, asking for an IPv6 exit.
	gw := &gatewayProc{bin: buildGateway(t, dir), kubeconfig: filepath.Join(dir, "kubeconfig"), tokenFile: discToken,
		listen: testutil.FreeAddr(t), socks: testutil.FreeAddr(t), probe: testutil.FreeAddr(t), metrics: testutil.FreeAddr(t)}
	if err := os.WriteFile(gw.kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	gw.start(t)
	t.Cleanup(func() { gw.kill(t) })
	through := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http",
		User: url.UserPassword("crawler+ip=6", token), Host: gw.listen})}, Timeout: 30 * time.Second}
	if src := site.get(t, through, "/gateway"); src != serverIPv6 {
		t.Errorf("through the gateway with ip=6 the site saw the request from %q, want %s", src, serverIPv6)
	}
	t.Logf("the hcloud Proxy's IPv6 exit %s carried a request from discovery's URL and one from the gateway (ip=6) to a site on [::1], both from %s", want, serverIPv6)
}

// v6URLs lists discovery's proxies by their IPv6 URLs.
func v6URLs(disc string) ([]string, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+disc+"/v1/proxies?ipFamily=6", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		return nil, fmt.Errorf("GET /v1/proxies?ipFamily=6: %s: %s", res.Status, b)
	}
	var l struct {
		Proxies []struct {
			URL string `json:"url"`
		} `json:"proxies"`
	}
	if err := json.NewDecoder(res.Body).Decode(&l); err != nil {
		return nil, err
	}
	var urls []string
	for _, p := range l.Proxies {
		urls = append(urls, p.URL)
	}
	return urls, nil
}

// v6Site listens on [::1] only and answers each request with its source address.
type v6Site struct{ port string }

func newV6Site(t *testing.T) *v6Site {
	t.Helper()
	l, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Fatalf("no IPv6 loopback here: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		_, _ = io.WriteString(w, host)
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return &v6Site{port: port}
}

// get fetches path of the site through hc and returns the source address it saw.
func (s *v6Site) get(t *testing.T, hc *http.Client, path string) string {
	t.Helper()
	u := "http://" + net.JoinHostPort(v6Host, s.port) + path
	res, err := hc.Get(u)
	if err != nil {
		t.Errorf("GET %s: %v", u, err)
		return ""
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %s: %s", u, res.Status, b)
	}
	return string(b)
}
