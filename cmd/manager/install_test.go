package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// TestResolveInstallID: the flag wins without a read; otherwise kube-system's UID; a
// read that fails names the namespace and the way out.
func TestResolveInstallID(t *testing.T) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system", UID: types.UID("9f1c2a4e-0b7d-4e3a-8c6f-5d2e1a0b9c8d")}}
	reads := 0
	c := interceptor.NewClient(fake.NewClientBuilder().WithObjects(ns).Build(), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			reads++
			return c.Get(ctx, key, obj, opts...)
		},
	})
	id, source, err := resolveInstallID(t.Context(), c, "staging")
	if err != nil || id != "staging" || source != "--install-id" || reads != 0 {
		t.Fatalf("with the flag: %q %q %v after %d reads", id, source, err, reads)
	}
	id, source, err = resolveInstallID(t.Context(), c, "")
	if err != nil || id != string(ns.UID) || source != "namespace kube-system UID" {
		t.Fatalf("default: %q %q %v", id, source, err)
	}

	forbidden := interceptor.NewClient(fake.NewClientBuilder().Build(), interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "kube-system", fmt.Errorf("no get"))
		},
	})
	_, _, err = resolveInstallID(t.Context(), forbidden, "")
	want := "reading the UID of namespace kube-system, the default --install-id: "
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), "(set --install-id, or grant get on namespaces)") ||
		!apierrors.IsForbidden(err) {
		t.Fatalf("forbidden: %v, want it to start %q, wrap the API error and say what to do", err, want)
	}
}

// TestManagerInstallID: the manager binary against a real API server takes its install
// identity from kube-system's UID by default, and from --install-id when given.
func TestManagerInstallID(t *testing.T) {
	t.Parallel()
	env := testenv.StartT(t)
	ns := &corev1.Namespace{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: "kube-system"}, ns); err != nil {
		t.Fatal(err)
	}
	if ns.UID == "" {
		t.Fatal("kube-system has no UID")
	}
	providers := writeFile(t, "providers.yaml", fmt.Sprintf(goodConfig, t.TempDir()))
	for _, c := range []struct {
		name       string
		flags      []string
		id, source string
	}{
		{"default", nil, string(ns.UID), "namespace kube-system UID"},
		{"flag", []string{"--install-id", "homelab-staging"}, "homelab-staging", "--install-id"},
	} {
		t.Run(c.name, func(t *testing.T) {
			mgr := startManager(t, env, append([]string{"--providers-config", providers,
				"--health-probe-bind-address", freeAddr(t), "--metrics-bind-address", "0", "--discovery-bind-address", "0"}, c.flags...)...)
			mgr.waitUntil("the manager to start", func() (bool, error) {
				return strings.Contains(mgr.stderr.String(), `"starting manager"`), errors.New("no starting manager line yet")
			})
			line := logLine(t, mgr.stderr.String(), "install identity")
			if line["installID"] != c.id || line["source"] != c.source {
				t.Fatalf("install identity line %v, want installID %q from %q", line, c.id, c.source)
			}
			mgr.stop()
		})
	}
}

// logLine returns the first JSON log line whose msg is msg, decoded.
func logLine(t *testing.T, out, msg string) map[string]any {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg {
			return m
		}
	}
	t.Fatalf("no %q line in:\n%s", msg, out)
	return nil
}
