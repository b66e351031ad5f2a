package gce

import (
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"
)

var labelCharset = regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)

// FuzzLabelValue: whatever the input, the value is in GCE's label charset and at most 63
// characters, and two inputs that differ once long values are shortened still differ.
//
//fuzzsmoke:count 10000
func FuzzLabelValue(f *testing.F) {
	for _, s := range []string{"", "gcp-eu", "Gcp.EU", "0e8a7f1c-3b9d-4c2e-9f1a-8d7b6c5e4a32", strings.Repeat("x", 80), "é✓/ "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v := labelValue(s)
		if !labelCharset.MatchString(v) {
			t.Fatalf("labelValue(%q) = %q, outside GCE's label charset", s, v)
		}
		if len(s) > 63 {
			if other := labelValue(s + "!"); other == v {
				t.Fatalf("labelValue(%q) and labelValue(%q+\"!\") are both %q", s, s, v)
			}
		}
	})
}

// FuzzProviderID: a providerID made by providerID parses back to its parts; anything
// parseProviderID accepts has three non-empty parts.
//
//fuzzsmoke:count 10000
func FuzzProviderID(f *testing.F) {
	f.Add("epo-test-project", "europe-west1-b", "proxy-0123456789abcdef")
	f.Add("", "z", "n")
	f.Add("p", "a/b", "c")
	p := &Provider{}
	f.Fuzz(func(t *testing.T, project, zone, name string) {
		p.cfg.Project = project
		id := providerID(project, zone, name)
		z, n, err := p.parseProviderID(id)
		wellFormed := project != "" && zone != "" && name != "" && !strings.Contains(project+zone+name, "/")
		if wellFormed && (err != nil || z != zone || n != name) {
			t.Fatalf("%s parsed to %q %q, %v", id, z, n, err)
		}
		if !wellFormed && err == nil && (z == "" || n == "") {
			t.Fatalf("%s accepted with empty parts", id)
		}
	})
}

// TestRequestIDIsUUIDv5: requestIds are name-based UUIDs of version 5 and the RFC 4122
// variant, the same for the same parts and attempt, distinct otherwise, and what the
// provider sends the API on its inserts and deletes.
func TestRequestIDIsUUIDv5(t *testing.T) {
	a := requestID(0, "insert", "p", "z", "n", "uid", "hash")
	for _, id := range []string{a, requestID(1, "insert", "p", "z", "n", "uid", "hash")} {
		u, err := uuid.Parse(id)
		if err != nil || u.Version() != 5 || u.Variant() != uuid.RFC4122 {
			t.Errorf("requestID %s: version %d, variant %v, %v; want version 5 of RFC 4122", id, u.Version(), u.Variant(), err)
		}
	}
	if a != requestID(0, "insert", "p", "z", "n", "uid", "hash") {
		t.Error("requestID is not deterministic")
	}
	for _, other := range []string{requestID(1, "insert", "p", "z", "n", "uid", "hash"), requestID(0, "insert", "p", "z", "n", "uid", "hash2"),
		requestID(0, "insert", "p", "z", "nu", "id", "hash")} {
		if other == a {
			t.Errorf("distinct inputs share requestID %s", a)
		}
	}
	e := newEnv(t)
	inst, err := e.p.Create(t.Context(), request("proxy-00000000000000d1", "uid-d1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.p.Delete(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	for _, c := range e.fake.Calls() {
		if c.RequestID == "" {
			continue
		}
		if u, err := uuid.Parse(c.RequestID); err != nil || u.Version() != 5 {
			t.Errorf("%s sent requestId %s, not a version 5 UUID", c.Method, c.RequestID)
		}
	}
}
