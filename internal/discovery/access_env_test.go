package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/yaml"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/access"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// shippedRole reads a ClusterRole of config/rbac, named uniquely for the test.
func shippedRole(t *testing.T, file, name string) *rbacv1.ClusterRole {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "config", "rbac", file))
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(b, role); err != nil {
		t.Fatalf("config/rbac/%s: %v", file, err)
	}
	role.Name = name
	return role
}

// Two crawlers, each with the shipped crawler role bound in its own namespace (and the
// first with the credentials role too), against a real API server's TokenReview and
// RBAC: each sees and reports on its own namespace's proxies alone.
func TestKubernetesIdentitiesAgainstRBAC(t *testing.T) {
	ctx := testContext(t)
	env := shared.Env(t)
	c := env.Client
	nsA, nsB := newNamespace(t, ctx), newNamespace(t, ctx)
	createProxies(t, ctx, nsA, []proxySpec{{name: "a1", ip: "10.9.0.1", phase: v1alpha1.PhaseReady, healthy: true}})
	createProxies(t, ctx, nsB, []proxySpec{{name: "b1", ip: "10.9.0.2", phase: v1alpha1.PhaseReady, healthy: true}})

	crawler, creds := shippedRole(t, "crawler_role.yaml", nsA+"-crawler"), shippedRole(t, "credentials_role.yaml", nsA+"-credentials")
	for _, r := range []*rbacv1.ClusterRole{crawler, creds} {
		if err := c.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), r) })
	}
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	token := map[string]string{}
	bind := func(ns, role string) {
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: role},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "crawler"}}}
		if err := c.Create(ctx, rb); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []string{nsA, nsB} {
		if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "crawler"}}); err != nil {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "crawler", &authnv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("a token of %s/crawler: %v", ns, err)
		}
		token[ns] = tr.Status.Token
		bind(ns, crawler.Name)
	}
	bind(nsA, creds.Name)

	src := cacheSource(t, ctx, nsA, func(o *ctrl.Options) {
		o.Cache.DefaultNamespaces = map[string]cache.Config{nsA: {}, nsB: {}}
	})
	waitFor2 := func() (bool, error) {
		s, err := src.Snapshot(ctx)
		return err == nil && s.Len() == 2, err
	}
	testenv.WaitFor(t, waitLong, "both proxies in the cache", waitFor2)
	sk := &sink{}
	h := newTestServer(t, src, Options{Access: access.New(access.ClientReviewer{Client: c}, access.Options{}), Feedback: sk}).Handler()
	as := func(ns string) []string { return []string{"Authorization", "Bearer " + token[ns]} }
	other := map[string]string{nsA: nsB, nsB: nsA}
	for _, ns := range []string{nsA, nsB} {
		own := ns + "/" + map[string]string{nsA: "a1", nsB: "b1"}[ns]
		for _, target := range []string{"/v1/proxies", "/v1/proxies?namespace=" + ns} {
			if res, body := get(t, h, target, as(ns)...); res.StatusCode != 200 || names(decodeList(t, body)) != own {
				t.Errorf("%s as %s: %d %s; want %s alone", target, ns, res.StatusCode, body, own)
			}
		}
		for i := 0; i < 10; i++ {
			res, body := get(t, h, fmt.Sprintf("/v1/proxies/pick?key=k%d", i), as(ns)...)
			var e Entry
			_ = json.Unmarshal([]byte(body), &e)
			if res.StatusCode != 200 || e.Namespace+"/"+e.Name != own {
				t.Errorf("pick k%d as %s: %d %s; want %s", i, ns, res.StatusCode, body, own)
			}
		}
		res, body := get(t, h, "/v1/proxies?namespace="+other[ns], as(ns)...)
		want := fmt.Sprintf(`cannot list resource \"proxies\" in API group \"egress.hrajfrisbee.cz\" in the namespace \"%s\"`, other[ns])
		if res.StatusCode != http.StatusForbidden || !strings.Contains(body, want) || !strings.Contains(body, "system:serviceaccount:"+ns+":crawler") {
			t.Errorf("the other namespace as %s: %d %s", ns, res.StatusCode, body)
		}
	}
	// Credentials: with the credentials role only.
	if res, body := get(t, h, "/v1/proxies?namespace="+nsA+"&credentials=true", as(nsA)...); res.StatusCode != 200 || names(decodeList(t, body)) != nsA+"/a1" {
		t.Errorf("credentials with the role: %d %s", res.StatusCode, body)
	}
	if res, body := get(t, h, "/v1/proxies/pick?key=k&namespace="+nsB+"&credentials=true", as(nsB)...); res.StatusCode != http.StatusForbidden ||
		!strings.Contains(body, `cannot get resource \"proxies/credentials\"`) {
		t.Errorf("credentials without the role: %d %s", res.StatusCode, body)
	}
	if res, body := get(t, h, "/v1/proxies?credentials=true", as(nsB)...); res.StatusCode != 200 || decodeList(t, body).Count != 0 {
		t.Errorf("credentials without namespace and without the role: %d %s; want none", res.StatusCode, body)
	}

	// Nothing changes state on a refusal: the other namespace's report is rejected and
	// not recorded, the refused requests wrote nothing.
	before := &v1alpha1.Proxy{}
	if err := c.Get(ctx, keyOf(nsB, "b1"), before); err != nil {
		t.Fatal(err)
	}
	res, body := post(t, h, "/v1/feedback", fmt.Sprintf(`{"reports":[{"proxy":"%s/a1","domain":"example.com","outcome":"banned"},{"proxy":"%s/b1","domain":"example.com","outcome":"banned"}]}`, nsA, nsB), as(nsA)...)
	var ans feedbackAnswer
	_ = json.Unmarshal([]byte(body), &ans)
	if res.StatusCode != 200 || ans.Accepted != 1 || len(ans.Rejected) != 1 || ans.Rejected[0].Index != 1 ||
		!strings.Contains(ans.Rejected[0].Error, fmt.Sprintf(`cannot create resource "proxies/feedback" in API group "egress.hrajfrisbee.cz" in the namespace "%s"`, nsB)) {
		t.Errorf("feedback on both namespaces as %s: %d %s", nsA, res.StatusCode, body)
	}
	if len(sk.got) != 1 || !strings.HasPrefix(sk.got[0], nsA+"/a1 ") {
		t.Errorf("recorded %v; want %s/a1's report alone", sk.got, nsA)
	}
	after := &v1alpha1.Proxy{}
	if err := c.Get(ctx, keyOf(nsB, "b1"), after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("%s/b1 was written on a refusal: resourceVersion %s → %s", nsB, before.ResourceVersion, after.ResourceVersion)
	}
	// An unknown token: 401.
	if res, body := get(t, h, "/v1/proxies", "Authorization", "Bearer not-a-kubernetes-token"); res.StatusCode != http.StatusUnauthorized || res.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("an unknown token: %d %s", res.StatusCode, body)
	}
}
