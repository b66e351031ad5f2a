package config_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/demand"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// The gateway binary, run as its own ServiceAccount with nothing but config/gateway's
// ClusterRole (the API server authorizes every call it makes, impersonated), does its
// whole job: its cache syncs (/readyz), a crawler's ServiceAccount token is accepted as
// the proxy password (TokenReview, SubjectAccessReview), a request reaches the site
// through the exit, and the site's 403 lands in the Proxy's status.cooldowns (the ban
// recorder's get and status patch), and a request held for a pool at zero is written as
// the pool's demand in a Lease in the gateway's own namespace (its demand Role there). So
// the ClusterRole and the Role TestGatewayRBAC holds to a minimum are also enough.
func TestGatewayRunsUnderItsRBAC(t *testing.T) {
	env := testenv.StartT(t)
	ctx := testenv.Context(t)
	c := env.Client
	gwNS, proxyNS := env.Namespace(t, ctx, "gw"), env.Namespace(t, ctx, "team")

	// config/gateway's ServiceAccount, ClusterRole and binding, and its demand Role and
	// binding, in gwNS.
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	var demandRole rbacv1.Role
	var demandBinding rbacv1.RoleBinding
	for _, doc := range documents(t, "gateway/rbac.yaml") {
		var tm struct{ Kind string }
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatal(err)
		}
		switch tm.Kind {
		case "ClusterRole":
			decodeStrict(t, "gateway/rbac.yaml", doc, &role)
		case "ClusterRoleBinding":
			decodeStrict(t, "gateway/rbac.yaml", doc, &binding)
		case "Role":
			decodeStrict(t, "gateway/rbac.yaml", doc, &demandRole)
		case "RoleBinding":
			decodeStrict(t, "gateway/rbac.yaml", doc, &demandBinding)
		}
	}
	role.Name, binding.Name, binding.RoleRef.Name = gwNS+"-gateway", gwNS+"-gateway", gwNS+"-gateway"
	binding.Subjects[0].Namespace = gwNS
	demandRole.Namespace, demandBinding.Namespace, demandBinding.Subjects[0].Namespace = gwNS, gwNS, gwNS
	sa := binding.Subjects[0].Name
	for _, o := range []client.Object{&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: gwNS, Name: sa}}, &role, &binding, &demandRole, &demandBinding} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), o) })
	}

	// A kubeconfig that acts as that ServiceAccount.
	kc, err := clientcmd.Load(env.KubeConfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = "system:serviceaccount:" + gwNS + ":" + sa
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + gwNS, "system:authenticated"}
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}

	// The site answers 403 on /ban; the exit forwards every request to it.
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ban" {
			http.Error(w, "banned", http.StatusForbidden)
			return
		}
		fmt.Fprintf(w, "hello %s\n", r.Host)
	}))
	t.Cleanup(site.Close)
	siteAddr := strings.TrimPrefix(site.URL, "http://")
	exit := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.Out.URL = r.In.URL; r.Out.Host = r.In.Host },
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", siteAddr)
		}},
	})
	t.Cleanup(exit.Close)
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(exit.URL, "http://"))
	var p int32
	fmt.Sscan(port, &p)
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: proxyNS, Name: "exit"},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: host, Port: p}}
	if err := c.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	px.Status = v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, IP: host, Healthy: true}
	if err := c.Status().Update(ctx, px); err != nil {
		t.Fatal(err)
	}

	// A crawler of proxyNS: the shipped crawler ClusterRole bound there, its own token.
	token := testenv.CrawlerToken(t, ctx, env, proxyNS)

	bin := filepath.Join(dir, "gateway")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/gateway").CombinedOutput(); err != nil {
		t.Fatalf("go build ../cmd/gateway: %v\n%s", err, out)
	}
	listen, probe := testutil.FreeAddr(t), testutil.FreeAddr(t)
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--listen-address", listen, "--socks-listen-address", "0",
		"--metrics-bind-address", "0", "--health-probe-bind-address", probe, "--shutdown-grace", "1s", "--demand-namespace", gwNS)
	var stderr testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	testutil.WaitFor(t, 2*time.Minute, "the gateway's /readyz to answer 200 (its cache synced under its ClusterRole)", func() (bool, error) {
		select {
		case err := <-exited:
			t.Fatalf("gateway exited (%v); stderr:\n%s", err, stderr.String())
		default:
		}
		res, err := http.Get("http://" + probe + "/readyz")
		if err != nil {
			return false, err
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK, fmt.Errorf("status %d", res.StatusCode)
	}, testutil.OnTimeout(func() string { return "stderr:\n" + stderr.String() }))

	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: listen, User: url.UserPassword("me+ns="+proxyNS, token)})}}
	get := func(target string) (*http.Response, string, error) {
		res, err := hc.Get(target)
		if err != nil {
			return nil, "", err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return res, string(b), err
	}
	testutil.WaitFor(t, time.Minute, "a request with the crawler's token through the gateway to reach the site", func() (bool, error) {
		res, body, err := get("http://www.example.com/")
		if err != nil {
			return false, err
		}
		return res.StatusCode == http.StatusOK && strings.Contains(body, "hello www.example.com") && res.Header.Get("X-Egress-Proxy") == proxyNS+"/exit",
			fmt.Errorf("%d %q X-Egress-Proxy %q", res.StatusCode, body, res.Header.Get("X-Egress-Proxy"))
	}, testutil.OnTimeout(func() string { return "stderr:\n" + stderr.String() }))

	if res, body, err := get("http://www.example.com/ban"); err != nil || res.StatusCode != http.StatusForbidden {
		t.Fatalf("GET /ban through the gateway: %v %v %q, want the site's 403", err, res, body)
	}
	testutil.WaitFor(t, time.Minute, "the site's 403 to land in "+proxyNS+"/exit's status.cooldowns (written by the gateway)", func() (bool, error) {
		got := &v1alpha1.Proxy{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(px), got); err != nil {
			return false, err
		}
		for _, cd := range got.Status.Cooldowns {
			if cd.Site == "example.com" {
				return true, nil
			}
		}
		return false, fmt.Errorf("cooldowns %+v", got.Status.Cooldowns)
	}, testutil.OnTimeout(func() string { return "stderr:\n" + stderr.String() }))
	// A pool at zero (autoscaled, so that a request may wake it): the request is held, and
	// the wake written into the demand Lease in gwNS (the demand namespace), never in the
	// pool's namespace.
	pool := testbuild.Pool(proxyNS, "idle", 0, testbuild.Managed(), testbuild.WithProvider("fake"), testbuild.WithPort(3128),
		testbuild.Autoscaled(0, 1, 1))
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	heldCtx, stopHeld := context.WithCancel(ctx)
	t.Cleanup(stopHeld)
	go func() {
		held := &http.Client{Transport: &http.Transport{
			Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: listen, User: url.UserPassword("me+ns="+proxyNS+"+pool=idle", token)})}}
		// Until the gateway's cache has the pool just created, it is an unknown pool
		// (407): ask again until the request is held.
		for heldCtx.Err() == nil {
			req, _ := http.NewRequestWithContext(heldCtx, http.MethodGet, "http://www.example.com/held", nil)
			if res, err := held.Do(req); err == nil {
				res.Body.Close()
			}
			select {
			case <-heldCtx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	testutil.WaitFor(t, time.Minute, "the held request's demand Lease in "+gwNS+" (written under the gateway's demand Role)", func() (bool, error) {
		list := &coordinationv1.LeaseList{}
		if err := c.List(ctx, list, client.InNamespace(gwNS), client.MatchingLabels(demand.Selector(client.ObjectKeyFromObject(pool)))); err != nil {
			return false, err
		}
		for _, l := range list.Items {
			if l.Annotations[demand.AnnotationHeld] == "1" {
				return true, nil
			}
		}
		return false, fmt.Errorf("%d Leases: %+v", len(list.Items), list.Items)
	}, testutil.OnTimeout(func() string { return "stderr:\n" + stderr.String() }))
	stopHeld()
	if strings.Contains(stderr.String(), "forbidden") {
		t.Errorf("the gateway was refused something under its ClusterRole and Role:\n%s", stderr.String())
	}
}
