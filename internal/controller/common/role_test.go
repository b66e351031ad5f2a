package common

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// writeVerbs are the verbs that change an object.
var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection", "*"}

func readRBAC(t *testing.T, file string, into any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "rbac", file))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

func covers(r rbacv1.PolicyRule, group, resource string) bool {
	return (slices.Contains(r.APIGroups, group) || slices.Contains(r.APIGroups, "*")) &&
		(slices.Contains(r.Resources, resource) || slices.Contains(r.Resources, "*"))
}

func grants(rules []rbacv1.PolicyRule, group, resource string, verbs ...string) []string {
	var found []string
	for _, r := range rules {
		if !covers(r, group, resource) {
			continue
		}
		for _, v := range r.Verbs {
			if slices.Contains(verbs, v) {
				found = append(found, v)
			}
		}
	}
	return found
}

// The generated ClusterRole (from the +kubebuilder:rbac markers) grants no write on
// Leases anywhere in the cluster: leader election's Lease is written through the
// namespaced Role, in the manager's own namespace only.
func TestClusterRoleWritesNoLeases(t *testing.T) {
	var role rbacv1.ClusterRole
	readRBAC(t, "role.yaml", &role)
	if role.Kind != "ClusterRole" || len(role.Rules) == 0 {
		t.Fatalf("role.yaml: kind %q with %d rules, want the manager's ClusterRole", role.Kind, len(role.Rules))
	}
	if v := grants(role.Rules, "coordination.k8s.io", "leases", writeVerbs...); len(v) > 0 {
		t.Errorf("the ClusterRole grants %v on leases cluster-wide", v)
	}
	if v := grants(role.Rules, "egress.hrajfrisbee.cz", "proxies", "deletecollection", "*"); len(v) > 0 {
		t.Errorf("the ClusterRole grants %v on proxies, which the manager never does", v)
	}
	// The ProxyPool controller creates and deletes its children; envtest runs as an
	// administrator, so only this check sees a marker that forgot it.
	for _, verb := range []string{"create", "delete"} {
		if len(grants(role.Rules, "egress.hrajfrisbee.cz", "proxies", verb)) == 0 {
			t.Errorf("the ClusterRole does not grant %s on proxies (a ProxyPool makes and removes its children)", verb)
		}
	}
	// Basic-auth Secrets are read through the cache (get, list, watch); the only ones
	// written are the credentials snapshots (create, update, delete), never patched,
	// never deleted by collection.
	for _, verb := range []string{"get", "list", "watch", "create", "update", "delete"} {
		if len(grants(role.Rules, "", "secrets", verb)) == 0 {
			t.Errorf("the ClusterRole does not grant %s on secrets (spec.proxy.basicAuth, its watch and the credentials snapshots)", verb)
		}
	}
	if v := grants(role.Rules, "", "secrets", "patch", "deletecollection", "*"); len(v) > 0 {
		t.Errorf("the ClusterRole grants %v on secrets, which the manager never does", v)
	}
	if v := grants(role.Rules, "", "namespaces", "get"); len(v) == 0 {
		t.Error("the ClusterRole cannot get namespaces (the default install ID is kube-system's UID)")
	}

	var le rbacv1.Role
	readRBAC(t, "leader_election_role.yaml", &le)
	for _, verb := range []string{"get", "create", "update"} {
		if len(grants(le.Rules, "coordination.k8s.io", "leases", verb)) == 0 {
			t.Errorf("the leader election Role does not grant %s on leases", verb)
		}
	}
}

// The demand Leases live in the manager's own namespace (--demand-namespace's default):
// the namespaced leader election Role grants there every verb discovery's demand reporter
// (get, create, update, patch by server-side apply) and the autoscaler (get, list, watch;
// delete for the GC of stale Leases) use on them, so that no ClusterRole needs Leases.
func TestLeaderElectionRoleCoversTheDemandLeases(t *testing.T) {
	var le rbacv1.Role
	readRBAC(t, "leader_election_role.yaml", &le)
	for _, verb := range []string{"get", "list", "watch", "create", "update", "patch", "delete"} {
		if len(grants(le.Rules, "coordination.k8s.io", "leases", verb)) == 0 {
			t.Errorf("the leader election Role does not grant %s on leases (the demand Leases in the manager's namespace)", verb)
		}
	}
	var role rbacv1.ClusterRole
	readRBAC(t, "role.yaml", &role)
	if v := grants(role.Rules, "coordination.k8s.io", "leases", "get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "*"); len(v) > 0 {
		t.Errorf("the ClusterRole grants %v on leases cluster-wide; the demand Leases are in the manager's namespace alone", v)
	}
}
