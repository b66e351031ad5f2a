//go:build deploy

package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

// prometheus is a Prometheus server of the test's own (Debian's prometheus package,
// installed by hack/deps.sh), a process on the node scraping the manager's pods over
// HTTPS with the metrics-reader token, as the ServiceMonitor of config/prometheus has a
// Prometheus in the cluster do, and evaluating config/prometheus/rules.yaml.
type prometheus struct {
	url string // http://127.0.0.1:<port>
	log string
}

// startPrometheus starts it with a scrape config naming each pod (its address, and the
// namespace and pod labels the ServiceMonitor's target discovery adds), every 2 s: the
// manager's pods over HTTPS with the token, the gateway's over plain HTTP on its metrics
// port, as config/prometheus's second ServiceMonitor scrapes them.
func startPrometheus(t *testing.T, e env, pods, gateways []corev1.Pod, token string) *prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("no prometheus on PATH (hack/deps.sh installs Debian's prometheus package): %v", err)
	}
	dir := t.TempDir()
	tokenPath := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenPath, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	var targets []any
	for _, p := range pods {
		targets = append(targets, map[string]any{
			"targets": []string{net.JoinHostPort(p.Status.PodIP, "8443")},
			"labels":  map[string]string{"namespace": p.Namespace, "pod": p.Name},
		})
	}
	var gwTargets []any
	for _, p := range gateways {
		gwTargets = append(gwTargets, map[string]any{
			"targets": []string{net.JoinHostPort(p.Status.PodIP, "9090")},
			"labels":  map[string]string{"namespace": p.Namespace, "pod": p.Name},
		})
	}
	cfg := map[string]any{
		"global":     map[string]any{"scrape_interval": "2s", "evaluation_interval": "2s"},
		"rule_files": []string{filepath.Join(e.root, "config", "prometheus", "rules.yaml")},
		"scrape_configs": []any{map[string]any{
			"job_name":      "egress-proxies-operator",
			"scheme":        "https",
			"tls_config":    map[string]any{"insecure_skip_verify": true}, // the manager's certificate is self-signed
			"authorization": map[string]any{"type": "Bearer", "credentials_file": tokenPath},
			// As the ServiceMonitor's honorLabels: the pool gauges keep their own namespace
			// label (the pool's) rather than the target's (the manager's).
			"honor_labels":   true,
			"static_configs": targets,
		}, map[string]any{
			"job_name":       "egress-proxies-operator-gateway",
			"scheme":         "http",
			"honor_labels":   true,
			"static_configs": gwTargets,
		}},
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := &prometheus{url: "http://" + addr, log: filepath.Join(dir, "prometheus.log")}
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--storage.tsdb.retention.time=1h")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	testutil.WaitFor(t, 2*time.Minute, "Prometheus to scrape both manager pods over HTTPS with the metrics-reader token and the gateway's pods over HTTP (up == 1)", func() (bool, error) {
		select {
		case <-exited:
			t.Fatalf("prometheus exited:\n%s", p.tail())
		default:
		}
		res, err := p.query("up")
		if err != nil {
			return false, err
		}
		up := 0
		for _, s := range res {
			if s.Value[1] == "1" {
				up++
			}
		}
		return up == len(pods)+len(gateways), fmt.Errorf("%d of %d targets up: %+v", up, len(pods)+len(gateways), res)
	}, testutil.Every(time.Second), testutil.OnTimeout(p.tail))
	return p
}

func (p *prometheus) tail() string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return "--- prometheus log (last 30 lines):\n" + strings.Join(lines, "\n")
}

// series is one element of an instant vector.
type series struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query evaluates expr now through the HTTP API; an expression Prometheus refuses (or
// fails to evaluate) is an error with Prometheus's own words. A scalar result counts as
// one series.
func (p *prometheus) query(expr string) ([]series, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/api/v1/query?query="+url.QueryEscape(expr), nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	var body struct {
		Status, Error, ErrorType string
		Data                     struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		}
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("query %q: %d, %w", expr, res.StatusCode, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %q: %s: %s", expr, body.ErrorType, body.Error)
	}
	if body.Data.ResultType != "vector" {
		return []series{{}}, nil
	}
	var out []series
	if err := json.Unmarshal(body.Data.Result, &out); err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	for i := range out {
		out[i].Value[1] = fmt.Sprint(out[i].Value[1])
	}
	return out, nil
}

