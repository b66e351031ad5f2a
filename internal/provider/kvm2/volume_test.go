package kvm2

import (
	"encoding/xml"
	"errors"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

func TestVolumeNames(t *testing.T) {
	vm := "proxy-0123456789abcdef"
	for _, c := range []struct{ got, want string }{
		{overlayVolName(vm), "proxy-0123456789abcdef.qcow2"},
		{seedVolName(vm), "proxy-0123456789abcdef-seed.iso"},
		{imagecache.BaseVolName("debian-13", "qcow2"), "base-debian-13.qcow2"},
		{imagecache.MarkerVolName("debian-13", "raw"), "base-debian-13.raw.sha256"},
		{providerID("beelink", vm), "hosts/beelink/domains/proxy-0123456789abcdef"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestParseProviderID(t *testing.T) {
	host, vm, err := parseProviderID("hosts/beelink.lan/domains/proxy-0123456789abcdef")
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
		_, _, err := parseProviderID(id)
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
		host, vm, err := parseProviderID(id)
		if err != nil {
			if provider.Class(err) != provider.ErrPermanent {
				t.Fatalf("parse %q: error %v is not permanent", id, err)
			}
			return
		}
		if providerID(host, vm) != id {
			t.Fatalf("parse %q gave %q %q, which rebuild %q", id, host, vm, providerID(host, vm))
		}
		if !validName(host) || !validName(vm) || strings.Contains(host+vm, "/") {
			t.Fatalf("parse %q accepted host %q name %q", id, host, vm)
		}
	})
}

func TestOverlayVolumeXML(t *testing.T) {
	out, err := overlayVolumeXML("proxy-1.qcow2", 10<<30, "/var/lib/libvirt/images/base-debian-13.qcow2", "qcow2")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Golden(t, "overlay-volume.xml", out+"\n")
	var v volumeXML
	if err := xml.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	if v.Name != "proxy-1.qcow2" || v.Capacity.Value != 10737418240 || v.Capacity.Unit != "bytes" ||
		v.Target.Format.Type != "qcow2" || v.Backing == nil ||
		v.Backing.Path != "/var/lib/libvirt/images/base-debian-13.qcow2" || v.Backing.Format.Type != "qcow2" {
		t.Fatalf("overlay volume xml decodes to %+v", v)
	}
	raw, err := rawVolumeXML("proxy-1-seed.iso", 374784)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Golden(t, "seed-volume.xml", raw+"\n")
	if strings.Contains(raw, "backingStore") {
		t.Fatalf("raw volume has a backing store: %s", raw)
	}
}
