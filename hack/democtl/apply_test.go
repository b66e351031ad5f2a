package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/manifest"
)

// Applying the demo's sample twice creates, then updates, its Secret and its Proxy.
func TestApplyTheSample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "proxy_kvm2.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifest.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	sec, ok1 := objs[0].(*corev1.Secret) // internal/manifest checks the sample's shape
	px, ok2 := objs[len(objs)-1].(*v1alpha1.Proxy)
	if !ok1 || !ok2 {
		t.Fatalf("objects %T ... %T: want the Secret first and the Proxy last", objs[0], objs[len(objs)-1])
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

}
