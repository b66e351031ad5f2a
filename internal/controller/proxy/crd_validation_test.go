package proxy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/manifest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
)

// The CRD's schema and CEL rules, as the API server applies them to what a user applies.
func TestProxyValidation(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	for _, tc := range []struct {
		name string
		spec v1alpha1.ProxySpec
		want string // "" = accepted
	}{
		{"managed with provider", v1alpha1.ProxySpec{Provider: "kvm2-home"}, ""},
		{"managed without provider", v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeManaged}, "spec.provider is required when mode is Managed"},
		{"mode defaults to Managed", v1alpha1.ProxySpec{}, "spec.provider is required when mode is Managed"},
		{"unknown mode", v1alpha1.ProxySpec{Mode: "Cloud", Provider: "x"}, `Unsupported value: "Cloud"`},
		{"port too high", v1alpha1.ProxySpec{Provider: "x", Port: 70000}, "spec.port: Invalid value: 70000: spec.port in body should be less than or equal to 65535"},
		{"port negative", v1alpha1.ProxySpec{Provider: "x", Port: -1}, "should be greater than or equal to 1"},
		{"external without address", v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal}, "spec.address is required when mode is External"},
		{"external with host name", v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "squid.example.net"}, ""},
		{"external with IPv6", v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "2001:db8::7"}, ""},
		{"external with a port", v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "192.0.2.7:3128"}, "spec.address must be a host name or an IP address, without a port"},
		{"external with a URL", v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "http://squid"}, "without a port or scheme"},
	} {
		t.Run(tc.name, func(t *testing.T) { controllertest.CheckAdmission(t, ctx, shared.Client(t), tc.spec, tc.want) })
	}
}

func TestProxyDefaultsAndImmutableProvider(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	px := testbuild.Proxy("default", "defaults", testbuild.WithProvider("kvm2-home"))
	if err := shared.Client(t).Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shared.Client(t).Delete(ctx, px) })
	if px.Spec.Mode != v1alpha1.ProxyModeManaged || px.Spec.Port != 3128 {
		t.Errorf("mode %q port %d, want the defaults Managed and 3128", px.Spec.Mode, px.Spec.Port)
	}
	px.Spec.Provider = "gcp-europe"
	err := shared.Client(t).Update(ctx, px)
	if err == nil || !strings.Contains(err.Error(), "spec.provider is immutable") {
		t.Errorf("changing spec.provider: %v, want it refused as immutable", err)
	}
	// Other fields stay mutable.
	px.Spec.Provider = "kvm2-home"
	px.Spec.Placement.Zone = "nuc"
	if err := shared.Client(t).Update(ctx, px); err != nil {
		t.Errorf("changing placement: %v", err)
	}
}

func TestSamplesAreAccepted(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	files, _ := filepath.Glob(filepath.Join("..", "..", "..", "config", "samples", "proxy_*.yaml"))
	if len(files) == 0 {
		t.Fatal("no proxy samples in config/samples")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// A sample is a Proxy, with the Secret its spec.proxy.basicAuth names before it.
		objs, err := manifest.Decode(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		proxies := 0
		for i, obj := range objs {
			if _, ok := obj.(*v1alpha1.Proxy); ok {
				proxies++
			}
			obj.SetNamespace("default")
			if err := shared.Client(t).Create(ctx, obj, client.DryRunAll); err != nil {
				t.Errorf("%s object %d: %v", f, i+1, err)
			}
		}
		if proxies != 1 {
			t.Errorf("%s: %d Proxies, want one", f, proxies)
		}
	}
}

func TestProviderHealthIsClusterScoped(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	ph := &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: "kvm2-home"}}
	if err := shared.Client(t).Create(ctx, ph, client.DryRunAll); err != nil {
		t.Fatalf("creating a cluster-scoped ProviderHealth: %v", err)
	}
}
