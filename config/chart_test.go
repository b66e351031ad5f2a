package config_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// The chart, installed as release egress-proxies-operator into the namespace config/default
// uses, renders the same objects as config/default. The differences below are the only
// ones allowed; each is named where it is removed.
const (
	chartDir     = "../charts/egress-proxies-operator"
	releaseName  = "egress-proxies-operator"
	releaseNS    = "egress-proxies-operator-system"
	checksumAnno = "checksum/providers-config"
)

// helmLabels are the labels the chart adds to every object and pod, and config/default has
// no counterpart for.
var helmLabels = []string{"app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version", "helm.sh/chart"}

// tool finds a binary the Makefile builds into the cache: $env, else name in
// $KUBEBUILDER_ASSETS (where hack/envtest-assets.sh puts kubectl). Missing, the test is
// skipped with how to get it, or fails under EPO_REQUIRE_ENVTEST like the envtest tests.
func tool(t *testing.T, env, name, how string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p
		}
	}
	msg := fmt.Sprintf("no %s: set %s (%s)", name, env, how)
	if os.Getenv(testenv.RequireVar) != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func helmBin(t *testing.T) string {
	return tool(t, "HELM", "helm", "HELM=$(hack/helm.sh)")
}

func kubectlBin(t *testing.T) string {
	return tool(t, "KUBECTL", "kubectl", "KUBECTL=$(hack/envtest-assets.sh kubectl)/kubectl")
}

// run runs a command and returns its stdout; stderr comes back in the error.
func run(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %v: %s", filepath.Base(name), strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// objects decodes a multi-document stream by kind/namespace/name.
func objects(t *testing.T, what string, stream []byte) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, doc := range regexp.MustCompile(`(?m)^---$`).Split(string(stream), -1) {
		var o map[string]any
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, doc)
		}
		if o == nil {
			continue
		}
		md, _ := o["metadata"].(map[string]any)
		key := fmt.Sprintf("%s %v/%v", o["kind"], md["namespace"], md["name"])
		if _, dup := out[key]; dup {
			t.Fatalf("%s renders %s twice", what, key)
		}
		out[key] = o
	}
	return out
}

func renderChart(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	return run(helmBin(t), append([]string{"template", releaseName, chartDir, "--namespace", releaseNS, "--include-crds"}, args...)...)
}

func dropLabels(m map[string]any, path ...string) {
	for _, p := range path {
		next, _ := m[p].(map[string]any)
		if next == nil {
			return
		}
		m = next
	}
	labels, _ := m["labels"].(map[string]any)
	for _, l := range helmLabels {
		delete(labels, l)
	}
}

func TestChartRendersConfigDefault(t *testing.T) {
	kust, err := run(kubectlBin(t), "kustomize", "default")
	if err != nil {
		t.Fatal(err)
	}
	chart, err := renderChart(t)
	if err != nil {
		t.Fatal(err)
	}
	want := objects(t, "kubectl kustomize config/default", kust)
	got := objects(t, "helm template", chart)

	// Allowed difference 1: the chart has no Namespace; helm install --create-namespace
	// (or the namespace existing) stands for it.
	ns := "Namespace <nil>/" + releaseNS
	if _, ok := want[ns]; !ok {
		t.Fatalf("config/default no longer makes the Namespace %s; the chart's release namespace must follow", releaseNS)
	}
	delete(want, ns)

	for key, o := range got {
		// Allowed difference 2: Helm's labels on every object and pod template.
		dropLabels(o, "metadata")
		dropLabels(o, "spec", "template", "metadata")
		if o["kind"] == "Deployment" && strings.HasSuffix(key, "-controller-manager") {
			// Allowed difference 3: the manager's pod template's checksum of the providers
			// config, which restarts the manager when helm upgrade changes it (the gateway
			// does not read it).
			md := o["spec"].(map[string]any)["template"].(map[string]any)["metadata"].(map[string]any)
			annos, _ := md["annotations"].(map[string]any)
			if _, ok := annos[checksumAnno]; !ok {
				t.Errorf("%s: the pod template lacks %s", key, checksumAnno)
			}
			delete(annos, checksumAnno)
			if len(annos) == 0 {
				delete(md, "annotations")
			}
		}
		// Allowed difference 4: controller-gen writes the manager's ClusterRole without
		// labels; the chart labels it like every other object.
		if o["kind"] == "ClusterRole" && strings.HasSuffix(key, "-manager-role") {
			md := o["metadata"].(map[string]any)
			if l, _ := md["labels"].(map[string]any); len(l) == 1 && l["app.kubernetes.io/name"] == "egress-proxies-operator" {
				delete(md, "labels")
			}
		}
	}

	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		w, inWant := want[k]
		g, inGot := got[k]
		switch {
		case !inGot:
			t.Errorf("config/default makes %s, the chart does not", k)
		case !inWant:
			t.Errorf("the chart makes %s, config/default does not", k)
		default:
			if d := cmp.Diff(w, g); d != "" {
				t.Errorf("%s differs (-config/default +chart):\n%s", k, d)
			}
		}
	}
	if len(want) < 10 {
		t.Errorf("compared only %d objects: %v", len(want), keys)
	}
}

