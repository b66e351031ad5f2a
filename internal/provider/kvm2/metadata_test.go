package kvm2

import (
	"errors"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
)

func TestMetadataURI(t *testing.T) {
	if metadataURI != "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/kvm2" {
		t.Fatalf("metadataURI = %q", metadataURI)
	}
	if MetadataURI("kvm") != "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/kvm" {
		t.Fatalf("MetadataURI(kvm) = %q", MetadataURI("kvm"))
	}
}

func TestCheckAdoption(t *testing.T) {
	p := &Provider{typ: "kvm2", metaNS: metadataURI}
	cases := []struct {
		name  string
		m     ident.Mark
		found bool
		want  string // "" for adopted
	}{
		{"no mark", ident.Mark{}, false, "domain proxy-1 on host beelink carries no kvm2 mark; it was not created by this provider"},
		{"other uid", ident.Mark{UID: "uid-b"}, true, "domain proxy-1 on host beelink belongs to UID uid-b, not to UID uid-a"},
		{"same uid", ident.Mark{UID: "uid-a"}, true, ""},
		{"empty uid", ident.Mark{}, true, ""},
	}
	for _, c := range cases {
		err := p.checkAdoption("beelink", "proxy-1", "uid-a", c.m, c.found)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want adoption", c.name, err)
		case c.want != "" && (!errors.Is(err, provider.ErrPermanent) || err.Error() != c.want):
			t.Errorf("%s: got %v, want permanent %q", c.name, err, c.want)
		}
	}
	kvm := &Provider{typ: "kvm", metaNS: MetadataURI("kvm")}
	if err := kvm.checkAdoption("h", "proxy-1", "u", ident.Mark{}, false); err == nil || !strings.Contains(err.Error(), "carries no kvm mark") {
		t.Errorf("kvm type: got %v, want it to name its own mark", err)
	}
}
