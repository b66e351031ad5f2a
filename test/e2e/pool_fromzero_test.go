//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// fromZeroActivation is the gateway's --activation-timeout in the pool story: one guest
// boot under TCG on a loaded machine, with room.
const fromZeroActivation = 12 * time.Minute

// startFromZero makes pool a pool at zero that the autoscaler sizes (minReplicas 0,
// maxReplicas 1, one session per child), for the first part of the pool story.
func startFromZero(pool *v1alpha1.ProxyPool) {
	pool.Spec.Replicas = ptr.To[int32](0)
	pool.Spec.Autoscaling = &v1alpha1.PoolAutoscaling{MinReplicas: ptr.To[int32](0), MaxReplicas: 1,
		Target: v1alpha1.PoolAutoscalingTarget{SessionsPerReplica: ptr.To[int32](1)}}
}

// gatewayBin is the gateway binary run against the story's control plane.
type gatewayBin struct {
	cmd    *exec.Cmd
	listen string
	log    string
}

// startGateway builds and starts cmd/gateway with the manager's discovery token as the
// callers' token and fromZeroActivation; it is stopped when the test ends.
func startGateway(t *testing.T, dir, kubeconfig, tokenFile string) *gatewayBin {
	t.Helper()
	bin := filepath.Join(dir, "gateway")
	if err := testutil.BuildGateway(bin); err != nil {
		t.Fatal(err)
	}
	g := &gatewayBin{listen: freeAddr(t, "127.0.0.1"), log: filepath.Join(dir, "gateway.log")}
	logf, err := os.Create(g.log)
	if err != nil {
		t.Fatal(err)
	}
	probe := freeAddr(t, "127.0.0.1")
	g.cmd = exec.Command(bin, "--kubeconfig", kubeconfig, "--listen-address", g.listen,
		"--socks-listen-address", freeAddr(t, "127.0.0.1"), "--health-probe-bind-address", probe,
		"--metrics-bind-address", "0", "--discovery-token-file", tokenFile,
		"--activation-timeout", fromZeroActivation.String())
	g.cmd.Env = append(os.Environ(), "POD_NAME=e2e-gateway")
	g.cmd.Stdout, g.cmd.Stderr = logf, logf
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = g.cmd.Process.Signal(syscall.SIGTERM)
		_ = g.cmd.Wait()
		logf.Close()
		if t.Failed() {
			if data, err := os.ReadFile(g.log); err == nil {
				t.Logf("the gateway's log:\n%s", data)
			}
		}
	})
	testutil.WaitFor(t, shortDeadline, "the gateway's /readyz to answer 200", func() (bool, error) {
		res, err := http.Get("http://" + probe + "/readyz")
		if err != nil {
			return false, err
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK, fmt.Errorf("/readyz %d", res.StatusCode)
	}, testutil.Every(200*time.Millisecond))
	return g
}

// firstRequest sends one request through the gateway for the pool at zero and returns
// how long it took to its first byte; it fails the test unless the request was answered
// 200 by target through the pool's one child, and the pool then has one child, Ready.
func (p *poolStory) firstRequest(g *gatewayBin, ns, target string) time.Duration {
	p.t.Helper()
	proxyURL := &url.URL{Scheme: "http", User: url.UserPassword("e2e+ns="+ns+"+pool="+p.key.Name, discoveryToken), Host: g.listen}
	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: fromZeroActivation + time.Minute}
	var (
		firstByte, start time.Time
		res              *http.Response
		body             []byte
	)
	// The gateway learns of the pool from its informer, a moment after it was created:
	// until then it answers 407 naming the pool unknown.
	known := time.Now()
	for {
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(),
			&httptrace.ClientTrace{GotFirstResponseByte: func() { firstByte = time.Now() }}), http.MethodGet, target, nil)
		start = time.Now()
		var err error
		if res, err = hc.Do(req); err != nil {
			p.t.Fatalf("the first request through the gateway for pool %s at zero: %v (%s)", p.key, err, p.describe())
		}
		body, _ = io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusProxyAuthRequired || !strings.Contains(string(body), "unknown pool") || time.Since(known) > shortDeadline {
			break
		}
		time.Sleep(100 * time.Millisecond) // a poll of the gateway's view, not a wait for the pool
	}
	if d := start.Sub(known); d > time.Second {
		p.t.Logf("the gateway knew pool %s %s after it was created", p.key, d.Round(time.Millisecond))
	}
	took := firstByte.Sub(start)
	if res.StatusCode != http.StatusOK {
		p.t.Fatalf("the first request through the gateway for pool %s at zero: %s after %s: %s (%s)", p.key, res.Status, took, body, p.describe())
	}
	kids, err := p.children()
	if err != nil || len(kids) != 1 || !readyChild(&kids[0]) {
		p.t.Errorf("after the first request the pool has %d children (%v), want 1 Ready (%s)", len(kids), err, p.describe())
	} else if c := meta.FindStatusCondition(kids[0].Status.Conditions, v1alpha1.ConditionReady); c != nil {
		// Whole seconds, as the API server keeps them.
		created, ready := kids[0].CreationTimestamp.Time, c.LastTransitionTime.Time
		p.t.Logf("TIMING pool from zero: request -> child %s created %s; created -> Ready (the boot) %s; Ready -> first byte %s",
			kids[0].Name, created.Sub(start).Round(time.Second), ready.Sub(created).Round(time.Second), firstByte.Sub(ready).Round(time.Second))
	}
	p.t.Logf("the first request left through %s", strings.TrimSpace(string(body)))
	return took
}
