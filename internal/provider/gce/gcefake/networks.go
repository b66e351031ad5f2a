package gcefake

import (
	"fmt"
	"net/http"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
)

// subnet is a subnetwork of a network in a region; dualStack: stack type IPV4_IPV6
// with an external IPv6 range (ipv6AccessType EXTERNAL).
type subnet struct {
	network   string
	dualStack bool
}

// AddNetwork makes a VPC network of that name (default exists from the start).
func (s *Server) AddNetwork(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.networks[name] = true
}

// AddSubnetwork makes subnetwork name of network in region.
func (s *Server) AddSubnetwork(region, name, network string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subnets[region+"/"+name] = subnet{network: network}
}

// AddDualStackSubnetwork makes subnetwork name of network in region with stack type
// IPV4_IPV6 and an external IPv6 range: its instances may have an external IPv6.
func (s *Server) AddDualStackSubnetwork(region, name, network string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subnets[region+"/"+name] = subnet{network: network, dualStack: true}
}

// checkNetworks refuses an insert whose interfaces name a network or subnetwork the
// project lacks (404), or a subnetwork of another region than the zone's, or of another
// network than the interface's (400), as GCE does. An interface without a network is on
// default. An interface with IPv6 access is refused unless its stack type is IPV4_IPV6,
// each access is DIRECT_IPV6 and its subnetwork is dual-stack with an external IPv6 range
// (an auto-mode network's subnetworks, used when an interface names none, are IPv4
// only).
func (s *Server) checkNetworks(w http.ResponseWriter, zone string, inst *computepb.Instance) bool {
	for i, ni := range inst.GetNetworkInterfaces() {
		if !s.checkIPv6(w, i, ni) {
			return false
		}
		network := "default"
		if ni.Network != nil {
			network = lastPart(ni.GetNetwork())
		}
		if !s.networks[network] {
			writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/global/networks/%s' was not found", s.project, network))
			return false
		}
		if ni.Subnetwork == nil {
			continue
		}
		ref := ni.GetSubnetwork()
		parts := strings.Split(ref, "/")
		if len(parts) < 4 || parts[len(parts)-2] != "subnetworks" || parts[len(parts)-4] != "regions" {
			writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.networkInterfaces[%d].subnetwork': '%s'. The URL is malformed.", i, ref))
			return false
		}
		region, name := parts[len(parts)-3], parts[len(parts)-1]
		sn, ok := s.subnets[region+"/"+name]
		switch {
		case !ok:
			writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/regions/%s/subnetworks/%s' was not found", s.project, region, name))
			return false
		case region != RegionOf(zone):
			writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.networkInterfaces[%d].subnetwork': '%s'. "+
				"The subnetwork is in region %s, not in the instance's region %s.", i, ref, region, RegionOf(zone)))
			return false
		case ni.Network != nil && sn.network != network:
			writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.networkInterfaces[%d].subnetwork': '%s'. "+
				"The subnetwork belongs to network %s, not to %s.", i, ref, sn.network, network))
			return false
		}
	}
	return true
}

// lastPart is what follows a reference's last slash.
func lastPart(ref string) string { return ref[strings.LastIndex(ref, "/")+1:] }

// checkIPv6 refuses IPv6 access on interface i unless the real API would grant it.
func (s *Server) checkIPv6(w http.ResponseWriter, i int, ni *computepb.NetworkInterface) bool {
	stack := ni.GetStackType()
	switch stack {
	case "", "IPV4_ONLY", "IPV4_IPV6":
	default:
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.networkInterfaces[%d].stackType': '%s'.", i, stack))
		return false
	}
	if len(ni.GetIpv6AccessConfigs()) == 0 && stack != "IPV4_IPV6" {
		return true
	}
	if stack != "IPV4_IPV6" {
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.networkInterfaces[%d].ipv6AccessConfigs': "+
			"IPv6 access configs require stack type IPV4_IPV6, not '%s'.", i, stack))
		return false
	}
	for j, ac := range ni.GetIpv6AccessConfigs() {
		if ac.GetType() != "DIRECT_IPV6" {
			writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.networkInterfaces[%d].ipv6AccessConfigs[%d].type': '%s'. Must be DIRECT_IPV6.", i, j, ac.GetType()))
			return false
		}
		if t := ac.GetNetworkTier(); t != "" && t != "PREMIUM" {
			writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.networkInterfaces[%d].ipv6AccessConfigs[%d].networkTier': '%s'. IPv6 access is PREMIUM tier only.", i, j, t))
			return false
		}
	}
	ref := ni.GetSubnetwork()
	parts := strings.Split(ref, "/")
	dual := false
	if len(parts) >= 4 {
		dual = s.subnets[parts[len(parts)-3]+"/"+parts[len(parts)-1]].dualStack
	}
	if !dual {
		if ref == "" {
			ref = "the network's default subnetwork"
		}
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.networkInterfaces[%d].stackType': 'IPV4_IPV6'. "+
			"The subnetwork %s has stack type IPV4_ONLY; IPv6 needs a subnetwork with stack type IPV4_IPV6 and an external IPv6 range.", i, ref))
		return false
	}
	return true
}
