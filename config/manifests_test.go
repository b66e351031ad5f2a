// Package config_test checks the manifests under config/ without a cluster: every file
// parses, kustomizations name files that exist, and the Deployment, ConfigMap and samples
// agree with each other and with the providers config rules.
package config_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

func documents(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

func stripComments(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func decodeStrict(t *testing.T, path string, doc []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(doc, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestEveryManifestParses(t *testing.T) {
	files, err := filepath.Glob("*/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("*/*/*.yaml")
	files = append(files, more...)
	if len(files) < 10 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		for _, doc := range documents(t, f) {
			var m map[string]any
			if err := yaml.Unmarshal(doc, &m); err != nil {
				t.Errorf("%s: %v", f, err)
				continue
			}
			base := filepath.Base(f)
			// Prometheus's own rule files (rules.yaml and its promtool tests) are no objects.
			if base == "kustomization.yaml" || base == "providers-config.yaml" || base == "rules.yaml" || base == "rules_test.yaml" {
				continue
			}
			if m["apiVersion"] == nil || m["kind"] == nil {
				t.Errorf("%s: a document without apiVersion or kind", f)
			}
		}
	}
}

func TestKustomizationsNameExistingFiles(t *testing.T) {
	files, _ := filepath.Glob("*/kustomization.yaml")
	if len(files) < 5 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		var k struct {
			Namespace  string   `json:"namespace"`
			NamePrefix string   `json:"namePrefix"`
			Resources  []string `json:"resources"`
		}
		decodeStrict(t, f, documents(t, f)[0], &k)
		for _, r := range k.Resources {
			if _, err := os.Stat(filepath.Join(filepath.Dir(f), r)); err != nil {
				t.Errorf("%s names %s: %v", f, r, err)
			}
		}
		if f == filepath.Join("default", "kustomization.yaml") && k.Namespace != "egress-proxies-operator-system" {
			t.Errorf("%s: namespace %q", f, k.Namespace)
		}
	}
}

func TestDeploymentMountsWhatTheConfigNames(t *testing.T) {
	var d appsv1.Deployment
	decodeStrict(t, "manager/manager.yaml", documents(t, "manager/manager.yaml")[0], &d)
	pod := d.Spec.Template.Spec
	if sc := pod.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("the pod does not run as non-root")
	}
	c := pod.Containers[0]
	if !slices.Contains(c.Args, "--providers-config=/etc/proxy-operator/providers.yaml") || !slices.Contains(c.Args, "--leader-elect") {
		t.Errorf("args %v", c.Args)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	if m := mounts["providers-config"]; m.MountPath != "/etc/proxy-operator/providers.yaml" || vols["providers-config"].ConfigMap == nil {
		t.Errorf("providers config mount %+v", m)
	}
	ssh := vols["kvm-ssh"].Secret
	if ssh == nil || ssh.SecretName != "kvm-ssh" || ssh.Optional == nil || !*ssh.Optional || mounts["kvm-ssh"].MountPath != "/etc/proxy-operator/kvm" {
		t.Errorf("kvm-ssh volume %+v mount %+v: want the optional Secret at /etc/proxy-operator/kvm", ssh, mounts["kvm-ssh"])
	}
	var keys []string
	for _, it := range ssh.Items {
		keys = append(keys, it.Path)
	}
	if diff := cmp.Diff([]string{"id_ed25519", "known_hosts"}, keys); diff != "" {
		t.Errorf("kvm-ssh files (-want +got):\n%s", diff)
	}
	// The discovery token: an optional Secret mounted where --discovery-token-file reads it.
	var tokenFile string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--discovery-token-file="); ok {
			tokenFile = v
		}
	}
	tok := vols["discovery-token"].Secret
	if tokenFile == "" || tok == nil || tok.SecretName != "discovery-token" || tok.Optional == nil || !*tok.Optional ||
		len(tok.Items) != 1 || mounts["discovery-token"].MountPath != filepath.Dir(tokenFile) || tok.Items[0].Path != filepath.Base(tokenFile) {
		t.Errorf("--discovery-token-file=%q, volume %+v, mount %+v: want the optional Secret discovery-token mounted so that the file is its one key",
			tokenFile, tok, mounts["discovery-token"])
	}
	if c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("imagePullPolicy %q: with the tag latest the default is Always, and an image loaded into the node is never used", c.ImagePullPolicy)
	}
	tmp := vols["tmp"].EmptyDir
	if tmp == nil || tmp.SizeLimit == nil || tmp.SizeLimit.Cmp(resource.MustParse("64Mi")) != 0 || mounts["tmp"].MountPath != "/tmp" {
		t.Errorf("/tmp volume %+v", vols["tmp"])
	}

	// The in-cluster and sample providers configs are valid and point into the mount.
	var cm corev1.ConfigMap
	decodeStrict(t, "manager/providers_config.yaml", documents(t, "manager/providers_config.yaml")[0], &cm)
	if vols["providers-config"].ConfigMap.Name != cm.Name {
		t.Errorf("deployment mounts ConfigMap %q, the manifest is %q", vols["providers-config"].ConfigMap.Name, cm.Name)
	}
	for name, data := range map[string][]byte{
		"manager/providers_config.yaml": []byte(cm.Data[filepath.Base(mounts["providers-config"].SubPath)]),
		"samples/providers-config.yaml": mustRead(t, "samples/providers-config.yaml"),
	} {
		cfg, err := provider.ParseConfig(data)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, pc := range cfg.Providers {
			if pc.KVM2 == nil || !strings.HasPrefix(pc.KVM2.SSHKeyFile, "/etc/proxy-operator/kvm/") || !strings.HasPrefix(pc.KVM2.KnownHostsFile, "/etc/proxy-operator/kvm/") {
				t.Errorf("%s: provider %s does not read its credentials from the kvm-ssh mount", name, pc.Name)
			}
		}
	}
}

func TestRBAC(t *testing.T) {
	var role rbacv1.ClusterRole
	decodeStrict(t, "rbac/role.yaml", documents(t, "rbac/role.yaml")[0], &role)
	var resources []string
	for _, r := range role.Rules {
		resources = append(resources, r.Resources...)
	}
	// Leases are not here: leader election's is granted by the namespaced Role
	// (internal/controller/common/role_test.go checks both).
	for _, want := range []string{"proxies", "proxies/status", "proxies/finalizers", "providerhealths", "providerhealths/status", "events", "namespaces",
		"proxypools", "proxypools/status", "services", "endpointslices", "secrets"} {
		if !slices.Contains(resources, want) {
			t.Errorf("the manager role lacks %s", want)
		}
	}
}

// The metrics endpoint's filter needs TokenReview and SubjectAccessReview, granted to
// the manager's ServiceAccount; metrics-reader is what a scraper is bound to.
func TestMetricsRBAC(t *testing.T) {
	var auth, reader rbacv1.ClusterRole
	decodeStrict(t, "rbac/metrics_auth_role.yaml", documents(t, "rbac/metrics_auth_role.yaml")[0], &auth)
	decodeStrict(t, "rbac/metrics_reader_role.yaml", documents(t, "rbac/metrics_reader_role.yaml")[0], &reader)
	grants := map[string]bool{}
	for _, r := range auth.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					grants[g+"/"+res+":"+v] = true
				}
			}
		}
	}
	for _, want := range []string{"authentication.k8s.io/tokenreviews:create", "authorization.k8s.io/subjectaccessreviews:create"} {
		if !grants[want] {
			t.Errorf("%s lacks %s", auth.Name, want)
		}
	}
	var b rbacv1.ClusterRoleBinding
	decodeStrict(t, "rbac/metrics_auth_role_binding.yaml", documents(t, "rbac/metrics_auth_role_binding.yaml")[0], &b)
	var sa corev1.ServiceAccount
	decodeStrict(t, "rbac/service_account.yaml", documents(t, "rbac/service_account.yaml")[0], &sa)
	if b.RoleRef.Name != auth.Name || len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != sa.Name {
		t.Errorf("%s binds %+v to %+v, want %s to the ServiceAccount %s", b.Name, b.RoleRef, b.Subjects, auth.Name, sa.Name)
	}
	if len(reader.Rules) != 1 || !slices.Equal(reader.Rules[0].NonResourceURLs, []string{"/metrics"}) || !slices.Equal(reader.Rules[0].Verbs, []string{"get"}) {
		t.Errorf("%s rules %+v, want GET /metrics alone", reader.Name, reader.Rules)
	}
	for _, f := range []string{"metrics_auth_role.yaml", "metrics_auth_role_binding.yaml", "metrics_reader_role.yaml"} {
		if !slices.Contains(kustomized(t, "rbac"), filepath.Join("rbac", f)) {
			t.Errorf("config/rbac/kustomization.yaml does not apply %s", f)
		}
	}
}