// checkRules waits until Prometheus has evaluated every alerting rule of rules.yaml and
// checks that none reported an error.
func (p *prometheus) checkRules(t *testing.T, want []framework.AlertRule) {
	t.Helper()
	type rule struct {
		Name, Health, LastError, Type string
		LastEvaluation                time.Time
	}
	var rules []rule
	testutil.WaitFor(t, 2*time.Minute, "Prometheus to evaluate each of the "+fmt.Sprint(len(want))+" alerting rules", func() (bool, error) {
		res, err := http.Get(p.url + "/api/v1/rules?type=alert")
		if err != nil {
			return false, err
		}
		defer res.Body.Close()
		var body struct {
			Data struct {
				Groups []struct{ Rules []rule }
			}
		}
		if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
			return false, err
		}
		rules = rules[:0]
		for _, g := range body.Data.Groups {
			rules = append(rules, g.Rules...)
		}
		evaluated := 0
		for _, r := range rules {
			if !r.LastEvaluation.IsZero() && r.LastEvaluation.Year() > 2000 {
				evaluated++
			}
		}
		return len(rules) == len(want) && evaluated == len(rules), fmt.Errorf("%d rules loaded, %d evaluated", len(rules), evaluated)
	}, testutil.Every(time.Second), testutil.OnTimeout(p.tail))
	for _, r := range rules {
		if r.Health != "ok" || r.LastError != "" {
			t.Errorf("alert %s: health %q, error %q", r.Name, r.Health, r.LastError)
		}
	}
}

// checkQueries evaluates every dashboard query and every alert expression, each of which
// must evaluate without error; the queries of the dashboard's Proxies row must return
// series while the Proxy is Ready, and so must those of the Gateway row once the gateway
// has carried plain-HTTP requests (checkGateway), but for the ones that read tunnels,
// failures, held requests or a pool's demand, which this run makes none of. The probe failure ratio divides by failures seen: it
// has no series while no probe has failed, which is checked rather than assumed. It
// returns how many expressions were evaluated and how many returned series.
func (p *prometheus) checkQueries(t *testing.T, panels []framework.PanelQuery, alerts []framework.AlertRule) (evaluated, withSeries int) {
	t.Helper()
	for _, q := range panels {
		what := fmt.Sprintf("the dashboard's panel %q (row %s): %s", q.Panel, q.Row, q.Expr)
		var n int
		// This run sends no tunnel, no failure and nothing for a pool through the gateway:
		// the panels of those (holds and per-pool demand among them) are only evaluated.
		gatewayCarried := q.Row == "Gateway" && !strings.Contains(q.Expr, "tunnels_total") && !strings.Contains(q.Expr, "no_exit") &&
			!strings.Contains(q.Expr, "held_requests") && !strings.Contains(q.Expr, "activation_wait") && !strings.Contains(q.Expr, "gateway_pool_")
		if q.Row == "Proxies" || gatewayCarried {
			testutil.WaitFor(t, 3*time.Minute, what+" to return series", func() (bool, error) {
				res, err := p.query(q.Expr)
				if err != nil {
					t.Fatal(err) // an expression that does not evaluate will not start to
				}
				n = len(res)
				if n == 0 && strings.Contains(q.Expr, `result="failure"`) {
					failed, err := p.query(`proxy_operator_proxy_probes_total{result="failure"}`)
					if err == nil && len(failed) == 0 {
						return true, nil // no probe has failed: no ratio to show
					}
				}
				return n > 0, fmt.Errorf("%d series", n)
			}, testutil.Every(2*time.Second), testutil.OnTimeout(p.tail))
			if n == 0 {
				t.Logf("%s: no series, as no probe has failed", what)
			}
		} else {
			res, err := p.query(q.Expr)
			if err != nil {
				t.Errorf("%s: %v", what, err)
				continue
			}
			n = len(res)
		}
		evaluated++
		if n > 0 {
			withSeries++
		}
		t.Logf("%d series: %s", n, what)
	}
	for _, a := range alerts {
		res, err := p.query(a.Expr)
		if err != nil {
			t.Errorf("alert %s: %v", a.Alert, err)
			continue
		}
		evaluated++
		if len(res) > 0 {
			withSeries++
		}
		t.Logf("%d series: alert %s (firing or pending when > 0)", len(res), a.Alert)
	}
	return evaluated, withSeries
}
