package proxy

import (
	"testing"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
)

// spec.proxy as the API server checks it: CIDRs by CEL's isCIDR, the range list required
// on a Managed Proxy, the Secret's name.
func TestProxyConfigValidation(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	managed := func(pc *v1alpha1.ProxyConfig) v1alpha1.ProxySpec {
		return v1alpha1.ProxySpec{Provider: "kvm2-home", Proxy: pc}
	}
	auth := func(name string) *v1alpha1.ProxyBasicAuth {
		return &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: v1alpha1.SecretName(name)}}
	}
	ranges := func(r ...v1alpha1.CIDR) []v1alpha1.CIDR { return r }
	for _, tc := range []struct {
		name string
		spec v1alpha1.ProxySpec
		want string // "" = accepted
	}{
		{"ranges only", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("10.0.0.0/8", "192.168.1.0/24")}), ""},
		{"IPv6 range", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("2001:db8::/32")}), ""},
		{"a single address as /32", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("192.0.2.7/32")}), ""},
		{"ranges and basic auth", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("10.0.0.0/8"), BasicAuth: auth("crawl-proxy-auth")}), ""},
		{"no ranges on Managed", managed(&v1alpha1.ProxyConfig{BasicAuth: auth("crawl-proxy-auth")}),
			"spec.proxy.allowedSourceRanges is required when spec.proxy is set on a Managed Proxy"},
		{"empty spec.proxy", managed(&v1alpha1.ProxyConfig{}), "spec.proxy.allowedSourceRanges is required"},
		{"address without prefix", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("10.0.0.1")}),
			`spec.proxy.allowedSourceRanges[0]: Invalid value: "10.0.0.1": must be a network in CIDR notation`},
		{"not an address", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("10.0.0.0/8", "office")}),
			`spec.proxy.allowedSourceRanges[1]: Invalid value: "office": must be a network in CIDR notation`},
		{"prefix too long", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("10.0.0.0/33")}), "must be a network in CIDR notation"},
		{"host bits set (the renderer writes the network)", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("10.1.2.3/8")}), ""},
		{"secret name with upper case", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("10.0.0.0/8"), BasicAuth: auth("Crawl")}),
			"spec.proxy.basicAuth.secretRef.name must be the name of a Secret"},
		{"secret name empty", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("10.0.0.0/8"), BasicAuth: auth("")}),
			"spec.proxy.basicAuth.secretRef.name"},
		{"anyone (0.0.0.0/0) with basic auth", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("0.0.0.0/0"), BasicAuth: auth("crawl-proxy-auth")}), ""},
		{"anyone (0.0.0.0/0) without basic auth", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("10.0.0.0/8", "0.0.0.0/0")}),
			"spec.proxy.allowedSourceRanges: Invalid value: holds 0.0.0.0/0 or ::/0 without basicAuth: anyone could use the proxy. Add basicAuth"},
		{"anyone (::/0) without basic auth", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("::/0")}),
			"spec.proxy.allowedSourceRanges: Invalid value: holds 0.0.0.0/0 or ::/0 without basicAuth"},
		{"anyone (::/0) with basic auth", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("::/0"), BasicAuth: auth("crawl-proxy-auth")}), ""},
		{"anyone (0.0.0.0/0) open on purpose", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("0.0.0.0/0"), AllowOpenProxy: true}), ""},
		{"anyone (::/0) open on purpose", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("::/0"), AllowOpenProxy: true}), ""},
		{"a /1 is not anyone", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("0.0.0.0/1")}), ""},
		{"host bits on a /0 are still anyone", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("10.1.2.3/0")}), "holds 0.0.0.0/0 or ::/0 without basicAuth"},
		{"allowed destinations", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("10.0.0.0/8"), AllowedDestinations: ranges("10.123.0.2/32", "fd00:1::/64")}), ""},
		{"allowed destination not a CIDR", managed(&v1alpha1.ProxyConfig{AllowedSourceRanges: ranges("10.0.0.0/8"), AllowedDestinations: ranges("10.0.0.0/8", "db.internal")}),
			`spec.proxy.allowedDestinations[1]: Invalid value: "db.internal": must be a network in CIDR notation`},
		{"External with basic auth only", v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: "squid.example.net",
			Proxy: &v1alpha1.ProxyConfig{BasicAuth: auth("squid-auth")}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) { controllertest.CheckAdmission(t, ctx, shared.Client(t), tc.spec, tc.want) })
	}
}
