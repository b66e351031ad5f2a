package kvm2

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

func TestMetadataURI(t *testing.T) {
	if metadataURI != "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/kvm2" {
		t.Fatalf("metadataURI = %q", metadataURI)
	}
	if MetadataURI("kvm") != "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/kvm" {
		t.Fatalf("MetadataURI(kvm) = %q", MetadataURI("kvm"))
	}
}

func TestMetadataRoundTrip(t *testing.T) {
	created := time.Date(2026, 9, 16, 17, 42, 11, 0, time.UTC)
	want := mark{UID: "0f3a-uid", CreatedAt: created, Install: "5c1b7a2e-install", SpecHash: "9d4e1f0a"}
	out, err := marshalMetadata(metadataURI, want)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Golden(t, "metadata.xml", out+"\n")
	m, err := parseMetadata(metadataURI, out)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, m); diff != "" {
		t.Fatalf("round trip changed the mark (-want +got):\n%s", diff)
	}
	// A mark from before install and specHash existed has neither element, and writing
	// one without them still leaves them out.
	old, err := marshalMetadata(metadataURI, mark{UID: "0f3a-uid", CreatedAt: created})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(old, "install") || strings.Contains(old, "specHash") {
		t.Fatalf("a mark without install and hash renders them: %s", old)
	}
}

func TestParseMetadata(t *testing.T) {
	ns := metadataURI
	ok := []struct{ name, in, uid string }{
		// An element with a default namespace...
		{"default namespace", `<instance xmlns="` + ns + `"><managed>true</managed><uid>u1</uid><createdAt>2026-09-16T17:42:11Z</createdAt></instance>`, "u1"},
		// ...and one set through virsh metadata --key with a prefix.
		{"prefixed", `<k:instance xmlns:k="` + ns + `"><k:managed>true</k:managed><k:uid>u2</k:uid><k:createdAt>2026-09-16T17:42:11Z</k:createdAt></k:instance>`, "u2"},
		{"empty uid", `<instance xmlns="` + ns + `"><managed>true</managed><uid></uid></instance>`, ""},
		// What libvirtd 9.0.0 really answers DomainGetMetadata with: the namespace stripped.
		{"namespace stripped by libvirtd", "<instance>\n  <managed>true</managed>\n  <uid>u3</uid>\n  <createdAt>2026-09-16T17:42:11Z</createdAt>\n</instance>\n", "u3"},
	}
	for _, c := range ok {
		m, err := parseMetadata(ns, c.in)
		if err != nil || m.UID != c.uid {
			t.Errorf("%s: got %+v, %v; want uid %q", c.name, m, err, c.uid)
		}
	}
	bad := []struct{ name, in string }{
		{"not xml", "garbage"},
		{"empty", ""},
		{"the kvm provider's namespace", `<instance xmlns="` + MetadataURI("kvm") + `"><managed>true</managed><uid>u</uid></instance>`},
		{"other element", `<owner xmlns="` + ns + `"><managed>true</managed></owner>`},
		{"not managed", `<instance xmlns="` + ns + `"><managed>false</managed><uid>u</uid></instance>`},
		{"bad managed", `<instance xmlns="` + ns + `"><managed>yes</managed><uid>u</uid></instance>`},
		{"bad time", `<instance xmlns="` + ns + `"><managed>true</managed><createdAt>yesterday</createdAt></instance>`},
	}
	for _, c := range bad {
		if _, err := parseMetadata(ns, c.in); err == nil {
			t.Errorf("%s: parsed %q without error", c.name, c.in)
		}
	}
}

//fuzzsmoke:count 10000
func FuzzParseMetadata(f *testing.F) {
	good, _ := marshalMetadata(metadataURI, mark{UID: "uid-1", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Install: "i-1", SpecHash: "h-1"})
	for _, s := range []string{good, "", "<instance/>", `<k:instance xmlns:k="` + metadataURI + `"><k:managed>true</k:managed></k:instance>`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		m, err := parseMetadata(metadataURI, in)
		if err != nil {
			return
		}
		// Whatever parses must survive a round trip unchanged.
		out, err := marshalMetadata(metadataURI, m)
		if err != nil {
			t.Fatalf("re-marshal of %+v: %v", m, err)
		}
		again, err := parseMetadata(metadataURI, out)
		if err != nil {
			t.Fatalf("re-parse of %q: %v", out, err)
		}
		if again.UID != m.UID || !again.CreatedAt.Equal(m.CreatedAt.Truncate(time.Second)) ||
			again.Install != m.Install || again.SpecHash != m.SpecHash {
			t.Fatalf("round trip of %q: %+v became %+v", in, m, again)
		}
	})
}

func TestCheckAdoption(t *testing.T) {
	p := &Provider{typ: "kvm2", metaNS: metadataURI}
	cases := []struct {
		name  string
		m     mark
		found bool
		want  string // "" for adopted
	}{
		{"no mark", mark{}, false, "domain proxy-1 on host beelink carries no kvm2 mark; it was not created by this provider"},
		{"other uid", mark{UID: "uid-b"}, true, "domain proxy-1 on host beelink belongs to UID uid-b, not to UID uid-a"},
		{"same uid", mark{UID: "uid-a"}, true, ""},
		{"empty uid", mark{}, true, ""},
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
	if err := kvm.checkAdoption("h", "proxy-1", "u", mark{}, false); err == nil || !strings.Contains(err.Error(), "carries no kvm mark") {
		t.Errorf("kvm type: got %v, want it to name its own mark", err)
	}
}
