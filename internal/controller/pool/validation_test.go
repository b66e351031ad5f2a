package pool

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/manifest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// The ProxyPool CRD's schema and CEL rules, as the API server applies them.
func testPoolValidation(t *testing.T, env *testenv.Env) {
	ctx := testenv.Context(t)
	valid := func() v1alpha1.ProxyPoolSpec {
		return v1alpha1.ProxyPoolSpec{
			Replicas: ptr.To[int32](3),
			Template: v1alpha1.ProxyTemplate{Spec: v1alpha1.ProxySpec{Provider: "kvm2-home"}},
		}
	}
	is := func(v intstr.IntOrString) *intstr.IntOrString { return &v }
	for _, tc := range []struct {
		name   string
		mutate func(*v1alpha1.ProxyPoolSpec)
		want   string // "" = accepted
	}{
		{"valid", func(*v1alpha1.ProxyPoolSpec) {}, ""},
		{"zero replicas", func(s *v1alpha1.ProxyPoolSpec) { s.Replicas = ptr.To[int32](0) }, ""},
		{"negative replicas", func(s *v1alpha1.ProxyPoolSpec) { s.Replicas = ptr.To[int32](-1) }, "spec.replicas in body should be greater than or equal to 0"},
		{"surge and unavailable both 0", func(s *v1alpha1.ProxyPoolSpec) {
			s.Strategy.RollingUpdate = v1alpha1.PoolRollingUpdate{MaxSurge: is(intstr.FromInt32(0)), MaxUnavailable: is(intstr.FromInt32(0))}
		}, "maxSurge and maxUnavailable cannot both be 0"},
		{"surge and unavailable both 0%", func(s *v1alpha1.ProxyPoolSpec) {
			s.Strategy.RollingUpdate = v1alpha1.PoolRollingUpdate{MaxSurge: is(intstr.FromString("0%")), MaxUnavailable: is(intstr.FromInt32(0))}
		}, "maxSurge and maxUnavailable cannot both be 0"},
		{"surge 0 unavailable 1", func(s *v1alpha1.ProxyPoolSpec) {
			s.Strategy.RollingUpdate = v1alpha1.PoolRollingUpdate{MaxSurge: is(intstr.FromInt32(0)), MaxUnavailable: is(intstr.FromInt32(1))}
		}, ""},
		{"percentages", func(s *v1alpha1.ProxyPoolSpec) {
			s.Strategy.RollingUpdate = v1alpha1.PoolRollingUpdate{MaxSurge: is(intstr.FromString("25%")), MaxUnavailable: is(intstr.FromString("10%"))}
		}, ""},
		{"not a percentage", func(s *v1alpha1.ProxyPoolSpec) {
			s.Strategy.RollingUpdate.MaxSurge = is(intstr.FromString("many"))
		}, "maxSurge must be a non-negative number or a percentage"},
		{"negative unavailable", func(s *v1alpha1.ProxyPoolSpec) {
			s.Strategy.RollingUpdate.MaxUnavailable = is(intstr.FromInt32(-1))
		}, "maxUnavailable must be a non-negative number or a percentage"},
		{"wireguard exits without allowedSourceRanges", func(s *v1alpha1.ProxyPoolSpec) {
			s.Egress = &v1alpha1.PoolEgress{WireGuard: &v1alpha1.PoolWireGuard{SecretSelector: metav1.LabelSelector{MatchLabels: map[string]string{"exits": "news"}}}}
		}, "spec.egress.wireguard: Invalid value: needs spec.template.spec.proxy.allowedSourceRanges"},
		{"wireguard exits", func(s *v1alpha1.ProxyPoolSpec) {
			s.Egress = &v1alpha1.PoolEgress{WireGuard: &v1alpha1.PoolWireGuard{SecretSelector: metav1.LabelSelector{MatchLabels: map[string]string{"exits": "news"}}}}
			s.Template.Spec.Proxy = &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"}}
		}, ""},
		{"unknown deletion order", func(s *v1alpha1.ProxyPoolSpec) { s.Deletion.Order = "Youngest" }, `Unsupported value: "Youngest"`},
		{"zero maxAge", func(s *v1alpha1.ProxyPoolSpec) { s.Rotation.MaxAge = &metav1.Duration{} }, "rotation.maxAge must be a positive duration"},
		{"jitter over 100%", func(s *v1alpha1.ProxyPoolSpec) { s.Rotation.Jitter = "150%" }, "spec.rotation.jitter"},
		{"external template", func(s *v1alpha1.ProxyPoolSpec) {
			s.Template.Spec = v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "squid", Provider: "x"}
		}, "spec.template.spec.mode must be Managed"},
		{"no provider anywhere", func(s *v1alpha1.ProxyPoolSpec) {
			s.Template.Spec.Provider = ""
			s.Spread = []v1alpha1.PoolSpreadEntry{{Provider: "a"}, {Zone: "nuc"}}
		}, "spec.template.spec.provider is required unless every spread entry sets a provider"},
		{"providers from spread", func(s *v1alpha1.ProxyPoolSpec) {
			s.Template.Spec.Provider = ""
			s.Spread = []v1alpha1.PoolSpreadEntry{{Provider: "a"}, {Provider: "b", Zone: "nuc", Weight: 2}}
		}, ""},
		{"empty spread entry", func(s *v1alpha1.ProxyPoolSpec) { s.Spread = []v1alpha1.PoolSpreadEntry{{Weight: 2}} }, "a spread entry must set provider, zone or both"},
		{"zero weight", func(s *v1alpha1.ProxyPoolSpec) { s.Spread = []v1alpha1.PoolSpreadEntry{{Zone: "a", Weight: -1}} }, "weight in body should be greater than or equal to 1"},
		{"template open to anyone without basic auth", func(s *v1alpha1.ProxyPoolSpec) {
			s.Template.Spec.Proxy = &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"::/0"}}
		}, "spec.template.spec.proxy.allowedSourceRanges: Invalid value: holds 0.0.0.0/0 or ::/0 without basicAuth"},
		{"template open to anyone on purpose", func(s *v1alpha1.ProxyPoolSpec) {
			s.Template.Spec.Proxy = &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"0.0.0.0/0"}, AllowOpenProxy: true}
		}, ""},
		{"template open to anyone with basic auth", func(s *v1alpha1.ProxyPoolSpec) {
			s.Template.Spec.Proxy = &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"0.0.0.0/0"},
				BasicAuth: &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "crawl-proxy-auth"}}}
		}, ""},
		{"bad service name", func(s *v1alpha1.ProxyPoolSpec) { s.Service = &v1alpha1.PoolService{Name: "Proxies_1"} }, "spec.service.name"},
		{"zero progress deadline", func(s *v1alpha1.ProxyPoolSpec) { s.ProgressDeadlineSeconds = ptr.To[int32](0) },
			"spec.progressDeadlineSeconds must be a positive number of seconds"},
		{"negative progress deadline", func(s *v1alpha1.ProxyPoolSpec) { s.ProgressDeadlineSeconds = ptr.To[int32](-5) },
			"spec.progressDeadlineSeconds must be a positive number of seconds"},
		{"progress deadline", func(s *v1alpha1.ProxyPoolSpec) { s.ProgressDeadlineSeconds = ptr.To[int32](1) }, ""},
		{"bans", func(s *v1alpha1.ProxyPoolSpec) {
			s.Bans = &v1alpha1.PoolBans{CooldownSeconds: ptr.To[int32](60), MaxCooldownSeconds: ptr.To[int32](3600), MaxCoolingPercent: ptr.To[int32](100),
				RetireAfterSites: ptr.To[int32](100), RetireWindowSeconds: ptr.To[int32](1)}
		}, ""},
		{"retirement off", func(s *v1alpha1.ProxyPoolSpec) { s.Bans = &v1alpha1.PoolBans{RetireAfterSites: ptr.To[int32](0)} }, ""},
		{"zero cooldown", func(s *v1alpha1.ProxyPoolSpec) { s.Bans = &v1alpha1.PoolBans{CooldownSeconds: ptr.To[int32](0)} },
			"spec.bans.cooldownSeconds in body should be greater than or equal to 1"},
		{"cooling percent over 100", func(s *v1alpha1.ProxyPoolSpec) { s.Bans = &v1alpha1.PoolBans{MaxCoolingPercent: ptr.To[int32](101)} },
			"spec.bans.maxCoolingPercent in body should be less than or equal to 100"},
		{"negative retire sites", func(s *v1alpha1.ProxyPoolSpec) { s.Bans = &v1alpha1.PoolBans{RetireAfterSites: ptr.To[int32](-1)} },
			"spec.bans.retireAfterSites must be 0 (off) to 100"},
		{"retire sites over 100", func(s *v1alpha1.ProxyPoolSpec) { s.Bans = &v1alpha1.PoolBans{RetireAfterSites: ptr.To[int32](101)} },
			"spec.bans.retireAfterSites must be 0 (off) to 100 (a proxy keeps at most 100 sites)"},
		{"zero retire window", func(s *v1alpha1.ProxyPoolSpec) { s.Bans = &v1alpha1.PoolBans{RetireWindowSeconds: ptr.To[int32](0)} },
			"spec.bans.retireWindowSeconds must be a positive number of seconds"},
		{"negative retire window", func(s *v1alpha1.ProxyPoolSpec) { s.Bans = &v1alpha1.PoolBans{RetireWindowSeconds: ptr.To[int32](-60)} },
			"spec.bans.retireWindowSeconds must be a positive number of seconds"},
		{"retirement budget", func(s *v1alpha1.ProxyPoolSpec) {
			s.Bans = &v1alpha1.PoolBans{MaxRetirementsPerHour: is(intstr.FromInt32(2))}
		}, ""},
		{"retirement budget 0", func(s *v1alpha1.ProxyPoolSpec) {
			s.Bans = &v1alpha1.PoolBans{MaxRetirementsPerHour: is(intstr.FromInt32(0))}
		}, ""},
		{"retirement budget percentage", func(s *v1alpha1.ProxyPoolSpec) {
			s.Bans = &v1alpha1.PoolBans{MaxRetirementsPerHour: is(intstr.FromString("25%"))}
		}, ""},
		{"negative retirement budget", func(s *v1alpha1.ProxyPoolSpec) {
			s.Bans = &v1alpha1.PoolBans{MaxRetirementsPerHour: is(intstr.FromInt32(-1))}
		},
			"spec.bans.maxRetirementsPerHour must be a number from 0 to 1000 or a percentage of spec.replicas such as 10%"},
		{"retirement budget over 1000", func(s *v1alpha1.ProxyPoolSpec) {
			s.Bans = &v1alpha1.PoolBans{MaxRetirementsPerHour: is(intstr.FromInt32(1001))}
		}, "spec.bans.maxRetirementsPerHour must be a number from 0 to 1000"},
		{"retirement budget not a percentage", func(s *v1alpha1.ProxyPoolSpec) {
			s.Bans = &v1alpha1.PoolBans{MaxRetirementsPerHour: is(intstr.FromString("a few"))}
		}, "spec.bans.maxRetirementsPerHour must be a number from 0 to 1000 or a percentage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := valid()
			tc.mutate(&spec)
			pool := &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Name: "v", Namespace: "default"}, Spec: spec}
			err := env.Client.Create(ctx, pool, client.DryRunAll)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// A pool's name is its children's pool label value: the API server refuses one longer
