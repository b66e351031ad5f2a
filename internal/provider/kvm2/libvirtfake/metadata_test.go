package libvirtfake

import (
	"testing"

	"github.com/digitalocean/go-libvirt"
)

func getMeta(f *Fake, d libvirt.Domain, uri string) (string, error) {
	return f.DomainGetMetadata(d, int32(libvirt.DomainMetadataElement), libvirt.OptString{uri}, 0)
}

func TestMetadataElementAsLibvirtReturnsIt(t *testing.T) {
	for _, tc := range []struct {
		name, metadata, want string
	}{{
		name:     "compact element is indented by two spaces",
		metadata: `<instance xmlns="` + testNS + `"><managed>true</managed><uid>u-1</uid><createdAt>2026-09-16T17:42:11Z</createdAt></instance>`,
		want: "<instance>\n  <managed>true</managed>\n  <uid>u-1</uid>\n" +
			"  <createdAt>2026-09-16T17:42:11Z</createdAt>\n</instance>",
	}, {
		name:     "own whitespace is kept",
		metadata: "\n    <instance xmlns=\"" + testNS + "\">\n      <managed>true</managed>\n    </instance>\n  ",
		want:     "<instance>\n      <managed>true</managed>\n    </instance>",
	}, {
		name:     "empty element self-closes, single quotes become double",
		metadata: `<instance xmlns='` + testNS + `' v='1'><uid></uid></instance>`,
		want:     "<instance v=\"1\">\n  <uid/>\n</instance>",
	}, {
		name:     "prefixed element loses its prefix with its namespace",
		metadata: `<k:instance xmlns:k="` + testNS + `"><k:managed>true</k:managed></k:instance>`,
		want:     "<instance>\n  <managed>true</managed>\n</instance>",
	}, {
		name:     "text is escaped again",
		metadata: `<instance xmlns="` + testNS + `"><note>a &amp; b &lt; c</note></instance>`,
		want:     "<instance>\n  <note>a &amp; b &lt; c</note>\n</instance>",
	}, {
		name: "first element of a namespace wins, un-namespaced children are dropped",
		metadata: `<plain>x</plain><other xmlns="https://other.test/"/>` +
			`<instance xmlns="` + testNS + `"><uid>first</uid></instance><instance xmlns="` + testNS + `"><uid>second</uid></instance>`,
		want: "<instance>\n  <uid>first</uid>\n</instance>",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := New()
			d := mustDefine(t, f, domXML("vm1", "<metadata>"+tc.metadata+"</metadata>"))
			got, err := getMeta(f, d, testNS)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestMetadataMissing(t *testing.T) {
	f := New()
	plain := mustDefine(t, f, domXML("plain", ""))
	other := mustDefine(t, f, domXML("other", `<metadata><instance xmlns="https://gitea.example/kvm"/></metadata>`))
	for _, d := range []libvirt.Domain{plain, other} {
		_, err := getMeta(f, d, testNS)
		wantCode(t, err, libvirt.ErrNoDomainMetadata, "metadata not found: Requested metadata element is not present")
	}
	_, err := f.DomainGetMetadata(plain, int32(libvirt.DomainMetadataElement), nil, 0)
	wantCode(t, err, libvirt.ErrInvalidArg, "invalid argument: uri in virDomainGetMetadata must not be NULL")
}

func TestMetadataTitleAndDescription(t *testing.T) {
	f := New()
	d := mustDefine(t, f, domXML("vm1", "<title>T</title><description>D</description>"))
	if s, err := f.DomainGetMetadata(d, int32(libvirt.DomainMetadataTitle), nil, 0); err != nil || s != "T" {
		t.Fatalf("title: %q, %v", s, err)
	}
	if s, err := f.DomainGetMetadata(d, int32(libvirt.DomainMetadataDescription), nil, 0); err != nil || s != "D" {
		t.Fatalf("description: %q, %v", s, err)
	}
}

func TestMetadataSnapshot(t *testing.T) {
	f := New()
	mustDefine(t, f, domXML("vm1", `<metadata><i xmlns="`+testNS+`"/></metadata>`))
	info, _ := f.Domain("vm1")
	if info.Metadata[testNS] != `<i/>` {
		t.Fatalf("snapshot metadata %v", info.Metadata)
	}
}

func TestMetadataLiveOfInactiveDomain(t *testing.T) {
	f := New()
	d := mustDefine(t, f, domXML("vm1", `<metadata><i xmlns="`+testNS+`"/></metadata>`))
	_, err := f.DomainGetMetadata(d, int32(libvirt.DomainMetadataElement), libvirt.OptString{testNS}, libvirt.DomainAffectLive)
	wantCode(t, err, libvirt.ErrOperationInvalid, "Requested operation is not valid: domain is not running")
	if _, err := f.DomainGetMetadata(d, int32(libvirt.DomainMetadataElement), libvirt.OptString{testNS}, libvirt.DomainAffectConfig); err != nil {
		t.Fatalf("config definition: %v", err)
	}
}
