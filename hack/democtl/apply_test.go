package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// The demo's sample decodes into its Secret and its Proxy, and applying them twice
// creates then updates both.
func TestApplyTheSample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "proxy_kvm2.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeManifest(data)
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

	c := newFakeClient()
	ctx := context.Background()
	for _, o := range objs {
		o.SetNamespace("default")
		if err := applyOne(ctx, c, o); err != nil {
			t.Fatal(err)
		}
	}
	sec.StringData["password"] = "rotated"
	px.Spec.Port = 8888
	for _, o := range []client.Object{sec, px} {
		o.SetResourceVersion("")
		if err := applyOne(ctx, c, o); err != nil {
			t.Fatalf("applying again: %v", err)
		}
	}
	var gotSec corev1.Secret
	var gotPx v1alpha1.Proxy
	if err := c.Get(ctx, client.ObjectKeyFromObject(sec), &gotSec); err != nil || gotSec.StringData["password"] != "rotated" {
		t.Errorf("secret after the second apply: %v %v", gotSec.StringData, err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(px), &gotPx); err != nil || gotPx.Spec.Port != 8888 {
		t.Errorf("proxy after the second apply: port %d %v", gotPx.Spec.Port, err)
	}

	for doc, want := range map[string]string{
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n": `kind "ConfigMap"`,
		"# nothing\n":                     "no Proxy or Secret",
		"kind: Proxy\nspec: {bogus: 1}\n": `document 1 (Proxy)`,
	} {
		if _, err := decodeManifest([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", doc, err, want)
		}
	}
}
