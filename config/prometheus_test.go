package config_test

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

func promtool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	const msg = "no promtool on PATH: hack/deps.sh installs Debian's prometheus package"
	if os.Getenv(testenv.RequireVar) != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// promtool checks the rules and runs their unit tests: each alert firing, and not firing
// while the metrics are healthy or the condition is younger than its for:.
func TestPrometheusRulesPassPromtool(t *testing.T) {
	p := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "prometheus/rules.yaml"},
		{"test", "rules", "prometheus/rules_test.yaml"},
	} {
		if out, err := exec.Command(p, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// Every dashboard query is valid PromQL: promtool parses each as a recording rule.
func TestDashboardQueriesParse(t *testing.T) {
	p := promtool(t)
	type rule struct {
		Record string `json:"record"`
		Expr   string `json:"expr"`
	}
	var rules []rule
	for i, q := range dashboardQueries(t) {
		rules = append(rules, rule{Record: fmt.Sprintf("dashboard:query%d", i), Expr: q.Expr})
	}
	data, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(f, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(p, "check", "rules", f).CombinedOutput(); err != nil {
		t.Errorf("the dashboard's queries do not parse: %v\n%s", err, out)
	} else if !strings.Contains(string(out), fmt.Sprintf("%d rules found", len(rules))) {
		t.Errorf("promtool found other than %d queries:\n%s", len(rules), out)
	}
}

// Every alert has a test case that expects it to fire and one that expects nothing.
func TestEveryAlertIsTestedFiringAndNot(t *testing.T) {
	var rf monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(mustRead(t, "prometheus/rules.yaml"), &rf); err != nil {
		t.Fatalf("prometheus/rules.yaml: %v", err)
	}
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(mustRead(t, "prometheus/rules_test.yaml"), &tests); err != nil {
		t.Fatal(err)
	}
	firing, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if !firing[r.Alert] || !quiet[r.Alert] {
				t.Errorf("alert %s: tested firing %v, not firing %v; want both", r.Alert, firing[r.Alert], quiet[r.Alert])
			}
			if r.Annotations["summary"] == "" || !strings.Contains(r.Annotations["description"], "threshold") {
				t.Errorf("alert %s: want a summary and a description naming its threshold, got %v", r.Alert, r.Annotations)
			}
		}
	}
	if n < 6 {
		t.Errorf("only %d alerts", n)
	}
}

// The ServiceMonitor and the PrometheusRule decode strictly into the prometheus-operator's
// types (an unknown or misspelt field fails), the PrometheusRule holds exactly rules.yaml,
// and the ServiceMonitor scrapes the manager's metrics port the way the manager serves it.
func TestPrometheusOperatorObjectsDecodeStrictly(t *testing.T) {
	var sm monitoringv1.ServiceMonitor
	decodeStrict(t, "prometheus/servicemonitor.yaml", documents(t, "prometheus/servicemonitor.yaml")[0], &sm)
	var pr monitoringv1.PrometheusRule
	decodeStrict(t, "prometheus/prometheusrule.yaml", documents(t, "prometheus/prometheusrule.yaml")[0], &pr)
	if sm.Kind != "ServiceMonitor" || sm.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" || pr.APIVersion != "monitoring.coreos.com/v1" {
		t.Errorf("kinds %s %s, %s %s", sm.APIVersion, sm.Kind, pr.APIVersion, pr.Kind)
	}

	var file monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(mustRead(t, "prometheus/rules.yaml"), &file); err != nil {
		t.Fatalf("prometheus/rules.yaml: %v", err)
	}
	if d := cmp.Diff(file, pr.Spec); d != "" {
		t.Errorf("the PrometheusRule is not rules.yaml (-rules.yaml +PrometheusRule):\n%s", d)
	}

	d, svcs := deployed(t)
	mine := selecting(svcs, d.Spec.Template)
	if len(mine) != 1 {
		t.Fatalf("%d Services select the manager's pods", len(mine))
	}
	svc := mine[0]
	for k, v := range sm.Spec.Selector.MatchLabels {
		if svc.Labels[k] != v {
			t.Errorf("the ServiceMonitor selects %s=%s; the Service's labels are %v", k, v, svc.Labels)
		}
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("%d endpoints", len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
		t.Errorf("the ServiceMonitor scrapes port %q, which the Service does not have", ep.Port)
	}
	// bearerTokenFile is deprecated in favour of authorization, which takes a Secret; the
	// file is Prometheus's own service account token, which the metrics-reader role binds.
	//lint:ignore SA1019 the ServiceMonitor uses the token file on purpose (see above)
	if ep.Scheme == nil || strings.ToLower(string(*ep.Scheme)) != "https" || ep.BearerTokenFile == "" {
		t.Errorf("endpoint %+v: want HTTPS with the service account's bearer token", ep)
	}
	// The pool gauges' namespace label is the pool's: without honorLabels the prometheus-
	// operator's own namespace label (the manager's) would push it to exported_namespace.
	if !ep.HonorLabels {
		t.Error("the ServiceMonitor does not honor the manager's labels: the pool gauges' namespace label would be renamed")
	}
	if bindPort(t, d.Spec.Template.Spec.Containers[0].Args, "metrics-bind-address") != 8443 {
		t.Error("the manager's metrics port moved")
	}

	// The second ServiceMonitor scrapes the gateway's Service alone, over plain HTTP.
	docs := documents(t, "prometheus/servicemonitor.yaml")
	if len(docs) != 2 {
		t.Fatalf("prometheus/servicemonitor.yaml has %d documents, want the manager's and the gateway's", len(docs))
	}
	var gsm monitoringv1.ServiceMonitor
	decodeStrict(t, "prometheus/servicemonitor.yaml", docs[1], &gsm)
	deps, _ := workloads(t)
	gw := selecting(svcs, deps[gatewayDeployment].Spec.Template)
	if len(gw) != 1 {
		t.Fatalf("%d Services select the gateway's pods", len(gw))
	}
	sel := labels.SelectorFromSet(gsm.Spec.Selector.MatchLabels)
	for _, s := range svcs {
		if got, want := sel.Matches(labels.Set(s.Labels)), s.Name == gw[0].Name; got != want {
			t.Errorf("the gateway's ServiceMonitor selects the Service %s: %v, want %v", s.Name, got, want)
		}
	}
	if len(gsm.Spec.Endpoints) != 1 {
		t.Fatalf("the gateway's ServiceMonitor has %d endpoints", len(gsm.Spec.Endpoints))
	}
	gep := gsm.Spec.Endpoints[0]
	if !slices.ContainsFunc(gw[0].Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == gep.Port }) {
		t.Errorf("the gateway's ServiceMonitor scrapes port %q, which its Service does not have", gep.Port)
	}
	if gep.Scheme == nil || strings.ToLower(string(*gep.Scheme)) != "http" || !gep.HonorLabels {
		t.Errorf("the gateway's endpoint %+v: want plain HTTP (the gateway serves /metrics so) with honorLabels", gep)
	}
}

