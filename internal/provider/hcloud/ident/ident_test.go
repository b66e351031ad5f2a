package ident_test

import (
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud/ident"
)

// FuzzLabelValue: whatever the input, the value is one Hetzner takes; a valid input is
// kept as it is, and two inputs that differ give values that differ.
//
//fuzzsmoke:count 10000
func FuzzLabelValue(f *testing.F) {
	for _, s := range []string{"", "hetzner-eu", "Hetzner.EU", "0e8a7f1c-3b9d-4c2e-9f1a-8d7b6c5e4a32", strings.Repeat("x", 80), "é✓/ ", "-a", "a-"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v := ident.LabelValue(s)
		if !ident.ValidLabelValue(v) {
			t.Fatalf("LabelValue(%q) = %q, not a Hetzner label value", s, v)
		}
		if ident.ValidLabelValue(s) && v != s {
			t.Fatalf("LabelValue(%q) = %q, want a valid value kept", s, v)
		}
		if other := ident.LabelValue(s + "!"); other == v {
			t.Fatalf("LabelValue(%q) and LabelValue(%q+\"!\") are both %q", s, s, v)
		}
	})
}

// FuzzProviderID: a providerID of a valid name parses back to it; anything
// ParseProviderID accepts is a valid name, and anything it refuses is permanent.
//
//fuzzsmoke:count 10000
func FuzzProviderID(f *testing.F) {
	for _, s := range []string{"proxy-0123456789abcdef", "", "a/b", "Proxy", "-x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, err := ident.ParseProviderID(ident.ProviderID(name))
		switch {
		case ident.ValidName(name) && (err != nil || got != name):
			t.Fatalf("%q parsed to %q, %v", ident.ProviderID(name), got, err)
		case err == nil && !ident.ValidName(got):
			t.Fatalf("%q accepted with the name %q", ident.ProviderID(name), got)
		case err != nil && provider.Class(err) != provider.ErrPermanent:
			t.Fatalf("%q refused with class %s", ident.ProviderID(name), provider.ClassName(err))
		}
	})
}
