package imagecache

import (
	"errors"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

func TestResolveImage(t *testing.T) {
	catalogue := map[string]provider.KVMImage{
		"debian-13": {URL: "https://cloud.debian.org/images/debian-13.qcow2", SHA256: "AB", Format: "qcow2", Firmware: "uefi"},
		"old":       {URL: "http://mirror/old.raw", Format: "raw", Firmware: "bios"},
	}
	img, err := Resolve("kvm2", catalogue, "debian-13")
	if err != nil || img.Key != "debian-13" || img.SHA256 != "ab" || img.BaseVol() != "base-debian-13.qcow2" ||
		img.MarkerVol() != "base-debian-13.qcow2.sha256" || img.Firmware != "uefi" {
		t.Fatalf("catalogue key: %+v %v", img, err)
	}
	img, err = Resolve("kvm2", catalogue, "old")
	if err != nil || img.BaseVol() != "base-old.raw" || img.Firmware != "bios" {
		t.Fatalf("raw bios entry: %+v %v", img, err)
	}
	// A URL used directly: qcow2 and uefi, keyed by the first 16 hex of its sha256
	// (echo -n URL | sha256sum).
	url := "https://example.com/images/noble.img"
	img, err = Resolve("kvm2", catalogue, url)
	if err != nil || img.URL != url || img.Format != "qcow2" || img.Firmware != "uefi" || img.SHA256 != "" {
		t.Fatalf("url: %+v %v", img, err)
	}
	if img.Key != "163582dbbd2eb33e" || img.BaseVol() != "base-163582dbbd2eb33e.qcow2" {
		t.Fatalf("url key %q, base %q", img.Key, img.BaseVol())
	}
	for _, ref := range []string{"ubuntu", "", "ftp://example.com/x.qcow2", "https://", "file:///etc/passwd"} {
		_, err := Resolve("kvm2", catalogue, ref)
		want := `placement.image "` + ref + `" is neither a key in kvm2.images nor an http(s) URL`
		if !errors.Is(err, provider.ErrPermanent) || err.Error() != want {
			t.Errorf("ref %q: got %v, want permanent %q", ref, err, want)
		}
	}
}
