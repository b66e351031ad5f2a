package cost

import (
	"testing"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// ChildRate is the price of the pool's machine type, the highest over its spread's
// providers, and unknown when one lacks a price or the currencies differ.
func TestChildRate(t *testing.T) {
	priced := func(name, currency, price string) provider.ProviderConfig {
		return provider.ProviderConfig{Name: name, Type: provider.TypeKVM2, KVM2: &provider.KVMConfig{},
			Prices: &provider.Prices{Currency: currency, MachineTypes: map[string]provider.Price{"small": provider.Price(price)}}}
	}
	providers := map[string]provider.ProviderConfig{
		"home": priced("home", "EUR", "0.01"), "lab": priced("lab", "EUR", "0.03"),
		"us": priced("us", "USD", "0.02"), "free": {Name: "free", Type: provider.TypeKVM2, KVM2: &provider.KVMConfig{}},
	}
	pool := func(template string, spread ...string) *v1alpha1.ProxyPool {
		p := &v1alpha1.ProxyPool{}
		p.Spec.Template.Spec.Provider = template
		p.Spec.Template.Spec.Placement.MachineType = "small"
		for _, s := range spread {
			p.Spec.Spread = append(p.Spec.Spread, v1alpha1.PoolSpreadEntry{Provider: s})
		}
		return p
	}
	for _, tc := range []struct {
		name string
		pool *v1alpha1.ProxyPool
		want v1alpha1.Amount
		ok   bool
	}{
		{"the template's provider", pool("home"), "0.01", true},
		{"the highest of the spread", pool("home", "home", "lab"), "0.03", true},
		{"no price", pool("free"), "", false},
		{"a provider not configured", pool("attic"), "", false},
		{"currencies differ", pool("home", "home", "us"), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ok := ChildRate(providers, tc.pool)
			if ok != tc.ok || c.Hourly != tc.want {
				t.Fatalf("ChildRate = %+v, %v; want %s, %v", c, ok, tc.want, tc.ok)
			}
		})
	}
}
