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

func TestDecodeErrors(t *testing.T) {
	for doc, want := range map[string]string{
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n": `document 1: kind "ConfigMap"; want a Proxy or a Secret`,
		"# nothing\n---\n# still nothing\n":                      "no Proxy or Secret in it",
		"kind: Secret\n---\nkind: Proxy\nspec: {bogus: 1}\n":     `document 2 (Proxy)`,
		"kind: [\n": "document 1: ",
	} {
		if _, err := Decode([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", doc, err, want)
		}
	}
}
