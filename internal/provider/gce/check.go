package gce

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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
// round). A zone is ready when it is UP and its region has at least one CPU and, with
// external IPs, one address to spare.
func (p *Provider) Check(ctx context.Context) []provider.TargetStatus {
	out := make([]provider.TargetStatus, 0, len(p.cfg.Zones))
	c, cerr := p.client(ctx)
	regions := map[string]*computepb.Region{}
	regionErr := map[string]error{}
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
		cpus, cpuOK := headroom(r, "CPUS", st.Details, "cpus")
		addrs, addrOK := headroom(r, "IN_USE_ADDRESSES", st.Details, "inUseAddresses")
		switch {
		case z.GetStatus() != "UP":
			st.Reason, st.Message = reasonZoneDown, fmt.Sprintf("zone %s is %s", zone, z.GetStatus())
		case cpuOK && cpus < 1:
			st.Reason, st.Message = reasonQuotaExhausted, fmt.Sprintf("region %s has no CPU quota left (%s)", region, st.Details["cpus"])
		case p.cfg.HasExternalIP() && addrOK && addrs < 1:
			st.Reason, st.Message = reasonQuotaExhausted, fmt.Sprintf("region %s has no in-use address quota left (%s)", region, st.Details["inUseAddresses"])
		default:
			st.Ready, st.Reason = true, reasonReachable
			st.Message = fmt.Sprintf("zone %s is UP; region %s: %s CPUs, %s in-use addresses", zone, region, st.Details["cpus"], st.Details["inUseAddresses"])
		}
		out = append(out, st)
	}
	return out
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
