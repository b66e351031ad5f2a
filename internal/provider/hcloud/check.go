package hcloud

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	hc "github.com/hetznercloud/hcloud-go/v2/hcloud"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// Check reasons.
const (
	reasonReachable         = "Reachable"
	reasonTokenUnavailable  = "TokenUnavailable"
	reasonUnauthorized      = "Unauthorized"
	reasonForbidden         = "Forbidden"
	reasonRateLimited       = "RateLimited"
	reasonLocationUnknown   = "LocationUnknown"
	reasonServerTypeUnknown = "ServerTypeUnknown"
	reasonUnavailable       = "Unavailable"
	reasonQuotaExhausted    = "QuotaExhausted"
	reasonTimeout           = "Timeout"
	reasonUnreachable       = "Unreachable"
	reasonAPIError          = "APIError"
)

// catalogue is what one Check round reads from the API, once for all locations.
type catalogue struct {
	locations   map[string]bool
	serverTypes map[string]*hc.ServerType
	// used counts the project's servers, primary IPs and firewalls.
	servers, primaryIPs, firewalls int
	ratelimit                      hc.Ratelimit
}

// Check reports one status per configured location, in config order. One round reads the
// token, the API's locations (which tells the token is valid), its server types and the
// project's servers, primary IPs and firewalls (five requests, more when a list has more
// than one page). A location is ready when the API knows it, every configured server type
// is known and at least one of them is available there now, and the project is below the
// limits the config gives.
func (p *Provider) Check(ctx context.Context) []provider.TargetStatus {
	out := make([]provider.TargetStatus, 0, len(p.cfg.Locations))
	start := time.Now()
	cat, reason, err := p.readCatalogue(ctx)
	latency := time.Since(start)
	for _, loc := range p.cfg.Locations {
		st := provider.TargetStatus{Target: loc, Latency: latency, Details: map[string]string{}}
		if err != nil {
			st.Reason, st.Message = reason, err.Error()
			out = append(out, st)
			continue
		}
		p.judge(loc, cat, &st)
		out = append(out, st)
	}
	return out
}

// readCatalogue reads what Check needs; on failure it returns the reason every location
// gets.
func (p *Provider) readCatalogue(ctx context.Context) (*catalogue, string, error) {
	c, err := p.client()
	if err != nil {
		return nil, reasonTokenUnavailable, err
	}
	cat := &catalogue{locations: map[string]bool{}, serverTypes: map[string]*hc.ServerType{}}
	locs, resp, err := c.Location.List(ctx, hc.LocationListOpts{ListOpts: hc.ListOpts{PerPage: 50}})
	if err != nil {
		return nil, checkReason(ctx, err), p.classify(err, "listing locations")
	}
	if resp != nil {
		cat.ratelimit = resp.Meta.Ratelimit
	}
	for _, l := range locs {
		cat.locations[l.Name] = true
	}
	types, err := c.ServerType.All(ctx)
	if err != nil {
		return nil, checkReason(ctx, err), p.classify(err, "listing server types")
	}
	for _, t := range types {
		cat.serverTypes[t.Name] = t
	}
	servers, err := c.Server.All(ctx)
	if err != nil {
		return nil, checkReason(ctx, err), p.classify(err, "listing servers")
	}
	ips, err := c.PrimaryIP.All(ctx)
	if err != nil {
		return nil, checkReason(ctx, err), p.classify(err, "listing primary IPs")
	}
	fws, err := c.Firewall.All(ctx)
	if err != nil {
		return nil, checkReason(ctx, err), p.classify(err, "listing firewalls")
	}
	cat.servers, cat.primaryIPs, cat.firewalls = len(servers), len(ips), len(fws)
	return cat, "", nil
}