// than a label value may be (63), saying so; one of 63 characters makes its children.
func testPoolNameLength(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	long := e.NewPool(strings.Repeat("n", 64), 1)
	err := e.C.Create(e.Ctx, long)
	if err == nil || !strings.Contains(err.Error(), "metadata.name of a ProxyPool must be at most 63 characters") ||
		!strings.Contains(err.Error(), "label values are limited to 63") {
		t.Fatalf("a 64-character pool name: %v, want a refusal saying the limit and why", err)
	}
	name := strings.Repeat("n", 63)
	e.Create(e.NewPool(name, 1))
	e.WaitSettled(name, 1)
	for _, px := range e.Children(name) {
		if px.Labels[v1alpha1.PoolLabel] != name || len(px.Name) > 63 {
			t.Errorf("child %s of the 63-character pool: labels %v", px.Name, px.Labels)
		}
	}
}

// Omitted fields get the defaults: one replica, maxSurge 1, maxUnavailable 0, deletion
// order Oldest, spread weight 1; the template's Proxy defaults apply too.
func testPoolDefaults(t *testing.T, env *testenv.Env) {
	ctx := testenv.Context(t)
	pool := &v1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Name: "defaults", Namespace: "default"},
		Spec: v1alpha1.ProxyPoolSpec{
			Template: v1alpha1.ProxyTemplate{Spec: v1alpha1.ProxySpec{Provider: "kvm2-home"}},
			Spread:   []v1alpha1.PoolSpreadEntry{{Zone: "nuc"}},
		},
	}
	if err := env.Client.Create(ctx, pool, client.DryRunAll); err != nil {
		t.Fatal(err)
	}
	s := pool.Spec
	ru := s.Strategy.RollingUpdate
	switch {
	case s.Replicas == nil || *s.Replicas != 1:
		t.Errorf("replicas %v, want 1", s.Replicas)
	case ru.MaxSurge == nil || *ru.MaxSurge != intstr.FromInt32(1):
		t.Errorf("maxSurge %v, want 1", ru.MaxSurge)
	case ru.MaxUnavailable == nil || *ru.MaxUnavailable != intstr.FromInt32(0):
		t.Errorf("maxUnavailable %v, want 0", ru.MaxUnavailable)
	case s.ProgressDeadlineSeconds == nil || *s.ProgressDeadlineSeconds != 600:
		t.Errorf("progressDeadlineSeconds %v, want 600", s.ProgressDeadlineSeconds)
	case s.Deletion.Order != v1alpha1.DeletionOrderOldest:
		t.Errorf("deletion order %q, want Oldest", s.Deletion.Order)
	case s.Spread[0].Weight != 1:
		t.Errorf("spread weight %d, want 1", s.Spread[0].Weight)
	case s.Template.Spec.Mode != v1alpha1.ProxyModeManaged || s.Template.Spec.Port != 3128:
		t.Errorf("template mode %q port %d, want Managed and 3128", s.Template.Spec.Mode, s.Template.Spec.Port)
	}
}

