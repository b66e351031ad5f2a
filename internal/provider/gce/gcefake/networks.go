package gcefake

import (
	"fmt"
	"net/http"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
)

// subnet is a subnetwork of a network in a region.
type subnet struct{ network string }

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

// checkNetworks refuses an insert whose interfaces name a network or subnetwork the
// project lacks (404), or a subnetwork of another region than the zone's, or of another
// network than the interface's (400), as GCE does. An interface without a network is on
// default.
func (s *Server) checkNetworks(w http.ResponseWriter, zone string, inst *computepb.Instance) bool {
	for i, ni := range inst.GetNetworkInterfaces() {
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
