package proxy

import (
	"strings"
	"testing"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// Source ranges that only together admit everyone pass the API server (its rule sees a
// /0 alone) but not the rendering: the Proxy fails with an error naming the field and
// the way out, and no instance is made until allowOpenProxy (or basicAuth) is set.
func TestProxySplitOpenRangesRefused(t *testing.T) {
	t.Parallel()
	e := newProxyEnv(t)
	for _, tc := range []struct {
		name    string
		ranges  []v1alpha1.CIDR
		clients string
	}{
		{"halves", []v1alpha1.CIDR{"0.0.0.0/1", "128.0.0.0/1"}, "every IPv4 client"},
		{"quarters", []v1alpha1.CIDR{"0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/2", "192.0.0.0/2"}, "every IPv4 client"},
		{"over-the-mapped-addresses", []v1alpha1.CIDR{"2001:db8::/32", "::/80"}, "every IPv4 client"},
		{"ipv6-halves", []v1alpha1.CIDR{"::/1", "8000::/1"}, "every IPv4 client and every IPv6 client"},
	} {
		px := e.newProxy(tc.name)
		px.Spec.Port = 3128
		px.Spec.Proxy = &v1alpha1.ProxyConfig{AllowedSourceRanges: tc.ranges}
		e.create(px)
		got := e.waitPhase(tc.name, v1alpha1.PhaseFailed)
		c := provisioned(got)
		for _, want := range []string{"rendering the proxy configuration: an open proxy", "spec.proxy.allowedSourceRanges (",
			") together admit " + tc.clients, "spec.proxy.basicAuth is not set", "spec.proxy.allowOpenProxy: true"} {
			if c.Reason != v1alpha1.ReasonPermanentError || !strings.Contains(c.Message, want) {
				t.Errorf("%s: Provisioned %s %q, want PermanentError saying %q", tc.name, c.Reason, c.Message, want)
			}
		}
	}
	if n := e.fake.CountOf(providertest.OpCreate); n != 0 {
		t.Errorf("%d Creates of open proxies", n)
	}

	e.waitPhase("halves", v1alpha1.PhaseFailed)
	e.edit("halves", "spec.proxy.allowOpenProxy", func(px *v1alpha1.Proxy) { px.Spec.Proxy.AllowOpenProxy = true })
	e.waitPhase("halves", v1alpha1.PhaseRunning)
	if n := e.fake.CountOf(providertest.OpCreate); n != 1 {
		t.Errorf("%d Creates once allowOpenProxy is set, want 1", n)
	}
}