// The NetworkPolicy samples select the manager's pods and the gateway's, and admit, on
// ports their containers name, crawlers to discovery (the gateway's proxy and SOCKS5
// ports) and Prometheus to metrics, nothing else.
func TestNetworkPolicySample(t *testing.T) {
	deps, _ := workloads(t)
	files := kustomized(t, "network-policy")
	if len(files) != 2 {
		t.Fatalf("config/network-policy applies %v, want two NetworkPolicies", files)
	}
	want := map[string][]string{managerDeployment: {"discovery", "metrics"}, gatewayDeployment: {"metrics", "proxy", "socks"}}
	covered := map[string]bool{}
	for _, f := range files {
		var np networkingv1.NetworkPolicy
		decodeStrict(t, f, documents(t, f)[0], &np)
		var who string
		var pod corev1.PodTemplateSpec
		for name, d := range deps {
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				if who != "" {
					t.Errorf("%s selects the pods of both %s and %s", f, who, name)
				}
				who, pod = name, d.Spec.Template
			}
		}
		if who == "" {
			t.Errorf("%s selects %v, the pods of no Deployment", f, np.Spec.PodSelector.MatchLabels)
			continue
		}
		covered[who] = true
		if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
			t.Errorf("%s: policy types %v, want Ingress", f, np.Spec.PolicyTypes)
		}
		ports := map[string]bool{}
		for _, p := range pod.Spec.Containers[0].Ports {
			ports[p.Name] = true
		}
		var admitted []string
		for _, r := range np.Spec.Ingress {
			if len(r.From) == 0 || len(r.Ports) == 0 {
				t.Errorf("%s: an ingress rule %+v admits every source or every port", f, r)
			}
			for _, p := range r.Ports {
				if p.Port == nil || !ports[p.Port.StrVal] {
					t.Errorf("%s admits port %v, not a port %s's container names (%v)", f, p.Port, who, ports)
					continue
				}
				admitted = append(admitted, p.Port.StrVal)
			}
		}
		slices.Sort(admitted)
		if !slices.Equal(admitted, want[who]) {
			t.Errorf("%s admits %v to %s, want %v alone", f, admitted, who, want[who])
		}
	}
	if len(covered) != 2 {
		t.Errorf("the policies cover %v, want the manager and the gateway", covered)
	}
	var k, dk struct{ Namespace, NamePrefix string }
	decodeStrict(t, "network-policy/kustomization.yaml", mustRead(t, "network-policy/kustomization.yaml"), &struct {
		Namespace, NamePrefix string
		Resources             []string
	}{})
	for f, into := range map[string]any{"network-policy/kustomization.yaml": &k, "default/kustomization.yaml": &dk} {
		if err := yaml.Unmarshal(mustRead(t, f), into); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	if k != dk {
		t.Errorf("the policy goes into namespace %q with prefix %q, config/default installs into %q with %q", k.Namespace, k.NamePrefix, dk.Namespace, dk.NamePrefix)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(b)
}
