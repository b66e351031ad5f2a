package proxyconfig

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// ErrOpenProxy is wrapped by the error about source ranges that together admit every
// IPv4 or every IPv6 client while the proxy asks for no credentials and
// spec.proxy.allowOpenProxy is not set. The API server's rule catches a /0 alone; split
// ranges (0.0.0.0/1 and 128.0.0.0/1) need the union, which CEL cannot compute.
var ErrOpenProxy = errors.New("an open proxy: anyone could use it")

// The address space tinyproxy matches clients in: IPv6, with an IPv4 client as its
// IPv4-mapped address (::ffff:a.b.c.d). An Allow line of ::ffff:0:0/96, or of ::/1, so
// admits every IPv4 client, as tinyproxy 1.11.1 does: checked on Debian's tinyproxy.
var (
	ipv4Space = []span{{netip.MustParseAddr("::ffff:0.0.0.0"), netip.MustParseAddr("::ffff:255.255.255.255")}}
	ipv6Space = []span{ // outside the IPv4-mapped addresses
		{netip.MustParseAddr("::"), netip.MustParseAddr("::fffe:ffff:ffff")},
		{netip.MustParseAddr("::1:0:0:0"), netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")},
	}
)

// span is the addresses from first to last, both included, in tinyproxy's space.
type span struct{ first, last netip.Addr }

// spanOf is p's addresses in tinyproxy's space: an IPv4 network as IPv4-mapped.
func spanOf(p netip.Prefix) span {
	p = p.Masked()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	b := p.Addr().As16()
	for i := bits; i < 128; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return span{netip.AddrFrom16(p.Addr().As16()), netip.AddrFrom16(b)}
}

// union is the spans' union: sorted, overlapping and adjacent spans merged.
func union(spans []span) []span {
	slices.SortFunc(spans, func(a, b span) int { return a.first.Compare(b.first) })
	var out []span
	for _, s := range spans {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if next := last.last.Next(); !next.IsValid() || s.first.Compare(next) <= 0 {
				if s.last.Compare(last.last) > 0 {
					last.last = s.last
				}
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

// covers: merged (a union) holds every address of want.
func covers(merged, want []span) bool {
	for _, w := range want {
		if !slices.ContainsFunc(merged, func(s span) bool { return s.first.Compare(w.first) <= 0 && w.last.Compare(s.last) <= 0 }) {
			return false
		}
	}
	return true
}

// overlaps: s shares an address with one of spans.
func overlaps(s span, spans []span) bool {
	return slices.ContainsFunc(spans, func(w span) bool { return s.first.Compare(w.last) <= 0 && w.first.Compare(s.last) <= 0 })
}

// openTo names the clients the source ranges admit all of, as tinyproxy matches them:
// "every IPv4 client" when their union covers the IPv4-mapped space (IPv4 ranges, and
// IPv6 ranges overlapping ::ffff:0:0/96), "every IPv6 client" when it covers all of
// IPv6 outside that space, both joined by "and"; "" when neither. culprits are the
// ranges in the space covered.
func openTo(sources []netip.Prefix) (clients string, culprits []netip.Prefix) {
	spans := make([]span, len(sources))
	for i, p := range sources {
		spans[i] = spanOf(p)
	}
	merged := union(slices.Clone(spans))
	var space []span
	var all []string
	for _, fam := range []struct {
		clients string
		space   []span
	}{{"every IPv4 client", ipv4Space}, {"every IPv6 client", ipv6Space}} {
		if covers(merged, fam.space) {
			all, space = append(all, fam.clients), append(space, fam.space...)
		}
	}
	if len(all) == 0 {
		return "", nil
	}
	clients = strings.Join(all, " and ")
	for i, s := range spans {
		if overlaps(s, space) {
			culprits = append(culprits, sources[i])
		}
	}
	return clients, culprits
}

// checkOpen refuses source ranges that admit every IPv4 or IPv6 client of a proxy that
// asks for no credentials, unless allowOpenProxy says so on purpose. field is the path
// of the ranges (spec.proxy.allowedSourceRanges or a pool template's).
func checkOpen(field string, sources []netip.Prefix, credentials, allowOpenProxy bool) error {
	if credentials || allowOpenProxy {
		return nil
	}
	clients, culprits := openTo(sources)
	if clients == "" {
		return nil
	}
	names := make([]string, len(culprits))
	for i, p := range culprits {
		names[i] = p.String()
	}
	base := strings.TrimSuffix(field, ".allowedSourceRanges")
	return fmt.Errorf("%w: %s (%s) together admit %s (an IPv6 range over the IPv4-mapped addresses ::ffff:0:0/96, such as ::/80, admits IPv4 clients) and %s.basicAuth is not set. "+
		"Add %s.basicAuth (a Secret with the credentials), narrow the ranges to the crawlers' networks, or set %s.allowOpenProxy: true to run an open proxy on purpose",
		ErrOpenProxy, field, strings.Join(names, ", "), clients, base, base, base)
}