// config/samples/proxypool.yaml is accepted as it is, and its spread names hosts of the
// sample providers config.
func testPoolSample(t *testing.T, env *testenv.Env) {
	ctx := testenv.Context(t)
	dir, err := testenv.CRDDir()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(filepath.Dir(filepath.Dir(dir))) // dir is <root>/config/crd/bases
	data, err := os.ReadFile(filepath.Join(root, "config", "samples", "proxypool.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifest.Decode(data)
	if err != nil {
		t.Fatalf("config/samples/proxypool.yaml: %v", err)
	}
	var pool *v1alpha1.ProxyPool
	for _, o := range objs {
		o.SetNamespace("default")
		if err := env.Client.Create(ctx, o, client.DryRunAll); err != nil {
			t.Fatalf("config/samples/proxypool.yaml: %s %s is rejected: %v", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), err)
		}
		if p, ok := o.(*v1alpha1.ProxyPool); ok {
			pool = p
		}
	}
	if pool == nil {
		t.Fatal("config/samples/proxypool.yaml holds no ProxyPool")
	}
	cfg, err := provider.LoadConfig(filepath.Join(root, "config", "samples", "providers-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	zones := map[string]bool{}
	for _, pc := range cfg.Providers {
		if pc.Name == pool.Spec.Template.Spec.Provider && pc.KVM2 != nil {
			for _, h := range pc.KVM2.Hosts {
				zones[h.Name] = true
			}
		}
	}
	for i, e := range pool.Spec.Spread {
		if !zones[e.Zone] {
			t.Errorf("spread[%d] zone %q is not a host of %s in the sample providers config", i, e.Zone, pool.Spec.Template.Spec.Provider)
		}
	}
}
