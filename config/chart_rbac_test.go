package config_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// grant is one (API group, resource, verb) or (non-resource URL, verb) a rule gives.
type grant struct{ group, resource, verb string }

func (g grant) String() string { return fmt.Sprintf("%s %s/%s", g.verb, g.group, g.resource) }

// grantsOf flattens rules into the set of single grants they give.
func grantsOf(rules []rbacv1.PolicyRule) map[grant]bool {
	out := map[grant]bool{}
	for _, r := range rules {
		for _, v := range r.Verbs {
			for _, u := range r.NonResourceURLs {
				out[grant{"nonResourceURL", u, v}] = true
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					out[grant{g, res, v}] = true
				}
			}
		}
	}
	return out
}

func sortedGrants(set map[grant]bool) []string {
	var out []string
	for g := range set {
		out = append(out, g.String())
	}
	slices.Sort(out)
	return out
}

// decodeAs turns one of objects' maps into a typed object.
func decodeAs(t *testing.T, o map[string]any, into any) {
	t.Helper()
	data, err := yaml.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
}

// With watchNamespaces the manager's access to Secrets, Proxies and every other
// namespaced object comes from a Role in each listed namespace, and its ClusterRole keeps
// the cluster-scoped rest; together they grant exactly what the +kubebuilder:rbac markers
// ask for (config/rbac/role.yaml), so a marker added later is placed by the chart or this
// test fails.
func TestChartWatchNamespacesSplitsTheManagerRole(t *testing.T) {
	watched := []string{"team-a", "team-b"}
	out, err := renderChart(t, "--set", "watchNamespaces={"+strings.Join(watched, ",")+"}", "--set", "installId=team-ab")
	if err != nil {
		t.Fatal(err)
	}
	got := objects(t, "helm template", out)
	var generated rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(mustRead(t, "rbac/role.yaml"), &generated); err != nil {
		t.Fatal(err)
	}
	want := grantsOf(generated.Rules)

	crKey := "ClusterRole <nil>/" + releaseName + "-manager-role"
	if _, ok := got[crKey]; !ok {
		t.Fatalf("no %s", crKey)
	}
	var cr rbacv1.ClusterRole
	decodeAs(t, got[crKey], &cr)
	clusterGrants := grantsOf(cr.Rules)
	// (a) Nothing about Secrets or Proxies (nor their subresources) cluster-wide.
	for g := range clusterGrants {
		base := strings.SplitN(g.resource, "/", 2)[0]
		if base == "secrets" || base == "proxies" || base == "proxypools" || base == "*" {
			t.Errorf("the ClusterRole grants %s with watchNamespaces set", g)
		}
	}

	// (c) Each listed namespace has the Role, bound to the manager's ServiceAccount, and
	// every Role grants the same.
	var roleGrants map[grant]bool
	for _, ns := range watched {
		roleKey := fmt.Sprintf("Role %s/%s-manager-role", ns, releaseName)
		bindingKey := fmt.Sprintf("RoleBinding %s/%s-manager-rolebinding", ns, releaseName)
		if got[roleKey] == nil || got[bindingKey] == nil {
			t.Errorf("namespace %s: want %s and %s", ns, roleKey, bindingKey)
			continue
		}
		var role rbacv1.Role
		decodeAs(t, got[roleKey], &role)
		g := grantsOf(role.Rules)
		if roleGrants == nil {
			roleGrants = g
		} else if !slices.Equal(sortedGrants(g), sortedGrants(roleGrants)) {
			t.Errorf("the Role in %s grants %v, the one in %s %v", ns, sortedGrants(g), watched[0], sortedGrants(roleGrants))
		}
		var rb rbacv1.RoleBinding
		decodeAs(t, got[bindingKey], &rb)
		sa := rbacv1.Subject{Kind: "ServiceAccount", Name: releaseName + "-controller-manager", Namespace: releaseNS}
		if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name || !slices.Equal(rb.Subjects, []rbacv1.Subject{sa}) {
			t.Errorf("%s binds %+v to %+v, want the Role %s to %+v", bindingKey, rb.RoleRef, rb.Subjects, role.Name, sa)
		}
	}
	for key := range got {
		if strings.HasPrefix(key, "Role ") && strings.HasSuffix(key, "-manager-role") &&
			!slices.ContainsFunc(watched, func(ns string) bool { return strings.HasPrefix(key, "Role "+ns+"/") }) {
			t.Errorf("%s: a manager Role in a namespace not listed", key)
		}
	}
	for _, res := range []string{"secrets", "proxies", "proxypools", "proxies/status", "events"} {
		if !slices.ContainsFunc(sortedGrants(roleGrants), func(g string) bool { return strings.HasSuffix(g, "/"+res) }) {
			t.Errorf("the Roles grant nothing on %s", res)
		}
	}

	// (b) The Roles and the ClusterRole together grant what the markers ask, no more, no less,
	// and no grant is given twice (once cluster-wide, once per namespace).
	union := map[grant]bool{}
	for g := range clusterGrants {
		union[g] = true
		if roleGrants[g] {
			t.Errorf("%s is granted both by the ClusterRole and by the Roles", g)
		}
	}
	for g := range roleGrants {
		union[g] = true
	}
	if w, u := sortedGrants(want), sortedGrants(union); !slices.Equal(w, u) {
		t.Errorf("the ClusterRole and the Roles grant\n%s\nconfig/rbac/role.yaml\n%s", strings.Join(u, "\n"), strings.Join(w, "\n"))
	}

	d := got["Deployment "+releaseNS+"/"+releaseName+"-controller-manager"]
	js, _ := yaml.Marshal(d)
	if !strings.Contains(string(js), "--watch-namespaces=team-a,team-b") {
		t.Errorf("the Deployment does not pass --watch-namespaces=team-a,team-b:\n%s", js)
	}
}