// Values that would make an invalid manifest are refused by values.schema.json, naming
// the value, before anything is rendered.
func TestChartSchemaRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want []string // in the error
	}{
		{[]string{"replicas=-1"}, []string{"/replicas", "minimum"}},
		{[]string{"replicas=two"}, []string{"/replicas", "integer"}},
		{[]string{"image.repository="}, []string{"/image/repository", "minLength"}},
		{[]string{"image.tag="}, []string{"/image/tag", "minLength"}},
		{[]string{"metrics.port=0"}, []string{"/metrics/port", "minimum"}},
		{[]string{"image.pullPolicy=Sometimes"}, []string{"/image/pullPolicy"}},
		{[]string{"replica=3"}, []string{"additional properties 'replica'"}},
		{[]string{"discovery.kubernetesAuth=maybe"}, []string{"/discovery/kubernetesAuth", "boolean"}},
		{[]string{"crawlerRoleBindings[0].namespace=Team_A", "crawlerRoleBindings[0].serviceAccount=crawler"}, []string{"/crawlerRoleBindings/0/namespace"}},
		{[]string{"crawlerRoleBindings[0].namespace=team-a"}, []string{"/crawlerRoleBindings/0", "serviceAccount"}},
		{[]string{"gateway.replicas=-1"}, []string{"/gateway/replicas", "minimum"}},
		{[]string{"gateway.ports.proxy=0"}, []string{"/gateway/ports/proxy", "minimum"}},
		{[]string{"gateway.ports.socks=70000"}, []string{"/gateway/ports/socks", "maximum"}},
		{[]string{"gateway.service.type=Ingress"}, []string{"/gateway/service/type"}},
		{[]string{"gateway.autoscaling.targetCPUUtilizationPercentage=0"}, []string{"/gateway/autoscaling/targetCPUUtilizationPercentage", "minimum"}},
		{[]string{"gateway.autoscaling.minReplicas=0"}, []string{"/gateway/autoscaling/minReplicas", "minimum"}},
		{[]string{"gateway.enabled=yes"}, []string{"/gateway/enabled", "boolean"}},
		{[]string{"gateway.replica=3"}, []string{"additional properties 'replica'"}},
	} {
		t.Run(strings.Join(tc.set, ","), func(t *testing.T) {
			var args []string
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, err := renderChart(t, args...)
			if err == nil {
				t.Fatalf("helm template accepted %v:\n%.400s", tc.set, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q:\n%v", w, err)
				}
			}
			// helm lint refuses them the same way.
			if _, err := run(helmBin(t), append([]string{"lint", chartDir}, args...)...); err == nil {
				t.Errorf("helm lint accepted %v", tc.set)
			}
		})
	}
	// And the defaults pass, so the cases above fail for their value alone.
	if _, err := run(helmBin(t), "lint", "--strict", chartDir); err != nil {
		t.Fatal(err)
	}
}

// Values a user sets reach the manifest: the image, replicas, node selection, the TLS
// Secret's mount and flag, and the PodDisruptionBudget switched off.
func TestChartValuesReachTheDeployment(t *testing.T) {
	out, err := renderChart(t, "--set", "image.repository=registry.example/epo", "--set", "image.tag=v9",
		"--set", "replicas=3", "--set", "nodeSelector.role=infra", "--set", "discovery.tls.secretName=disc-tls",
		"--set", "podDisruptionBudget.enabled=false", "--set", "fullnameOverride=epo")
	if err != nil {
		t.Fatal(err)
	}
	got := objects(t, "helm template", out)
	if _, ok := got["PodDisruptionBudget "+releaseNS+"/epo-controller-manager"]; ok {
		t.Error("podDisruptionBudget.enabled=false still renders the PodDisruptionBudget")
	}
	d, ok := got["Deployment "+releaseNS+"/epo-controller-manager"]
	if !ok {
		t.Fatalf("no Deployment epo-controller-manager among %v", slices.Sorted(func(yield func(string) bool) {
			for k := range got {
				if !yield(k) {
					return
				}
			}
		}))
	}
	js, _ := yaml.Marshal(d)
	for _, want := range []string{
		"image: registry.example/epo:v9", "replicas: 3", "role: infra",
		"--discovery-cert-dir=/etc/proxy-operator/discovery-tls", "secretName: disc-tls",
		"name: epo-providers-config",
	} {
		if !bytes.Contains(js, []byte(want)) {
			t.Errorf("the Deployment lacks %q:\n%s", want, js)
		}
	}
}

