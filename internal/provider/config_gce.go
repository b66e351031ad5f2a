package provider

import (
	"fmt"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// GCEConfig is the block of a gce provider entry: proxies as Compute Engine VMs in one
// project.
type GCEConfig struct {
	// Project is the GCP project ID the instances run in.
	Project string `json:"project"`
	// Zones are the zones placement.zone may name; Check probes each of them.
	Zones []string `json:"zones"`
	// MachineTypes maps the names placement.machineType uses to GCE machine types
	// (e2-micro, e2-small, n2d-standard-2...).
	MachineTypes map[string]string `json:"machineTypes"`
	// Images maps the names placement.image uses to GCE images, usually an image family
	// (projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64) or a full image
	// URL. The image must run cloud-init, which reads the user-data: Ubuntu's do, the
	// official Debian GCE images do not.
	Images map[string]string `json:"images"`
	// Network is the VPC network (default global/networks/default).
	Network string `json:"network,omitempty"`
	// Subnetwork is the subnet, needed for custom-mode networks
	// (regions/<region>/subnetworks/<name>).
	Subnetwork string `json:"subnetwork,omitempty"`
	// NetworkTier of the external IP: PREMIUM (default) or STANDARD.
	NetworkTier string `json:"networkTier,omitempty"`
	// ExternalIP gives every instance an ephemeral external IP (default true). Without
	// it the instance's address is its internal one.
	ExternalIP *bool `json:"externalIP,omitempty"`
	// StackType of the instances' interface: IPV4_ONLY (default) or IPV4_IPV6, which
	// gives each instance an external IPv6 address (DIRECT_IPV6, PREMIUM tier) besides
	// its IPv4 one. IPV4_IPV6 needs a subnetwork with stack type IPV4_IPV6 and an
	// external IPv6 range.
	StackType string `json:"stackType,omitempty"`
	// Spot runs Spot VMs (provisioningModel SPOT, instanceTerminationAction DELETE).
	Spot bool `json:"spot,omitempty"`
	// DiskSizeGb is the boot disk size (default 10).
	DiskSizeGb int `json:"diskSizeGb,omitempty"`
	// Firewall, when set, makes the provider manage one firewall rule per instance.
	Firewall *GCEFirewall `json:"firewall,omitempty"`
	// CredentialsFile is a service-account key file; without it Application Default
	// Credentials are used.
	CredentialsFile string `json:"credentialsFile,omitempty"`
	// Endpoint overrides the Compute API endpoint (tests, private endpoints).
	Endpoint string `json:"endpoint,omitempty"`
	// WithoutAuthentication sends no credentials at all; only for a test endpoint.
	WithoutAuthentication bool `json:"withoutAuthentication,omitempty"`
}

// GCEFirewall configures the per-instance firewall rule: it admits the proxy port from
// the Proxy's allowed sources (spec.proxy.allowedSourceRanges, else SourceRanges) to the
// instance, which carries TargetTag.
type GCEFirewall struct {
	// TargetTag is the network tag every instance carries (default egress-proxy).
	TargetTag string `json:"targetTag,omitempty"`
	// ManageRules makes the provider write and delete one rule per instance (default
	// true); false only tags the instances, for a rule of the admin's own on TargetTag.
	ManageRules *bool `json:"manageRules,omitempty"`
	// SourceRanges are used when the request names no allowed sources.
	SourceRanges []string `json:"sourceRanges,omitempty"`
}

// Defaults of the GCEConfig block.
const (
	DefaultGCENetwork     = "global/networks/default"
	DefaultGCENetworkTier = "PREMIUM"
	DefaultGCEDiskSizeGb  = 10
	DefaultGCETargetTag   = "egress-proxy"
)

// Stack types of the GCEConfig block.
const (
	GCEStackIPv4     = "IPV4_ONLY"
	GCEStackDualIPv6 = "IPV4_IPV6"
)

// DualStack reports whether instances get an external IPv6 besides their IPv4.
func (c GCEConfig) DualStack() bool { return c.StackType == GCEStackDualIPv6 }

// WithDefaults returns a copy of c with every unset field at its default; maps and
// slices are copied.
func (c GCEConfig) WithDefaults() GCEConfig {
	out := c
	if out.Network == "" {
		out.Network = DefaultGCENetwork
	}
	if out.NetworkTier == "" {
		out.NetworkTier = DefaultGCENetworkTier
	}
	if out.DiskSizeGb == 0 {
		out.DiskSizeGb = DefaultGCEDiskSizeGb
	}
	ext := c.ExternalIP == nil || *c.ExternalIP
	out.ExternalIP = &ext
	out.Zones = append([]string(nil), c.Zones...)
	out.MachineTypes = make(map[string]string, len(c.MachineTypes))
	for k, v := range c.MachineTypes {
		out.MachineTypes[k] = v
	}
	out.Images = make(map[string]string, len(c.Images))
	for k, v := range c.Images {
		out.Images[k] = v
	}
	if c.Firewall != nil {
		fw := *c.Firewall
		if fw.TargetTag == "" {
			fw.TargetTag = DefaultGCETargetTag
		}
		fw.SourceRanges = append([]string(nil), c.Firewall.SourceRanges...)
		out.Firewall = &fw
	}
	return out
}

// ManagesFirewallRules reports whether the provider writes a firewall rule per instance.
func (c GCEConfig) ManagesFirewallRules() bool {
	return c.Firewall != nil && (c.Firewall.ManageRules == nil || *c.Firewall.ManageRules)
}

// HasExternalIP reports whether instances get an external IP.
func (c GCEConfig) HasExternalIP() bool { return c.ExternalIP == nil || *c.ExternalIP }

var (
	// gceProjectRE: 6 to 30 lowercase letters, digits and dashes, starting with a letter
	// (domain-scoped projects, example.com:name, are allowed too).
	gceProjectRE = regexp.MustCompile(`^([a-z][a-z0-9.-]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$`)
	// gceZoneRE: region-zone, such as europe-west1-b.
	gceZoneRE = regexp.MustCompile(`^[a-z]+-[a-z]+[0-9]+-[a-z]$`)
	// gceRFC1035RE: a GCE resource name (machine types, tags).
	gceRFC1035RE = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

// Validate checks the block and returns every problem, each prefixed with block and the
// path inside it, for example `gce.zones[1]: "europe-west1" is not a zone name`.
func (c GCEConfig) Validate(block string) []error {
	var problems []error
	add := func(path, format string, args ...any) {
		problems = append(problems, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
	}
	switch {
	case c.Project == "":
		add(block, "project is required")
	case !gceProjectRE.MatchString(c.Project):
		add(block, "project %q is not a project ID (6 to 30 lowercase letters, digits and dashes, starting with a letter)", c.Project)
	}
	if len(c.Zones) == 0 {
		add(block, "zones needs at least one entry")
	}
	seen := map[string]int{}
	for i, z := range c.Zones {
		path := fmt.Sprintf("%s.zones[%d]", block, i)
		if j, dup := seen[z]; dup {
			add(path, "zone %q is already listed at %s.zones[%d]", z, block, j)
			continue
		}
		seen[z] = i
		if !gceZoneRE.MatchString(z) {
			add(path, "%q is not a zone name (such as europe-west1-b)", z)
		}
	}
	for _, cat := range []struct {
		name    string
		entries map[string]string
		problem func(string) string
	}{
		{"machineTypes", c.MachineTypes, func(mt string) string {
			if gceRFC1035RE.MatchString(mt) {
				return ""
			}
			return fmt.Sprintf("%q is not a machine type name (such as e2-small)", mt)
		}},
		{"images", c.Images, gceImageProblem},
	} {
		if len(cat.entries) == 0 {
			add(block, "%s needs at least one entry", cat.name)
		}
		for _, key := range sortedKeys(cat.entries) {
			if !validName(key) {
				add(block+"."+cat.name, "key %q: %s", key, nameChars)
			} else if msg := cat.problem(cat.entries[key]); msg != "" {
				add(block+"."+cat.name+"."+key, "%s", msg)
			}
		}
	}
	if c.Subnetwork != "" {
		region, ok := gceSubnetworkRegion(c.Subnetwork)
		if !ok {
			add(block, "subnetwork %q is not regions/<region>/subnetworks/<name> (or that path under projects/<project>/, or its URL)", c.Subnetwork)
		}
		for i, z := range c.Zones {
			if ok && gceZoneRE.MatchString(z) && gceZoneRegion(z) != region {
				add(fmt.Sprintf("%s.zones[%d]", block, i), "zone %q is in region %s, but subnetwork %s is in region %s: a subnetwork is regional, "+
					"so list zones of %s only (or make one provider entry per region)", z, gceZoneRegion(z), c.Subnetwork, region, region)
			}
		}
	}
	switch c.NetworkTier {
	case "", "PREMIUM", "STANDARD":
	default:
		add(block, "networkTier must be PREMIUM or STANDARD, got %q", c.NetworkTier)
	}
	switch c.StackType {
	case "", GCEStackIPv4:
	case GCEStackDualIPv6:
		if c.Subnetwork == "" {
			add(block, "stackType IPV4_IPV6 needs a subnetwork: the default network's subnetworks are IPv4 only, so name a subnetwork with stack type IPV4_IPV6 and an external IPv6 range")
		}
		if c.NetworkTier == "STANDARD" {
			add(block, "stackType IPV4_IPV6 needs networkTier PREMIUM: GCE gives external IPv6 addresses in the PREMIUM tier only")
		}
	default:
		add(block, "stackType must be IPV4_ONLY or IPV4_IPV6, got %q", c.StackType)
	}
	if c.DiskSizeGb < 0 {
		add(block, "diskSizeGb must be at least 1, got %d", c.DiskSizeGb)
	}
	if c.Firewall != nil {
		if t := c.Firewall.TargetTag; t != "" && !gceRFC1035RE.MatchString(t) {
			add(block+".firewall", "targetTag %q must be a lowercase name of letters, digits and dashes, starting with a letter", t)
		}
		for i, r := range c.Firewall.SourceRanges {
			if _, err := netip.ParsePrefix(r); err != nil {
				add(fmt.Sprintf("%s.firewall.sourceRanges[%d]", block, i), "%q is not a CIDR", r)
			}
		}
		if msg := MixedFamilies(c.Firewall.SourceRanges); msg != "" && c.StackType != GCEStackDualIPv6 {
			add(block+".firewall.sourceRanges", "%s", msg)
		}
	}
	if c.Endpoint != "" {
		if u, err := url.Parse(c.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			add(block, "endpoint %q must be an http or https URL with a host", RedactURL(c.Endpoint))
		}
	}
	if c.WithoutAuthentication && c.CredentialsFile != "" {
		add(block, "credentialsFile and withoutAuthentication exclude each other")
	}
	if c.WithoutAuthentication && c.Endpoint == "" {
		add(block, "withoutAuthentication needs an endpoint (the real API refuses unauthenticated calls)")
	}
	return problems
}

// gceImageProblem checks an image reference: a partial or full URL of an image or an
// image family, such as projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64.
func gceImageProblem(ref string) string {
	if ref == "" {
		return "image is required"
	}
	rest := ref
	if strings.HasPrefix(ref, "https://") {
		u, err := url.Parse(ref)
		if err != nil || u.Host == "" {
			return fmt.Sprintf("%q is not a valid URL", ref)
		}
		rest = strings.TrimPrefix(u.Path, "/compute/v1/")
	}
	parts := strings.Split(strings.TrimPrefix(rest, "global/"), "/")
	switch {
	case slices.Contains(parts, ""):
	case len(parts) == 5 && parts[0] == "projects" && parts[2] == "global" && parts[3] == "images",
		len(parts) == 6 && parts[0] == "projects" && parts[2] == "global" && parts[3] == "images" && parts[4] == "family",
		len(parts) == 2 && parts[0] == "images",
		len(parts) == 3 && parts[0] == "images" && parts[1] == "family":
		return ""
	}
	return fmt.Sprintf("%q is not an image or image family (such as projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64)", ref)
}

// MixedFamilies says why ranges cannot go into the one GCE firewall rule an IPv4-only
// instance gets when they mix IPv4 and IPv6 CIDRs (the API refuses such a rule, and such
// an instance has no IPv6 address), naming the first of each family; "" when they do not
// (ranges that are not CIDRs are left to their own check). A dual-stack provider splits
// them into a rule per family instead.
func MixedFamilies(ranges []string) string {
	v4, v6 := firstOfFamilies(ranges)
	if v4 == "" || v6 == "" {
		return ""
	}
	return fmt.Sprintf("mixes IPv4 (%s) and IPv6 (%s) ranges, which one GCE firewall rule cannot hold; "+
		"with gce.stackType IPV4_ONLY the VMs have no IPv6 address, so list the IPv4 ranges "+
		"(or set gce.stackType IPV4_IPV6: the provider then writes a second rule for the IPv6 ranges)", v4, v6)
}

// gceZoneRegion is the region of a zone name (europe-west1-b: europe-west1).
func gceZoneRegion(zone string) string {
	return zone[:strings.LastIndex(zone, "-")]
}

// gceSubnetworkRegion reads the region of a subnetwork reference:
// regions/<r>/subnetworks/<n>, projects/<p>/regions/<r>/subnetworks/<n>, or a URL of it.
func gceSubnetworkRegion(ref string) (string, bool) {
	rest := ref
	if strings.HasPrefix(ref, "https://") {
		u, err := url.Parse(ref)
		if err != nil || u.Host == "" {
			return "", false
		}
		rest = strings.TrimPrefix(u.Path, "/compute/v1/")
	}
	parts := strings.Split(rest, "/")
	if len(parts) == 6 && parts[0] == "projects" && parts[1] != "" {
		parts = parts[2:]
	}
	if len(parts) != 4 || parts[0] != "regions" || parts[2] != "subnetworks" || parts[1] == "" || !gceRFC1035RE.MatchString(parts[3]) {
		return "", false
	}
	return parts[1], true
}
