package bans

import (
	"errors"
	"strings"
	"testing"
)

// A domain over the DNS limits is refused, with an error that says which limit and does
// not quote the whole input; the longest names and labels the DNS allows are sites.
func TestSiteHoldsDomainsToTheDNSLimits(t *testing.T) {
	label63 := strings.Repeat("a", 63)
	longest := strings.Repeat(label63+".", 3) + strings.Repeat("b", 57) + ".com" // 253
	if len(longest) != MaxNameLength {
		t.Fatalf("test name is %d characters, want %d", len(longest), MaxNameLength)
	}
	for _, ok := range []struct{ in, want string }{
		{longest, strings.Repeat("b", 57) + ".com"},
		{longest + ".", strings.Repeat("b", 57) + ".com"},
		{label63 + ".example.com", "example.com"},
	} {
		if got, err := Site(ok.in); err != nil || got != ok.want {
			t.Errorf("Site(%d characters) = %q, %v; want %q", len(ok.in), got, err, ok.want)
		}
	}
	for _, tc := range []struct {
		name, in, want string
	}{
		{"300 characters", strings.Repeat("a", 42) + strings.Repeat(".abcde", 41) + ".example.com", "300 characters in ASCII form; a DNS name has at most 253"},
		{"254 characters", "a" + longest, "254 characters in ASCII form; a DNS name has at most 253"},
		{"64-character label", strings.Repeat("x", 64) + ".example.com", `label "` + strings.Repeat("x", 64) + `" is 64 characters in ASCII form; a DNS label has at most 63`},
		{"long in ASCII form only", strings.Repeat("aü", 30) + ".example.com", "is 67 characters in ASCII form; a DNS label has at most 63"},
		{"empty label", "a..example.com", "an empty label"},
		{"1 MiB", strings.Repeat("a.", 1<<19) + "example.com", "1048587 bytes long; a DNS name has at most 253 characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Site(tc.in)
			if !errors.Is(err, ErrBadDomain) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Site = %q, %v; want an ErrBadDomain saying %q", got, err, tc.want)
			}
			if len(err.Error()) > 300 {
				t.Errorf("the error is %d bytes long, want the domain cut short: %.200s", len(err.Error()), err)
			}
		})
	}
}
