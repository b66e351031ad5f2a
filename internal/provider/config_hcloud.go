package provider

import (
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
)

// HCloudConfig is the block of an hcloud provider entry: proxies as Hetzner Cloud servers
// in the one project the token belongs to.
type HCloudConfig struct {
	// TokenFile is a file holding the project's API token (read/write), usually a Secret
	// key mounted into the manager. It is read on every call, so a rotated Secret is used
	// at once; the token never appears in a message or log line.
	TokenFile string `json:"tokenFile"`
	// Locations are the locations placement.zone may name (fsn1, nbg1, hel1, ash, hil,
	// sin); Check probes each of them.
	Locations []string `json:"locations"`
	// ServerTypes are the server type names placement.machineType may name (cx22,
	// cpx11, cax11...).
	ServerTypes []string `json:"serverTypes"`
	// Images are the image names or numeric IDs placement.image may name (ubuntu-24.04,
	// debian-12, or the ID of a snapshot). Hetzner's system images run cloud-init.
	Images []string `json:"images"`
	// IPv6 gives every server its IPv6 /64 besides its primary IPv4 (default true); the
	// Proxy's status.ipv6 is the /64's ::1 address.
	IPv6 *bool `json:"ipv6,omitempty"`
	// Firewall, when set, makes the provider manage one Hetzner firewall per Proxy.
	Firewall *HCloudFirewall `json:"firewall,omitempty"`
	// Limits are the project's resource limits as Hetzner set them (Console, the
	// project's Limits page): the API does not publish them, so Check compares the
	// project's usage with these when they are given.
	Limits *HCloudLimits `json:"limits,omitempty"`
	// Endpoint overrides the API endpoint (tests); default https://api.hetzner.cloud/v1.
	Endpoint string `json:"endpoint,omitempty"`
}

// HCloudFirewall configures the per-Proxy firewall: it admits TCP on the proxy port from
// the Proxy's allowed sources (spec.proxy.allowedSourceRanges, else SourceRanges).
type HCloudFirewall struct {
	// SourceRanges are used when the request names no allowed sources.
	SourceRanges []string `json:"sourceRanges,omitempty"`
}

// HCloudLimits are a project's limits; zero means not known.
type HCloudLimits struct {
	Servers    int `json:"servers,omitempty"`
	PrimaryIPs int `json:"primaryIPs,omitempty"`
	Firewalls  int `json:"firewalls,omitempty"`
}

// HCloudUserDataLimit is the most user-data Hetzner Cloud takes on a server (32 KiB).
const HCloudUserDataLimit = 32 * 1024

// HasIPv6 reports whether servers get their IPv6 /64.
func (c HCloudConfig) HasIPv6() bool { return c.IPv6 == nil || *c.IPv6 }

// ManagesFirewall reports whether the provider writes a firewall per Proxy.
func (c HCloudConfig) ManagesFirewall() bool { return c.Firewall != nil }

var (
	// hcloudLocationRE: a location name, such as fsn1, nbg1, hel1, ash, hil, sin.
	hcloudLocationRE = regexp.MustCompile(`^[a-z]{3}[0-9]?$`)
	// hcloudNameRE: a server type or image name (cx22, cax11, ubuntu-24.04).
	hcloudNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,62})$`)
)

// Validate checks the block and returns every problem, each prefixed with block and the
// path inside it, for example `hcloud.locations[1]: "Falkenstein" is not a location name`.
func (c HCloudConfig) Validate(block string) []error {
	var problems []error
	add := func(path, format string, args ...any) {
		problems = append(problems, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}
	if c.TokenFile == "" {
		add(block, "tokenFile is required (a file holding the project's API token, such as a mounted Secret)")
	}
	for _, cat := range []struct {
		name    string
		entries []string
		problem func(string) string
	}{
		{"locations", c.Locations, func(s string) string {
			if hcloudLocationRE.MatchString(s) {
				return ""
			}
			return fmt.Sprintf("%q is not a location name (such as fsn1, nbg1, hel1, ash, hil, sin)", s)
		}},
		{"serverTypes", c.ServerTypes, func(s string) string {
			if hcloudNameRE.MatchString(s) {
				return ""
			}
			return fmt.Sprintf("%q is not a server type name (such as cx22, cpx11, cax11)", s)
		}},
		{"images", c.Images, func(s string) string {
			if id, err := strconv.ParseInt(s, 10, 64); err == nil && id > 0 || hcloudNameRE.MatchString(s) {
				return ""
			}
			return fmt.Sprintf("%q is not an image name or ID (such as ubuntu-24.04, or the number of a snapshot)", s)
		}},
	} {
		if len(cat.entries) == 0 {
			add(block, "%s needs at least one entry", cat.name)
		}
		seen := map[string]int{}
		for i, s := range cat.entries {
			path := fmt.Sprintf("%s.%s[%d]", block, cat.name, i)
			if j, dup := seen[s]; dup {
				add(path, "%q is already listed at %s.%s[%d]", s, block, cat.name, j)
				continue
			}
			seen[s] = i
			if msg := cat.problem(s); msg != "" {
				add(path, "%s", msg)
			}
		}
	}
	if c.Firewall != nil {
		for i, r := range c.Firewall.SourceRanges {
			if _, err := netip.ParsePrefix(r); err != nil {
				add(fmt.Sprintf("%s.firewall.sourceRanges[%d]", block, i), "%q is not a CIDR", r)
			}
		}
		if msg := HCloudMixedFamilies(c.Firewall.SourceRanges); msg != "" && !c.HasIPv6() {
			add(block+".firewall.sourceRanges", "%s", msg)
		}
	}
	if l := c.Limits; l != nil {
		for _, f := range []struct {
			name string
			v    int
		}{{"servers", l.Servers}, {"primaryIPs", l.PrimaryIPs}, {"firewalls", l.Firewalls}} {
			if f.v < 0 {
				add(block+".limits", "%s must be at least 1 (or left out), got %d", f.name, f.v)
			}
		}
	}
	if c.Endpoint != "" {
		if u, err := url.Parse(c.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			add(block, "endpoint %q must be an http or https URL with a host", RedactURL(c.Endpoint))
		}
	}
	return problems
}

// HCloudMixedFamilies says why ranges cannot be admitted by a server without IPv6 (an
// hcloud entry with ipv6: false) when they mix IPv4 and IPv6 CIDRs, naming the first of
// each family; "" when they do not. With IPv6 on, one Hetzner firewall rule holds both.
func HCloudMixedFamilies(ranges []string) string {
	v4, v6 := firstOfFamilies(ranges)
	if v4 == "" || v6 == "" {
		return ""
	}
	return fmt.Sprintf("mixes IPv4 (%s) and IPv6 (%s) ranges, but with hcloud.ipv6 false the servers have no IPv6 address "+
		"to admit the IPv6 ones to: list the IPv4 ranges (or leave hcloud.ipv6 on, its default)", v4, v6)
}

// firstOfFamilies returns the first IPv4 and the first IPv6 CIDR of ranges ("" when
// there is none); ranges that are not CIDRs are skipped.
func firstOfFamilies(ranges []string) (v4, v6 string) {
	for _, r := range ranges {
		pfx, err := netip.ParsePrefix(r)
		switch {
		case err != nil:
		case pfx.Addr().Is4() && v4 == "":
			v4 = r
		case pfx.Addr().Is6() && v6 == "":
			v6 = r
		}
	}
	return v4, v6
}
