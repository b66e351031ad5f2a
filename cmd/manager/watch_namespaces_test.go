package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/autoscaler"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

const chartDir = "../../charts/egress-proxies-operator"

// helmBinary is $HELM, else helm in $KUBEBUILDER_ASSETS; missing, the test is skipped, or
// fails under testenv.RequireVar.
func helmBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("HELM"); p != "" {
		return p
	}
	if p := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "helm"); os.Getenv("KUBEBUILDER_ASSETS") != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	msg := "no helm: set HELM=$(hack/helm.sh)"
	if v := os.Getenv(testenv.RequireVar); v != "" && v != "0" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// chartRBAC renders the chart's RBAC, named epo-*, in releaseNS with watchNamespaces
// set to watched: its ClusterRoles, Roles and their bindings.
func chartRBAC(t *testing.T, releaseNS string, watched ...string) []client.Object {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(helmBinary(t), "template", "epo", chartDir, "--namespace", releaseNS,
		"--set", "watchNamespaces={"+strings.Join(watched, ",")+"}", "--set", "installId=watch-test", "--set", "fullnameOverride=epo",
		"--show-only", "templates/rbac.yaml", "--show-only", "templates/rbac-namespaced.yaml")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v: %s", err, stderr.String())
	}
	var objs []client.Object
	for _, doc := range regexp.MustCompile(`(?m)^---$`).Split(string(out), -1) {
		var kind struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &kind); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		var o client.Object
		switch kind.Kind {
		case "ClusterRole":
			o = &rbacv1.ClusterRole{}
		case "ClusterRoleBinding":
			o = &rbacv1.ClusterRoleBinding{}
		case "Role":
			o = &rbacv1.Role{}
		case "RoleBinding":
			o = &rbacv1.RoleBinding{}
		case "":
			continue
		default:
			t.Fatalf("the chart's RBAC templates render a %s", kind.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), o); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		objs = append(objs, o)
	}
	return objs
}

// checkRuleScopes fails the test for every resource of the manager's Roles that the API
// server does not serve as namespaced, and of its ClusterRole that it serves as
// namespaced: the chart's list of cluster-scoped resources (epo.clusterScoped) is wrong.
// KEDA's ScaledObjects, which the API server serves only with KEDA installed, are skipped
// when it does not.
func checkRuleScopes(t *testing.T, mapper meta.RESTMapper, objs []client.Object) {
	t.Helper()
	check := func(what string, rules []rbacv1.PolicyRule, wantScope meta.RESTScopeName) {
		for _, r := range rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					gvr := schema.GroupVersionResource{Group: g, Resource: strings.SplitN(res, "/", 2)[0]}
					kinds, err := mapper.KindsFor(gvr)
					if g == autoscaler.ScaledObjectGVK.Group && (err != nil || len(kinds) == 0) {
						continue // KEDA's CRD, read only where it is installed: namespaced
					}
					if err != nil || len(kinds) == 0 {
						t.Errorf("%s: %s.%s is not served by the API server: %v", what, res, g, err)
						continue
					}
					m, err := mapper.RESTMapping(kinds[0].GroupKind(), kinds[0].Version)
					if err != nil {
						t.Errorf("%s: %s.%s: %v", what, res, g, err)
						continue
					}
					if m.Scope.Name() != wantScope {
						t.Errorf("%s grants %s.%s, which is %s-scoped: fix epo.clusterScoped in templates/rbac-namespaced.yaml", what, res, g, m.Scope.Name())
					}
				}
			}
		}
	}
	for _, o := range objs {
		switch o := o.(type) {
		case *rbacv1.Role:
			check("Role "+o.Namespace+"/"+o.Name, o.Rules, meta.RESTScopeNameNamespace)
		case *rbacv1.ClusterRole:
			if strings.HasSuffix(o.Name, "-manager-role") {
				check("ClusterRole "+o.Name, o.Rules, meta.RESTScopeNameRoot)
			}
		}
	}
}

