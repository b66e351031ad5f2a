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
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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
			if base == "kustomization.yaml" || base == "providers-config.yaml" {
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
	// (internal/controller/role_test.go checks both).
	for _, want := range []string{"proxies", "proxies/status", "proxies/finalizers", "providerhealths", "providerhealths/status", "events", "namespaces",
		"proxypools", "proxypools/status", "services", "endpointslices", "secrets"} {
		if !slices.Contains(resources, want) {
			t.Errorf("the manager role lacks %s", want)
		}
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
