package ident_test

import (
	"regexp"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
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
		v := ident.LabelValue(s)
		if !labelCharset.MatchString(v) {
			t.Fatalf("LabelValue(%q) = %q, outside GCE's label charset", s, v)
		}
		if len(s) > 63 {
			if other := ident.LabelValue(s + "!"); other == v {
				t.Fatalf("LabelValue(%q) and LabelValue(%q+\"!\") are both %q", s, s, v)
			}
		}
	})
}

// FuzzProviderID: a providerID made by ProviderID parses back to its parts; anything
// ParseProviderID accepts has three non-empty parts.
//
//fuzzsmoke:count 10000
func FuzzProviderID(f *testing.F) {
	f.Add("epo-test-project", "europe-west1-b", "proxy-0123456789abcdef")
	f.Add("", "z", "n")
	f.Add("p", "a/b", "c")
	f.Fuzz(func(t *testing.T, project, zone, name string) {
		id := ident.ProviderID(project, zone, name)
		z, n, err := ident.ParseProviderID(id, project)
		wellFormed := project != "" && zone != "" && name != "" && !strings.Contains(project+zone+name, "/")
		if wellFormed && (err != nil || z != zone || n != name) {
			t.Fatalf("%s parsed to %q %q, %v", id, z, n, err)
		}
		if !wellFormed && err == nil && (z == "" || n == "") {
			t.Fatalf("%s accepted with empty parts", id)
		}
	})
}