// metricNames are the series names a PromQL expression reads (anything followed by { or
// [ or a space, that looks like a metric of this manager or of controller-runtime).
var metricName = regexp.MustCompile(`\b(proxy_operator_[a-z_]+|controller_runtime_[a-z_]+|workqueue_[a-z_]+|leader_election_[a-z_]+)\b`)

// exported are the metric names the manager registers, read from the source: the
// proxy_operator_ ones by their Name:, and controller-runtime's by the ones it documents.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{
		"controller_runtime_reconcile_errors_total": true, "controller_runtime_reconcile_total": true,
		"controller_runtime_reconcile_time_seconds": true, "workqueue_depth": true,
		"workqueue_adds_total": true, "workqueue_queue_duration_seconds": true,
		"workqueue_retries_total": true, "leader_election_master_status": true,
	}
	def := regexp.MustCompile(`Name:\s+"(proxy_operator_[a-z_]+)"`)
	err := filepath.WalkDir("../internal", func(p string, de os.DirEntry, err error) error {
		if err != nil || de.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		for _, m := range def.FindAllSubmatch(mustRead(t, p), -1) {
			names[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// strip removes the suffixes Prometheus adds to a histogram's series.
func strip(name string) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(name, s); ok && strings.HasSuffix(b, "_seconds") {
			return b
		}
	}
	return name
}

// Every alert expression and every dashboard query reads metrics the manager exports: a
// renamed metric fails here, not silently on a dashboard.
func TestQueriesReadExportedMetrics(t *testing.T) {
	names := exported(t)
	var exprs []string
	var rf monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(mustRead(t, "prometheus/rules.yaml"), &rf); err != nil {
		t.Fatal(err)
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Alert+": "+r.Expr.String())
		}
	}
	for _, q := range dashboardQueries(t) {
		exprs = append(exprs, q.Panel+": "+q.Expr)
	}
	for _, e := range exprs {
		found := metricName.FindAllString(e, -1)
		if len(found) == 0 {
			t.Errorf("%s reads no metric of the manager", e)
		}
		for _, m := range found {
			if !names[strip(m)] {
				t.Errorf("%s reads %s, which the manager does not export", e, m)
			}
		}
	}
}

