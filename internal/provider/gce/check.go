package gce

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// Check reasons.
const (
	reasonReachable      = "Reachable"
	reasonZoneDown       = "ZoneDown"
	reasonQuotaExhausted = "QuotaExhausted"
	reasonUnauthorized   = "Unauthorized"
	reasonForbidden      = "Forbidden"
	reasonNotFound       = "NotFound"
	reasonTimeout        = "Timeout"
	reasonUnreachable    = "Unreachable"
	reasonAPIError       = "APIError"
	reasonCredentials    = "CredentialsUnavailable"
)

// Check reports one status per configured zone, in config order: the zone's status and
// the CPU and in-use address quota headroom of its region (each region read once per
// round), with the CPU quotas each machine type of the catalogue draws on (CPUS or, for
// Spot with a preemptible quota, PREEMPTIBLE_CPUS, and its family's, such as N2D_CPUS)
// compared with its size. A zone is ready when it is UP, at least one machine type fits
// and, with external IPs, one address is left.
func (p *Provider) Check(ctx context.Context) []provider.TargetStatus {
	out := make([]provider.TargetStatus, 0, len(p.cfg.Zones))
	c, cerr := p.client(ctx)
	regions := map[string]*computepb.Region{}
	regionErr := map[string]error{}
	var project *computepb.Project
	var projectErr error
	if cerr == nil && p.cfg.ManagesFirewallRules() {
		projectErr = p.call(ctx, "projects.get", target{}, func(ctx context.Context) (err error) {
			project, err = c.projects.Get(ctx, &computepb.GetProjectRequest{Project: p.cfg.Project})
			return err
		})
	}
	for _, zone := range p.cfg.Zones {
		start := time.Now()
		st := provider.TargetStatus{Target: zone, Details: map[string]string{}}
		if cerr != nil {
			st.Reason, st.Message = reasonCredentials, cerr.Error()
			out = append(out, st)
			continue
		}
		var z *computepb.Zone
		err := p.call(ctx, "zones.get", target{zone: zone}, func(ctx context.Context) (err error) {
			z, err = c.zones.Get(ctx, &computepb.GetZoneRequest{Project: p.cfg.Project, Zone: zone})
			return err
		})
		if err != nil {
			st.Latency = time.Since(start)
			st.Reason, st.Message = checkReason(ctx, err), fmt.Sprintf("zone %s: %v", zone, err)
			out = append(out, st)
			continue
		}
		region := lastSegment(z.GetRegion())
		st.Details["region"] = region
		st.Details["zoneStatus"] = z.GetStatus()
		r, seen := regions[region]
		rerr := regionErr[region]
		if !seen && rerr == nil {
			rerr = p.call(ctx, "regions.get", target{region: region}, func(ctx context.Context) (err error) {
				r, err = c.regions.Get(ctx, &computepb.GetRegionRequest{Project: p.cfg.Project, Region: region})
				return err
			})
			regions[region], regionErr[region] = r, rerr
		}
		st.Latency = time.Since(start)
		if rerr != nil {
			st.Reason, st.Message = checkReason(ctx, rerr), fmt.Sprintf("region %s: %v", region, rerr)
			out = append(out, st)
			continue
		}
		addrs, addrOK := headroom(r, "IN_USE_ADDRESSES", st.Details, "inUseAddresses")
		var rules float64
		rulesOK := false
		if project != nil {
			rules, rulesOK = headroom(&computepb.Region{Quotas: project.GetQuotas()}, "FIREWALLS", st.Details, "firewalls")
		}
		short, fits, err := p.machineTypesFit(ctx, c, zone, r, st.Details)
		switch {
		case z.GetStatus() != "UP":
			st.Reason, st.Message = reasonZoneDown, fmt.Sprintf("zone %s is %s", zone, z.GetStatus())
		case err != nil:
			st.Reason, st.Message = checkReason(ctx, err), fmt.Sprintf("zone %s: %v", zone, err)
		case projectErr != nil:
			st.Reason, st.Message = checkReason(ctx, projectErr), fmt.Sprintf("project %s (firewall-rule quota): %v", p.cfg.Project, projectErr)
		case rulesOK && rules < 1:
			st.Reason, st.Message = reasonQuotaExhausted, fmt.Sprintf("project %s has no firewall-rule quota left (%s): each standalone Proxy and each pool (per source ranges and port) needs a rule", p.cfg.Project, st.Details["firewalls"])
		case !fits:
			st.Reason, st.Message = reasonQuotaExhausted, fmt.Sprintf("region %s: no machine type fits the CPU quota left: %s", region, strings.Join(short, "; "))
		case p.cfg.HasExternalIP() && addrOK && addrs < 1:
			st.Reason, st.Message = reasonQuotaExhausted, fmt.Sprintf("region %s has no in-use address quota left (%s)", region, st.Details["inUseAddresses"])
		default:
			st.Ready, st.Reason = true, reasonReachable
			st.Message = fmt.Sprintf("zone %s is UP; region %s: %s CPUs, %s in-use addresses", zone, region, st.Details["cpus"], st.Details["inUseAddresses"])
			if rulesOK {
				st.Message += ", " + st.Details["firewalls"] + " firewall rules"
			}
			if len(short) > 0 {
				st.Message += "; not fitting the quota left: " + strings.Join(short, "; ")
			}
		}
		out = append(out, st)
	}
	return out
}

