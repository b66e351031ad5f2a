package ident_test

import (
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
)

// The namespaces of the kvm2 and kvm marks (kvm2's metadataURI and MetadataURI("kvm")).
const (
	ns    = "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/kvm2"
	kvmNS = "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/kvm"
)

func TestMarkRoundTrip(t *testing.T) {
	created := time.Date(2026, 9, 16, 17, 42, 11, 0, time.UTC)
	want := ident.Mark{UID: "0f3a-uid", CreatedAt: created, Install: "5c1b7a2e-install", SpecHash: "9d4e1f0a"}
	out, err := ident.MarshalMark(ns, want)
	if err != nil {
		t.Fatal(err)
	}
	if wantXML := `<instance xmlns="` + ns + `"><managed>true</managed><uid>0f3a-uid</uid>` +
		`<createdAt>2026-09-16T17:42:11Z</createdAt><install>5c1b7a2e-install</install><specHash>9d4e1f0a</specHash></instance>`; out != wantXML {
		t.Fatalf("marshalled mark\n%s\nwant\n%s", out, wantXML)
	}
	m, err := ident.ParseMark(ns, out)
	if err != nil {
		t.Fatal(err)
	}
	if !m.CreatedAt.Equal(want.CreatedAt) {
		t.Fatalf("round trip changed createdAt: %v, want %v", m.CreatedAt, want.CreatedAt)
	}
	if m.CreatedAt = want.CreatedAt; m != want {
		t.Fatalf("round trip changed the mark: %+v, want %+v", m, want)
	}
	// A mark from before install and specHash existed has neither element, and writing
	// one without them still leaves them out.
	old, err := ident.MarshalMark(ns, ident.Mark{UID: "0f3a-uid", CreatedAt: created})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(old, "install") || strings.Contains(old, "specHash") {
		t.Fatalf("a mark without install and hash renders them: %s", old)
	}
}

func TestParseMark(t *testing.T) {
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
		m, err := ident.ParseMark(ns, c.in)
		if err != nil || m.UID != c.uid {
			t.Errorf("%s: got %+v, %v; want uid %q", c.name, m, err, c.uid)
		}
	}
	bad := []struct{ name, in string }{
		{"not xml", "garbage"},
		{"empty", ""},
		{"the kvm provider's namespace", `<instance xmlns="` + kvmNS + `"><managed>true</managed><uid>u</uid></instance>`},
		{"other element", `<owner xmlns="` + ns + `"><managed>true</managed></owner>`},
		{"not managed", `<instance xmlns="` + ns + `"><managed>false</managed><uid>u</uid></instance>`},
		{"bad managed", `<instance xmlns="` + ns + `"><managed>yes</managed><uid>u</uid></instance>`},
		{"bad time", `<instance xmlns="` + ns + `"><managed>true</managed><createdAt>yesterday</createdAt></instance>`},
	}
	for _, c := range bad {
		if _, err := ident.ParseMark(ns, c.in); err == nil {
			t.Errorf("%s: parsed %q without error", c.name, c.in)
		}
	}
}

//fuzzsmoke:count 10000
func FuzzParseMetadata(f *testing.F) {
	good, _ := ident.MarshalMark(ns, ident.Mark{UID: "uid-1", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Install: "i-1", SpecHash: "h-1"})
	for _, s := range []string{good, "", "<instance/>", `<k:instance xmlns:k="` + ns + `"><k:managed>true</k:managed></k:instance>`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		m, err := ident.ParseMark(ns, in)
		if err != nil {
			return
		}
		// Whatever parses must survive a round trip unchanged.
		out, err := ident.MarshalMark(ns, m)
		if err != nil {
			t.Fatalf("re-marshal of %+v: %v", m, err)
		}
		again, err := ident.ParseMark(ns, out)
		if err != nil {
			t.Fatalf("re-parse of %q: %v", out, err)
		}
		if again.UID != m.UID || !again.CreatedAt.Equal(m.CreatedAt.Truncate(time.Second)) ||
			again.Install != m.Install || again.SpecHash != m.SpecHash {
			t.Fatalf("round trip of %q: %+v became %+v", in, m, again)
		}
	})
}
