package ident_test

import (
	"errors"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
)

func TestProviderID(t *testing.T) {
	if got := ident.ProviderID("beelink", "proxy-0123456789abcdef"); got != "hosts/beelink/domains/proxy-0123456789abcdef" {
		t.Fatalf("got %q", got)
	}
}

func TestParseProviderID(t *testing.T) {
	host, vm, err := ident.ParseProviderID("hosts/beelink.lan/domains/proxy-0123456789abcdef")
	if err != nil || host != "beelink.lan" || vm != "proxy-0123456789abcdef" {
		t.Fatalf("parse: got %q %q %v", host, vm, err)
	}
	for _, id := range []string{
		"",
		"beelink/proxy-1",
		"hosts/beelink/domains/",
		"hosts//domains/proxy-1",
		"hosts/beelink/domain/proxy-1",
		"host/beelink/domains/proxy-1",
		"hosts/beelink/domains/proxy-1/extra",
		"hosts/bee link/domains/proxy-1",
		"hosts/../domains/proxy-1",
		"hosts/beelink/domains/proxy-1\n",
		"/hosts/beelink/domains/proxy-1",
	} {
		_, _, err := ident.ParseProviderID(id)
		if !errors.Is(err, provider.ErrPermanent) {
			t.Errorf("parse %q: got %v, want a permanent error", id, err)
			continue
		}
		if provider.Class(err) != provider.ErrPermanent || !strings.Contains(err.Error(), "malformed providerID") {
			t.Errorf("parse %q: error %q should be permanent only and say malformed providerID", id, err)
		}
	}
}

//fuzzsmoke:count 10000
func FuzzParseProviderID(f *testing.F) {
	for _, s := range []string{"hosts/a/domains/b", "hosts/beelink/domains/proxy-0123456789abcdef", "hosts//domains/x", "a/b/c/d", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		host, vm, err := ident.ParseProviderID(id)
		if err != nil {
			if provider.Class(err) != provider.ErrPermanent {
				t.Fatalf("parse %q: error %v is not permanent", id, err)
			}
			return
		}
		if ident.ProviderID(host, vm) != id {
			t.Fatalf("parse %q gave %q %q, which rebuild %q", id, host, vm, ident.ProviderID(host, vm))
		}
		if !ident.ValidName(host) || !ident.ValidName(vm) || strings.Contains(host+vm, "/") {
			t.Fatalf("parse %q accepted host %q name %q", id, host, vm)
		}
	})
}
