package client_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gateway"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gateway/kube"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// exampleBanned is the proxy shop.example.com bans in ExampleTransport's run: the one
// pick?domain=shop.example.com sticks to, so that the example shows a retry.
const exampleBanned = "p2"

// TestMain gives ExampleTransport and ExampleGatewayTransport what a crawler's Pod has:
// EGRESS_PROXIES_URL, the discovery API (the manager's server, over the External Proxies
// crawl/p1 and crawl/p2 held in memory), EGRESS_PROXIES_TOKEN_FILE, its token, and
// EGRESS_PROXIES_GATEWAY, the gateway (internal/gateway over that server's choice, as
// cmd/gateway runs it). Each proxy is a forward
// proxy on loopback demanding basic auth that answers for the site itself: "<path> via
// <proxy>", or 403 through exampleBanned for shop.example.com (ExampleTransport's site)
// and shop.example.org (ExampleGatewayTransport's: another site, so that neither
// example's ban makes the other's exit cool).
func TestMain(m *testing.M) {
	os.Exit(runWithExampleEnv(m))
}

func runWithExampleEnv(m *testing.M) int {
	dir, err := os.MkdirTemp("", "client-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	f := &fleet{}
	for i := 1; i <= 2; i++ {
		name := "p" + strconv.Itoa(i)
		ps := httptest.NewServer(exampleProxy(name))
		defer ps.Close()
		host, port, _ := net.SplitHostPort(ps.Listener.Addr().String())
		p, _ := strconv.Atoi(port)
		f.proxies = append(f.proxies, &v1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: name},
			Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: host, Port: int32(p),
				Proxy: &v1alpha1.ProxyConfig{BasicAuth: &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "auth"}}}},
			Status: v1alpha1.ProxyStatus{IP: host, Phase: v1alpha1.PhaseReady, Healthy: true},
		})
	}
	f.rebuild()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		panic(err)
	}
	srv, err := discovery.New(f, discovery.Options{TokenFile: tokenFile, Feedback: f,
		Credentials: func(context.Context, *v1alpha1.Proxy) (*proxyconfig.Credentials, error) {
			return &proxyconfig.Credentials{Username: proxyUser, Password: proxyPass}, nil
		}})
	if err != nil {
		panic(err)
	}
	api := httptest.NewServer(srv.Handler())
	defer api.Close()
	ad := &kube.Adapter{Server: srv, Log: logr.Discard()}
	gw, err := gateway.New(gateway.Config{Chooser: ad, Authenticator: ad, Reporter: ad, Log: logr.Discard()})
	if err != nil {
		panic(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go gw.Serve(ln)
	defer func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		gw.Shutdown(ctx)
	}()
	os.Setenv("EGRESS_PROXIES_URL", api.URL)
	os.Setenv("EGRESS_PROXIES_TOKEN_FILE", tokenFile)
	os.Setenv("EGRESS_PROXIES_GATEWAY", "http://"+ln.Addr().String())
	return m.Run()
}

// exampleProxy is the proxy named name: it takes absolute-URI requests with the proxies'
// basic auth and answers them itself.
func exampleProxy(name string) http.Handler {
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte(proxyUser+":"+proxyPass))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("Proxy-Authorization") != auth || !r.URL.IsAbs():
			http.Error(w, "proxy authentication required", http.StatusProxyAuthRequired)
		case name == exampleBanned && (r.URL.Hostname() == "shop.example.com" || r.URL.Hostname() == "shop.example.org"):
			http.Error(w, "forbidden", http.StatusForbidden)
		default:
			fmt.Fprintf(w, "%s via %s", r.URL.Path, name)
		}
	})
}
