package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

func TestDecodeTheSample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "proxy_kvm2.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("%d objects, want the Secret and the Proxy", len(objs))
	}
	sec, ok1 := objs[0].(*corev1.Secret)
	px, ok2 := objs[1].(*v1alpha1.Proxy)
	if !ok1 || !ok2 || px.Spec.Proxy == nil || px.Spec.Proxy.BasicAuth == nil ||
		string(px.Spec.Proxy.BasicAuth.SecretRef.Name) != sec.Name || sec.StringData["password"] == "" {
		t.Fatalf("objects %T %T: want a Secret and a Proxy naming it in spec.proxy.basicAuth", objs[0], objs[1])
	}
}

// The pool sample holds the Secret its template names, opted in as a credentials Secret.
func TestDecodeThePoolSample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "proxypool.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("%d objects, want the Secret and the ProxyPool", len(objs))
	}
	sec, ok1 := objs[0].(*corev1.Secret)
	pool, ok2 := objs[1].(*v1alpha1.ProxyPool)
	if !ok1 || !ok2 {
		t.Fatalf("objects %T %T: want a Secret and a ProxyPool", objs[0], objs[1])
	}
	if p := pool.Spec.Template.Spec.Proxy; p == nil || p.BasicAuth == nil || string(p.BasicAuth.SecretRef.Name) != sec.Name {
		t.Fatalf("the pool's template does not name the Secret %s in spec.proxy.basicAuth", sec.Name)
	}
	if sec.Labels[v1alpha1.CredentialsLabel] != "true" || sec.StringData["password"] == "" {
		t.Fatalf("the Secret %s: labels %v, want %s: \"true\" and a password", sec.Name, sec.Labels, v1alpha1.CredentialsLabel)
	}
}

func TestDecodeErrors(t *testing.T) {
	for doc, want := range map[string]string{
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n": `document 1: kind "ConfigMap"; want a Proxy, a ProxyPool or a Secret`,
		"# nothing\n---\n# still nothing\n":                      "no Proxy, ProxyPool or Secret in it",
		"kind: Secret\n---\nkind: Proxy\nspec: {bogus: 1}\n":     `document 2 (Proxy)`,
		"kind: [\n": "document 1: ",
	} {
		if _, err := Decode([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", doc, err, want)
		}
	}
}
