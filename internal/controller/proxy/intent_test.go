package proxy

import (
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// secretsIntent is the intent hash of px as the reconciler computes it, with Secrets
// whose contents follow from their names (controllertest.SecretsFor).
func secretsIntent(t *testing.T, px *v1alpha1.Proxy) string {
	t.Helper()
	creds, wg := controllertest.SecretsFor(px)
	h, err := IntentHash(px, creds, wg)
	if err != nil {
		t.Fatalf("intent hash: %v", err)
	}
	return h
}

// Every field of spec.proxy is part of a Managed Proxy's intent: setting it, or setting
// it to another value, changes the intent hash, so the edit replaces the instance. The
// fields are found by reflection: one added to v1alpha1.ProxyConfig is checked too.
func TestIntentCoversEveryProxyConfigField(t *testing.T) {
	leaves := controllertest.ProxyConfigLeaves(t)
	if len(leaves) < 6 {
		t.Fatalf("found %d fields in spec.proxy, want at least 6: %+v", len(leaves), leaves)
	}
	unset := secretsIntent(t, controllertest.IntentTestProxy(&v1alpha1.ProxyConfig{}))
	for _, l := range leaves {
		t.Run(l.Path, func(t *testing.T) {
			one, two := &v1alpha1.ProxyConfig{}, &v1alpha1.ProxyConfig{}
			l.Set(t, one, 1)
			l.Set(t, two, 2)
			h1, h2 := secretsIntent(t, controllertest.IntentTestProxy(one)), secretsIntent(t, controllertest.IntentTestProxy(two))
			if h1 == unset {
				t.Errorf("setting %s leaves the intent hash %s: editing it would keep the old instance", l.Path, h1)
			}
			if h1 == h2 {
				t.Errorf("changing %s leaves the intent hash %s: editing it would keep the old instance", l.Path, h1)
			}
		})
	}
}

// The intent hash of a Proxy that sets only the fields of spec.proxy the hash covered
// before it embedded spec.proxy whole is the one that version recorded, so an upgrade
// replaces none of them. The golden hashes were computed by that version.
func TestIntentHashKeptForUnchangedProxies(t *testing.T) {
	ranges := []v1alpha1.CIDR{"10.0.0.0/8", "2001:db8::/32"}
	auth := &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "auth"}}
	wg := func(byHand bool) *v1alpha1.ProxyEgress {
		ref := &v1alpha1.WireGuardSecretRef{Name: "exit-1"}
		if byHand {
			return &v1alpha1.ProxyEgress{WireGuard: &v1alpha1.ProxyWireGuard{SecretRef: ref}}
		}
		return &v1alpha1.ProxyEgress{WireGuard: &v1alpha1.ProxyWireGuard{AssignedSecretRef: ref}}
	}
	for _, c := range []struct {
		name   string
		cfg    *v1alpha1.ProxyConfig
		mutate func(*v1alpha1.Proxy)
		want   string
	}{
		{"ranges", &v1alpha1.ProxyConfig{AllowedSourceRanges: ranges}, nil, "a2225408957b257c"},
		{"basic auth", &v1alpha1.ProxyConfig{AllowedSourceRanges: ranges, BasicAuth: auth}, nil, "4270ebc0f743477f"},
		{"wireguard by hand", &v1alpha1.ProxyConfig{AllowedSourceRanges: ranges, BasicAuth: auth, Egress: wg(true)}, nil, "dbbf8923bcd80515"},
		{"assigned wireguard, port and placement", &v1alpha1.ProxyConfig{AllowedSourceRanges: ranges[:1], Egress: wg(false)}, func(px *v1alpha1.Proxy) {
			px.Spec.Port = 8080
			px.Spec.Placement = v1alpha1.ProxyPlacement{Region: "eu", Zone: "b", MachineType: "small", Image: "debian-12"}
			px.Spec.CloudInit = "#cloud-config\ntimezone: UTC\n"
		}, "a3675f2492275b4a"},
		{"without spec.proxy", nil, nil, "d7b3a8fdab2b2676"},
	} {
		px := controllertest.IntentTestProxy(c.cfg)
		if c.mutate != nil {
			c.mutate(px)
		}
		if got := secretsIntent(t, px); got != c.want {
			t.Errorf("%s: intent hash %s, want %s as before: an upgrade would replace such Proxies' instances", c.name, got, c.want)
		}
	}
}

// A status.specHash an earlier version recorded for a Proxy that sets allowedDestinations
// or allowOpenProxy is recognized (partialIntentHash), though this version's intent
// hash of the same spec differs.
func TestPartialIntentHashIsTheEarlierVersions(t *testing.T) {
	px := controllertest.IntentTestProxy(&v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.0.0.0/8"},
		BasicAuth:           &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "auth"}},
		AllowedDestinations: []v1alpha1.CIDR{"192.168.1.0/24"}, AllowOpenProxy: true})
	creds := &proxyconfig.Credentials{Username: "user-auth", Password: "pw-auth"}
	const earlier = "e5f008a970205248" // computed by that version
	partial, err := partialIntentHash(px, creds, nil)
	if err != nil || partial != earlier {
		t.Errorf("partial intent hash %s (%v), want %s", partial, err, earlier)
	}
	if now := secretsIntent(t, px); now == earlier {
		t.Errorf("intent hash %s is the earlier version's: it misses allowedDestinations and allowOpenProxy", now)
	}
}