// dashboardQueries are the panel title and expression of every target of the Grafana
// dashboard, as the deploy tier sends them to a real Prometheus.
func dashboardQueries(t *testing.T) []framework.PanelQuery {
	t.Helper()
	qs, err := framework.DashboardQueries("grafana/egress-proxies-operator.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) < 8 {
		t.Errorf("only %d dashboard queries", len(qs))
	}
	return qs
}

// gatewayOutcomes are the outcome label values the gateway counts, read from its source:
// those of its requests and tunnels (route.go) and those of its held requests' waits
// (hold.go).
func gatewayOutcomes(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, m := range regexp.MustCompile(`\boutcome[A-Z]\w*\s*=\s*"([a-z_]+)"`).FindAllSubmatch(mustRead(t, "../internal/gateway/route.go"), -1) {
		out[string(m[1])] = true
	}
	for _, m := range regexp.MustCompile(`\bhold[A-Z]\w*\s*=\s*"([a-z_]+)"`).FindAllSubmatch(mustRead(t, "../internal/gateway/hold.go"), -1) {
		out[string(m[1])] = true
	}
	if len(out) < 7 {
		t.Fatalf("read only the outcomes %v from internal/gateway/route.go", out)
	}
	return out
}

// The dashboard's Gateway row reads every metric the gateway exports, and every outcome an
// alert or a panel names is one the gateway counts: a renamed outcome fails here, not by an
// alert that silently never fires.
func TestGatewayRowAndOutcomes(t *testing.T) {
	var gatewayMetrics []string
	for name := range exported(t) {
		if strings.HasPrefix(name, "proxy_operator_gateway_") {
			gatewayMetrics = append(gatewayMetrics, name)
		}
	}
	slices.Sort(gatewayMetrics)
	if len(gatewayMetrics) < 6 {
		t.Fatalf("found only the gateway metrics %v", gatewayMetrics)
	}
	read := map[string]bool{}
	var exprs []string
	for _, q := range dashboardQueries(t) {
		exprs = append(exprs, q.Expr)
		if q.Row != "Gateway" {
			continue
		}
		for _, m := range metricName.FindAllString(q.Expr, -1) {
			read[strip(m)] = true
		}
	}
	for _, m := range gatewayMetrics {
		if !read[m] {
			t.Errorf("no panel of the dashboard's Gateway row reads %s", m)
		}
	}
	var rf monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(mustRead(t, "prometheus/rules.yaml"), &rf); err != nil {
		t.Fatal(err)
	}
	alerts := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			exprs = append(exprs, r.Expr.String())
		}
	}
	for _, a := range []string{"EgressProxiesGatewayErrorRatioHigh", "EgressProxiesRemediationBrakeEngaged"} {
		if !alerts[a] {
			t.Errorf("rules.yaml has no alert %s", a)
		}
	}
	outcomes := gatewayOutcomes(t)
	matcher := regexp.MustCompile(`\boutcome\s*(?:=~|!~|!=|=)\s*"([^"]*)"`)
	n := 0
	for _, e := range exprs {
		for _, m := range matcher.FindAllStringSubmatch(e, -1) {
			for _, v := range strings.Split(m[1], "|") {
				n++
				if !outcomes[v] {
					t.Errorf("%s names the outcome %q, which the gateway does not count (it counts %v)", e, v, slices.Sorted(maps.Keys(outcomes)))
				}
			}
		}
	}
	if n == 0 {
		t.Error("no alert or panel names a gateway outcome")
	}
}
