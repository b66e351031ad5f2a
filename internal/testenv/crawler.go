package testenv

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// CrawlerToken is a TokenRequest token of the ServiceAccount "crawler" in ns, with the
// shipped crawler ClusterRole (config/rbac/crawler_role.yaml, as "<ns>-crawler") bound in
// ns alone: what a crawler Pod of ns holds. Everything it creates is deleted when the
// test ends.
func CrawlerToken(t testing.TB, ctx context.Context, e *Env, ns string) string {
	t.Helper()
	crds, err := CRDDir()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(crds, "..", "..", "rbac", "crawler_role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(b, role); err != nil {
		t.Fatalf("config/rbac/crawler_role.yaml: %v", err)
	}
	role.Name = ns + "-crawler"
	for _, o := range []client.Object{role,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "crawler"}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "crawler"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "crawler"}}},
	} {
		if err := e.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Client.Delete(context.Background(), o) })
	}
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "crawler", &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of %s/crawler: %v", ns, err)
	}
	return tr.Status.Token
}
