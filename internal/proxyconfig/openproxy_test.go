package proxyconfig

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// allOfIPv6ButMapped are the 96 networks that together hold every IPv6 address except
// the IPv4-mapped ones (::ffff:0:0/96): at each bit of the path to that network, its
// sibling.
func allOfIPv6ButMapped() []string {
	mapped := netip.MustParsePrefix("::ffff:0:0/96").Addr().As16()
	var out []string
	for i := 0; i < 96; i++ {
		b := mapped
		b[i/8] ^= 0x80 >> (i % 8)
		out = append(out, netip.PrefixFrom(netip.AddrFrom16(b), i+1).Masked().String())
	}
	return out
}

// Source ranges whose union admits every IPv4 or every IPv6 client make an open proxy
// however they are split: refused without credentials or allowOpenProxy, with an error
// naming the field, the ranges and the way out. IPv6 ranges over the IPv4-mapped
// addresses count as IPv4: tinyproxy matches an IPv4 client as ::ffff:a.b.c.d.
func TestOpenProxyRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ranges  []string
		clients string // "" = not open
		named   []string
	}{
		{"IPv4 /0", []string{"0.0.0.0/0"}, "every IPv4 client", nil},
		{"IPv4 halves", []string{"0.0.0.0/1", "128.0.0.0/1"}, "every IPv4 client", []string{"0.0.0.0/1", "128.0.0.0/1"}},
		{"four IPv4 quarters, unsorted, among others", []string{"192.0.0.0/2", "10.0.0.0/8", "64.0.0.0/2", "128.0.0.0/2", "0.0.0.0/2", "2001:db8::/32"},
			"every IPv4 client", []string{"192.0.0.0/2", "10.0.0.0/8", "64.0.0.0/2", "128.0.0.0/2", "0.0.0.0/2"}},
		{"overlapping and duplicated", []string{"0.0.0.0/1", "0.0.0.0/1", "64.0.0.0/2", "100.0.0.0/7", "128.0.0.0/1"}, "every IPv4 client", nil},
		{"host bits set", []string{"10.1.2.3/1", "200.1.2.3/1"}, "every IPv4 client", []string{"0.0.0.0/1", "128.0.0.0/1"}},
		{"IPv4-mapped range", []string{"::ffff:0:0/96"}, "every IPv4 client", []string{"::ffff:0.0.0.0/96"}},
		{"IPv4-mapped halves", []string{"::ffff:0.0.0.0/97", "::ffff:128.0.0.0/97"}, "every IPv4 client", nil},
		{"an IPv4 half and a mapped half", []string{"0.0.0.0/1", "::ffff:128.0.0.0/97"}, "every IPv4 client", nil},
		{"a wider IPv6 range over the mapped addresses", []string{"::/64"}, "every IPv4 client", nil},
		{"IPv6 halves (::/1 holds the mapped addresses)", []string{"::/1", "8000::/1"}, "every IPv4 client and every IPv6 client", []string{"::/1", "8000::/1"}},
		{"IPv6 /0", []string{"::/0"}, "every IPv4 client and every IPv6 client", nil},
		{"all of IPv6 but the mapped addresses", allOfIPv6ButMapped(), "every IPv6 client", nil},
		{"all of IPv6 but the mapped addresses, and IPv4", append(allOfIPv6ButMapped(), "0.0.0.0/0"), "every IPv4 client and every IPv6 client", nil},

		{"an IPv4 half", []string{"0.0.0.0/1"}, "", nil},
		{"three IPv4 quarters", []string{"0.0.0.0/2", "64.0.0.0/2", "192.0.0.0/2"}, "", nil},
		{"halves but one address", []string{"0.0.0.0/1", "128.0.0.0/2", "192.0.0.0/3", "224.0.0.0/4", "240.0.0.0/5", "248.0.0.0/6", "252.0.0.0/7",
			"254.0.0.0/8", "255.0.0.0/9", "255.128.0.0/10", "255.192.0.0/11", "255.224.0.0/12", "255.240.0.0/13", "255.248.0.0/14", "255.252.0.0/15",
			"255.254.0.0/16", "255.255.0.0/17", "255.255.128.0/18", "255.255.192.0/19", "255.255.224.0/20", "255.255.240.0/21", "255.255.248.0/22",
			"255.255.252.0/23", "255.255.254.0/24", "255.255.255.0/25", "255.255.255.128/26", "255.255.255.192/27", "255.255.255.224/28",
			"255.255.255.240/29", "255.255.255.248/30", "255.255.255.252/31", "255.255.255.254/32"}, "", nil},
		{"an IPv6 half without the mapped addresses", []string{"8000::/1"}, "", nil},
		{"all of IPv6 but the mapped addresses, less one network", allOfIPv6ButMapped()[1:], "", nil},
		{"a mapped half", []string{"::ffff:0.0.0.0/97"}, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Port: 3128, AllowedSourceRanges: tc.ranges}
			_, err := UserData(c, "")
			if tc.clients == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrOpenProxy) {
				t.Fatalf("%v, want ErrOpenProxy", err)
			}
			msg := err.Error()
			for _, want := range []string{"spec.proxy.allowedSourceRanges (", ") together admit " + tc.clients + " (",
				"spec.proxy.basicAuth is not set", "set spec.proxy.allowOpenProxy: true"} {
				if !strings.Contains(msg, want) {
					t.Errorf("%q does not say %q", msg, want)
				}
			}
			if tc.named != nil && !strings.Contains(msg, "("+strings.Join(tc.named, ", ")+")") {
				t.Errorf("%q does not name the ranges %q", msg, tc.named)
			}
			if _, err := SpecHashInput(c, ""); !errors.Is(err, ErrOpenProxy) {
				t.Errorf("the spec hash input: %v, want ErrOpenProxy", err)
			}
			// Credentials, or allowOpenProxy, make the same ranges acceptable.
			withAuth := c
			withAuth.Credentials = &Credentials{Username: "crawler", Password: "Xk9-q.Tr_22"}
			open := c
			open.AllowOpenProxy = true
			for name, c := range map[string]Config{"basic auth": withAuth, "allowOpenProxy": open} {
				if _, err := UserData(c, ""); err != nil {
					t.Errorf("with %s: %v", name, err)
				}
			}
		})
	}
}
