package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

var shared = testenv.NewShared()

func TestMain(m *testing.M) { os.Exit(shared.Run(m)) }

// Bad flags stop the gateway with exit code 2 and a message naming the flag.
func TestFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-attempts", "0"}, "--max-attempts 0"},
		{[]string{"--header-timeout", "0s"}, "--header-timeout 0s"},
		{[]string{"--activation-timeout", "-1s"}, "--activation-timeout -1s"},
		{[]string{"--max-held-per-pool", "0"}, "--max-held-per-pool 0"},
		{[]string{"--shutdown-grace", "-1s"}, "--shutdown-grace -1s"},
		{[]string{"--discovery-kubernetes-auth=false"}, "--discovery-token-file"},
		{[]string{"--listen-address", "0"}, "--listen-address"},
		{[]string{"--watch-namespaces", "a,Bad"}, `--watch-namespaces "a,Bad": namespace "Bad"`},
		{[]string{"--demand-namespace", "Not_A_Namespace"}, `--demand-namespace "Not_A_Namespace"`},
	} {
		var stderr bytes.Buffer
		if code := run(c.args, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: exit %d, %q; want 2 naming %s", c.args, code, stderr.String(), c.want)
		}
	}
}

// --demand-namespace defaults to the pod's own namespace (POD_NAMESPACE here), and a given
// one is taken as it is.
func TestDemandNamespaceFlag(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "egress-system")
	o, err := parseFlags(nil, io.Discard)
	if err != nil || o.demandNamespace != "egress-system" || o.demandNamespaceFrom != "POD_NAMESPACE" {
		t.Fatalf("default: %v, %q from %q; want egress-system from POD_NAMESPACE", err, o.demandNamespace, o.demandNamespaceFrom)
	}
	o, err = parseFlags([]string{"--demand-namespace", "operators"}, io.Discard)
	if err != nil || o.demandNamespace != "operators" {
		t.Fatalf("--demand-namespace operators: %v, %q", err, o.demandNamespace)
	}
}

// The gateway binary, against a real API server, serves /readyz once its cache has
// synced, carries curl's requests through the one External exit, as an HTTP proxy
// (naming the exit in X-Egress-Proxy) and as a SOCKS5 proxy, refuses a wrong token with
// 407, and on SIGTERM drains and exits 0.
func TestGatewayBinaryCarriesCurl(t *testing.T) {
	env := shared.Env(t)
	ctx := testenv.Context(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "gateway")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s\n", r.Host) }))
	t.Cleanup(site.Close)
	siteAddr := strings.TrimPrefix(site.URL, "http://")
	forward := &httputil.ReverseProxy{ // sends every request to the site
		Rewrite: func(r *httputil.ProxyRequest) { r.Out.URL = r.In.URL; r.Out.Host = r.In.Host },
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", siteAddr)
		}},
	}
	exit := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			forward.ServeHTTP(w, r)
			return
		}
		// CONNECT to any target: a tunnel to the site.
		up, err := net.Dial("tcp", siteAddr)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			up.Close()
			return
		}
		_, _ = c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		_, _ = io.Copy(c, up)
		c.Close()
	}))
	t.Cleanup(exit.Close)
	ns := env.Namespace(t, ctx, "gwbin")
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(exit.URL, "http://"))
	var p int32
	fmt.Sscan(port, &p)
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "exit"},
		Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: host, Port: p}}
	if err := env.Client.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	px.Status = v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, IP: host, Healthy: true}
	if err := env.Client.Status().Update(ctx, px); err != nil {
		t.Fatal(err)
	}

	kubeconfig, token := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "token")
	for f, b := range map[string][]byte{kubeconfig: env.KubeConfig, token: []byte("t0ken\n")} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	listen, socks, probe := testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--listen-address", listen, "--socks-listen-address", socks,
		"--metrics-bind-address", "0", "--health-probe-bind-address", probe,
		"--discovery-token-file", token, "--discovery-kubernetes-auth=false", "--shutdown-grace", "5s", "--watch-namespaces", ns)
	var stderr testutil.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	})
	start := time.Now()
	testutil.WaitFor(t, time.Minute, "the gateway's /readyz to answer 200", func() (bool, error) {
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
	t.Logf("ready %v after start", time.Since(start).Round(time.Millisecond))

	var out string
	testutil.WaitFor(t, time.Minute, "curl through the gateway to reach the site through "+ns+"/exit", func() (bool, error) {
		b, err := exec.Command("curl", "-sS", "-i", "--max-time", "10", "-x", "http://me+ns="+ns+":t0ken@"+listen, "http://www.example.com/").CombinedOutput()
		out = string(b)
		return err == nil && strings.Contains(out, "hello www.example.com"), fmt.Errorf("curl: %v: %s", err, out)
	})
	if !strings.Contains(out, "X-Egress-Proxy: "+ns+"/exit") {
		t.Errorf("curl's answer names no exit %s/exit:\n%s", ns, out)
	}
	if b, err := exec.Command("curl", "-sS", "--max-time", "10", "--socks5-hostname", socks, "-U", "me+ns="+ns+":t0ken", "http://www.example.com/").CombinedOutput(); err != nil || !strings.Contains(string(b), "hello www.example.com") {
		t.Errorf("curl --socks5-hostname through the gateway: %v: %s", err, b)
	}
	if b, _ := exec.Command("curl", "-sS", "-i", "--max-time", "10", "-x", "http://me:wrong@"+listen, "http://www.example.com/").CombinedOutput(); !strings.Contains(string(b), "407") {
		t.Errorf("a wrong token: %s, want 407", b)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("gateway exited with %v after SIGTERM, want 0; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("gateway still running a minute after SIGTERM; stderr:\n%s", stderr.String())
	}
	if strings.Contains(stderr.String(), "over plain HTTP") {
		t.Errorf("the gateway warns of an HTTP API it does not serve:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "gateway drained") {
		t.Errorf("the log does not say the gateway drained:\n%s", stderr.String())
	}
}