// judge fills st for location loc from cat.
func (p *Provider) judge(loc string, cat *catalogue, st *provider.TargetStatus) {
	d := st.Details
	if rl := cat.ratelimit; rl.Limit > 0 {
		d["rateLimit"] = fmt.Sprintf("%d/%d left", rl.Remaining, rl.Limit)
	}
	var limits provider.HCloudLimits
	if p.cfg.Limits != nil {
		limits = *p.cfg.Limits
	}
	usage := func(key string, used, limit int) bool {
		d[key] = fmt.Sprint(used)
		if limit > 0 {
			d[key] = fmt.Sprintf("%d/%d", used, limit)
			return used < limit
		}
		return true
	}
	short := []string{}
	if !usage("servers", cat.servers, limits.Servers) {
		short = append(short, "servers "+d["servers"])
	}
	if !usage("primaryIPs", cat.primaryIPs, limits.PrimaryIPs) {
		short = append(short, "primary IPs "+d["primaryIPs"])
	}
	if !usage("firewalls", cat.firewalls, limits.Firewalls) && p.cfg.ManagesFirewall() {
		short = append(short, "firewalls "+d["firewalls"])
	}
	var unknown, available, unavailable []string
	for i, name := range p.cfg.ServerTypes {
		t, ok := cat.serverTypes[name]
		if !ok {
			unknown = append(unknown, fmt.Sprintf("hcloud.serverTypes[%d] %q", i, name))
			continue
		}
		key := "serverType." + name
		switch availableIn(t, loc) {
		case "available":
			available = append(available, name)
			d[key] = fmt.Sprintf("%d vCPU, %g GB, available", t.Cores, t.Memory)
		default:
			unavailable = append(unavailable, name)
			d[key] = fmt.Sprintf("%d vCPU, %g GB, not available in %s", t.Cores, t.Memory, loc)
		}
	}
	i := slices.Index(p.cfg.Locations, loc)
	switch {
	case !cat.locations[loc]:
		st.Reason = reasonLocationUnknown
		st.Message = fmt.Sprintf("hcloud.locations[%d] %q is not a location the API knows (it knows %s)", i, loc, strings.Join(sortedKeys(cat.locations), ", "))
	case len(unknown) > 0:
		st.Reason = reasonServerTypeUnknown
		st.Message = fmt.Sprintf("%s: not a server type the API knows", strings.Join(unknown, ", "))
	case len(available) == 0:
		st.Reason = reasonUnavailable
		st.Message = fmt.Sprintf("location %s: none of the server types %s is available now", loc, strings.Join(p.cfg.ServerTypes, ", "))
	case len(short) > 0:
		st.Reason = reasonQuotaExhausted
		st.Message = fmt.Sprintf("the project is at its limit (hcloud.limits): %s", strings.Join(short, ", "))
	default:
		st.Ready, st.Reason = true, reasonReachable
		st.Message = fmt.Sprintf("location %s: token valid; available: %s; project: %s servers, %s primary IPs, %s firewalls",
			loc, strings.Join(available, ", "), d["servers"], d["primaryIPs"], d["firewalls"])
		if len(unavailable) > 0 {
			st.Message += "; not available now: " + strings.Join(unavailable, ", ")
		}
	}
}

// availableIn says whether server type t can be ordered in location loc now:
// "available", "unavailable" (sold out or deprecated there) or "not offered". A server
// type that reports no locations is taken as available.
func availableIn(t *hc.ServerType, loc string) string {
	if len(t.Locations) == 0 {
		return "available"
	}
	for _, l := range t.Locations {
		if l.Location == nil || l.Location.Name != loc {
			continue
		}
		if l.Available && !l.IsDeprecated() {
			return "available"
		}
		return "unavailable"
	}
	return "not offered"
}

// checkReason names why a Check call failed.
func checkReason(ctx context.Context, err error) string {
	var ae hc.Error
	switch {
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		return reasonTimeout
	case hc.IsError(err, hc.ErrorCodeUnauthorized):
		return reasonUnauthorized
	case hc.IsError(err, hc.ErrorCodeForbidden):
		return reasonForbidden
	case hc.IsError(err, hc.ErrorCodeRateLimitExceeded):
		return reasonRateLimited
	case errors.As(err, &ae), errors.Is(err, hc.ErrStatusCode):
		return reasonAPIError
	}
	return reasonUnreachable
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