// Without watchNamespaces there is no manager Role and no --watch-namespaces: the
// ClusterRole (TestChartRendersConfigDefault) grants everything cluster-wide.
func TestChartDefaultWatchesEveryNamespace(t *testing.T) {
	out, err := renderChart(t)
	if err != nil {
		t.Fatal(err)
	}
	for key := range objects(t, "helm template", out) {
		if strings.HasPrefix(key, "Role ") && strings.HasSuffix(key, "-manager-role") {
			t.Errorf("the default renders %s", key)
		}
	}
	if strings.Contains(string(out), "--watch-namespaces") {
		t.Error("the default passes --watch-namespaces")
	}
}

// Namespace names that are not DNS-1123 labels, or repeat, are refused by the schema.
func TestChartSchemaRefusesBadWatchNamespaces(t *testing.T) {
	for _, set := range []string{"watchNamespaces={Team-A}", "watchNamespaces={team-a,team-a}", "watchNamespaces={team_a}", "watchNamespaces=team-a"} {
		out, err := renderChart(t, "--set", set, "--set", "installId=team-ab")
		if err == nil {
			t.Errorf("helm template accepted %s:\n%.400s", set, out)
			continue
		}
		if !strings.Contains(err.Error(), "/watchNamespaces") {
			t.Errorf("%s: the error does not name /watchNamespaces:\n%v", set, err)
		}
	}
}

// watchNamespaces without installId fails the render, naming both values: the default
// install id is shared by every install of the cluster, and a narrowed install's orphan
// GC would delete the instances of Proxies in the namespaces it does not see.
func TestChartWatchNamespacesNeedAnInstallID(t *testing.T) {
	out, err := renderChart(t, "--set", "watchNamespaces={team-a}")
	if err == nil {
		t.Fatalf("helm template accepted watchNamespaces without installId:\n%.400s", out)
	}
	if !strings.Contains(err.Error(), "watchNamespaces needs installId") {
		t.Errorf("the error does not name watchNamespaces and installId:\n%v", err)
	}
	out, err = renderChart(t, "--set", "watchNamespaces={team-a}", "--set", "installId=team-a")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "--install-id=team-a") {
		t.Errorf("the Deployment does not pass --install-id=team-a:\n%.2000s", out)
	}
}