// crawlerRoleBindings binds the crawler ClusterRole, and the credentials one where asked,
// to each ServiceAccount in its namespace; discovery.kubernetesAuth=false reaches the
// manager as --discovery-kubernetes-auth=false (the default, true, is the flag's own).
func TestChartCrawlerRoleBindings(t *testing.T) {
	out, err := renderChart(t, "--set", "discovery.kubernetesAuth=false",
		"--set", "crawlerRoleBindings[0].namespace=team-a", "--set", "crawlerRoleBindings[0].serviceAccount=crawler",
		"--set", "crawlerRoleBindings[0].credentials=true",
		"--set", "crawlerRoleBindings[1].namespace=team-b", "--set", "crawlerRoleBindings[1].serviceAccount=bot")
	if err != nil {
		t.Fatal(err)
	}
	got := objects(t, "helm template", out)
	type binding struct{ role, subject string }
	want := map[string]binding{
		"RoleBinding team-a/egress-proxies-operator-crawler-crawler":     {"egress-proxies-operator-crawler", "team-a/crawler"},
		"RoleBinding team-a/egress-proxies-operator-credentials-crawler": {"egress-proxies-operator-credentials", "team-a/crawler"},
		"RoleBinding team-b/egress-proxies-operator-crawler-bot":         {"egress-proxies-operator-crawler", "team-b/bot"},
	}
	for key, o := range got {
		md := o["metadata"].(map[string]any)
		if o["kind"] != "RoleBinding" || md["namespace"] == releaseNS {
			continue
		}
		w, ok := want[key]
		if !ok {
			t.Errorf("the chart makes %s, not asked for", key)
			continue
		}
		delete(want, key)
		ref := o["roleRef"].(map[string]any)
		subjects := o["subjects"].([]any)
		sub := subjects[0].(map[string]any)
		if ref["kind"] != "ClusterRole" || ref["name"] != w.role || len(subjects) != 1 || sub["kind"] != "ServiceAccount" ||
			fmt.Sprintf("%v/%v", sub["namespace"], sub["name"]) != w.subject {
			t.Errorf("%s binds %v to %v, want ClusterRole %s to ServiceAccount %s", key, ref, subjects, w.role, w.subject)
		}
		for _, role := range []string{"egress-proxies-operator-crawler", "egress-proxies-operator-credentials"} {
			if _, ok := got["ClusterRole <nil>/"+role]; !ok {
				t.Errorf("%s binds ClusterRole %s, which the chart does not make", key, role)
			}
		}
	}
	for key := range want {
		t.Errorf("the chart does not make %s", key)
	}
	js, _ := yaml.Marshal(got["Deployment "+releaseNS+"/egress-proxies-operator-controller-manager"])
	if !bytes.Contains(js, []byte("--discovery-kubernetes-auth=false")) {
		t.Errorf("discovery.kubernetesAuth=false: the Deployment lacks --discovery-kubernetes-auth=false:\n%s", js)
	}
}

// Chart version and appVersion both come from the VERSION file (make chart-version).
func TestChartVersionIsTheProjectVersion(t *testing.T) {
	version := strings.TrimSpace(string(mustRead(t, "../VERSION")))
	var c struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(mustRead(t, filepath.Join(chartDir, "Chart.yaml")), &c); err != nil {
		t.Fatal(err)
	}
	if c.Version != version || c.AppVersion != version {
		t.Errorf("Chart.yaml has version %q and appVersion %q, VERSION says %q: run make chart-version", c.Version, c.AppVersion, version)
	}
}

// The chart's CRDs and the manager's ClusterRole rules are controller-gen's, copied by
// make manifests.
func TestChartCarriesTheGeneratedFiles(t *testing.T) {
	pairs := map[string]string{filepath.Join(chartDir, "files/role.yaml"): "rbac/role.yaml"}
	crds, _ := filepath.Glob("crd/bases/*.yaml")
	for _, c := range crds {
		pairs[filepath.Join(chartDir, "crds", filepath.Base(c))] = c
	}
	inChart, _ := filepath.Glob(filepath.Join(chartDir, "crds/*.yaml"))
	if len(inChart) != len(crds) || len(crds) == 0 {
		t.Errorf("the chart has %d CRDs, config/crd/bases %d: run make manifests", len(inChart), len(crds))
	}
	for copyPath, orig := range pairs {
		if !bytes.Equal(mustRead(t, copyPath), mustRead(t, orig)) {
			t.Errorf("%s is not config/%s: run make manifests", copyPath, orig)
		}
	}
}
