package kvm2

import (
	"encoding/xml"
	"strings"
	"testing"

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
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
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