// machineTypesFit reads the size (guestCpus) of every machine type of the catalogue in
// zone and compares it with the CPU quotas it draws on in region r: CPUS (or, for Spot
// with a preemptible quota granted, PREEMPTIBLE_CPUS instead) and its family's own quota
// (N2D_CPUS for n2d-standard-2) when the region has one. short names each type that does
// not fit and why; fits is whether at least one does. A type the zone does not offer is an
// error, named.
func (p *Provider) machineTypesFit(ctx context.Context, c *clients, zone string, r *computepb.Region, details map[string]string) (short []string, fits bool, err error) {
	headroom(r, "CPUS", details, "cpus")
	keys := make([]string, 0, len(p.cfg.MachineTypes))
	for k := range p.cfg.MachineTypes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		name := p.cfg.MachineTypes[key]
		var mt *computepb.MachineType
		err := p.call(ctx, "machineTypes.get", target{zone: zone}, func(ctx context.Context) (err error) {
			mt, err = c.mtypes.Get(ctx, &computepb.GetMachineTypeRequest{Project: p.cfg.Project, Zone: zone, MachineType: name})
			return err
		})
		if err != nil {
			return nil, false, fmt.Errorf("machine type %s (gce.machineTypes.%s): %w", name, key, err)
		}
		need := float64(mt.GetGuestCpus())
		details["machineType."+key] = fmt.Sprintf("%s %d vCPUs", name, mt.GetGuestCpus())
		metrics := []string{"CPUS"}
		if p.cfg.Spot && quotaLimit(r, "PREEMPTIBLE_CPUS") > 0 {
			// Spot VMs draw on the preemptible quota when one is granted, else on CPUS.
			metrics[0] = "PREEMPTIBLE_CPUS"
		}
		if family, _, ok := strings.Cut(name, "-"); ok {
			metrics = append(metrics, strings.ToUpper(family)+"_CPUS")
		}
		ok := true
		for _, m := range metrics {
			detail := m
			if m == "CPUS" {
				detail = "cpus"
			}
			left, known := headroom(r, m, details, detail)
			if known && left < need {
				short = append(short, fmt.Sprintf("%s (%s) needs %g %s, %g left", key, name, need, m, left))
				ok = false
			}
		}
		fits = fits || ok
	}
	return short, fits, nil
}

// quotaLimit is the limit of a region quota, 0 when the region has none.
func quotaLimit(r *computepb.Region, metric string) float64 {
	for _, q := range r.GetQuotas() {
		if q.GetMetric() == metric {
			return q.GetLimit()
		}
	}
	return 0
}

// headroom is limit minus usage of a region quota, recorded in details as used/limit.
func headroom(r *computepb.Region, metric string, details map[string]string, key string) (float64, bool) {
	for _, q := range r.GetQuotas() {
		if q.GetMetric() == metric {
			details[key] = fmt.Sprintf("%g/%g", q.GetUsage(), q.GetLimit())
			return q.GetLimit() - q.GetUsage(), true
		}
	}
	return 0, false
}

// checkReason names why a check call failed.
func checkReason(ctx context.Context, err error) string {
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		return reasonTimeout
	}
	switch code := httpCode(err); {
	case code == http.StatusUnauthorized:
		return reasonUnauthorized
	case code == http.StatusForbidden:
		return reasonForbidden
	case code == http.StatusNotFound:
		return reasonNotFound
	case code != 0:
		return reasonAPIError
	}
	return reasonUnreachable
}