// impersonating is kubeconfig with every user impersonating the ServiceAccount ns/name.
func impersonating(t *testing.T, kubeconfig []byte, ns, name string) []byte {
	t.Helper()
	cfg, err := clientcmd.Load(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = "system:serviceaccount:" + ns + ":" + name
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	out, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// With --watch-namespaces the manager needs no cluster-wide access to Secrets or
// Proxies: running as a ServiceAccount that holds only what the chart renders for
// watchNamespaces (a Role in the watched namespace, the ClusterRole's cluster-scoped
// rules, the leader election Role, which also covers the demand Leases in the release
// namespace, --demand-namespace), its caches sync without a forbidden list or watch,
// it runs a Proxy with basic auth in the watched namespace on a (fake) GCE instance,
// copying its Secret, and it never sees a Proxy of another namespace.
func TestManagerWatchesOnlyItsNamespacesWithRoles(t *testing.T) {
	t.Parallel()
	env := testenv.StartT(t)
	c := env.Client
	ctx := testenv.Context(t)
	releaseNS, watched, other := env.Namespace(t, ctx, "epo-system"), env.Namespace(t, ctx, "team-a"), env.Namespace(t, ctx, "team-b")

	rbac := chartRBAC(t, releaseNS, watched)
	checkRuleScopes(t, c.RESTMapper(), rbac)
	for _, o := range rbac {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}

	fp, fake, providers := gceFake(t)
	probe := freeAddr(t)
	mgr := startManagerWith(t, impersonating(t, env.KubeConfig, releaseNS, "epo-controller-manager"),
		"--providers-config", providers, "--watch-namespaces", watched, "--install-id", "watch-test",
		"--health-probe-bind-address", probe, "--metrics-bind-address", "0", "--discovery-bind-address", freeAddr(t),
		"--leader-elect", "--leader-election-namespace", releaseNS, "--demand-namespace", releaseNS,
		"--proxy-check-interval", "1s", "--provider-check-interval", "1s", "--provider-check-timeout", "2s")

	spec := func(port int32) v1alpha1.ProxySpec {
		return v1alpha1.ProxySpec{Provider: "gcp-eu", Port: port,
			Placement: v1alpha1.ProxyPlacement{Region: "europe-west1", Zone: "europe-west1-b", MachineType: "small", Image: "ubuntu-2404"},
			Proxy: &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"},
				BasicAuth: &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "crawler-auth"}}}}
	}
	var mine, theirs *v1alpha1.Proxy
	for _, ns := range []string{watched, other} {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "crawler-auth", Namespace: ns,
			Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}},
			StringData: map[string]string{"username": "crawler", "password": "s3cret-" + ns}}
		px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "edge", Namespace: ns}, Spec: spec(fp.Port)}
		for _, o := range []client.Object{sec, px} {
			if err := c.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
		if ns == watched {
			mine = px
		} else {
			theirs = px
		}
	}

	got := &v1alpha1.Proxy{}
	mgr.waitUntil("the watched namespace's Proxy to run on a gce instance, with its credentials copied", func() (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(mine), got); err != nil {
			return false, err
		}
		return strings.HasPrefix(got.Status.ProviderID, "gce://") && got.Status.IP == fp.Host && got.Status.CredentialsSecret != "",
			fmt.Errorf("providerID %q, ip %q, credentialsSecret %q, phase %s, message %q",
				got.Status.ProviderID, got.Status.IP, got.Status.CredentialsSecret, got.Status.Phase, got.Status.Message)
	})
	mgr.waitUntil("/readyz to answer 200", func() (bool, error) {
		code, body, err := get("http://" + probe + "/readyz")
		return err == nil && code == 200, fmt.Errorf("%d %v %s", code, err, body)
	})
	// The other namespace's Proxy, created before the watched one was reconciled, is
	// left as it was: no status, no finalizer, no instance.
	time.Sleep(2 * time.Second)
	if err := c.Get(ctx, client.ObjectKeyFromObject(theirs), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != "" || len(got.Finalizers) != 0 || got.Status.ProviderID != "" {
		t.Errorf("the Proxy in %s, not watched, was reconciled: phase %q, finalizers %v, providerID %q", other, got.Status.Phase, got.Finalizers, got.Status.ProviderID)
	}
	if n := fake.Instances(); n != 1 {
		t.Errorf("%d instances in the fake, want the watched Proxy's alone", n)
	}
	if logs := mgr.stderr.String(); strings.Contains(logs, "forbidden") {
		t.Errorf("the manager was refused something with only the chart's Roles:\n%s", logs)
	}
	mgr.stop()
}
