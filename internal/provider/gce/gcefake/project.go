package gcefake

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"
)

// RegionOf is the region of a zone name (europe-west1-b: europe-west1).
func RegionOf(zone string) string {
	if i := strings.LastIndex(zone, "-"); i > 0 {
		return zone[:i]
	}
	return zone
}

// SetZoneStatus sets a zone's status (UP, DOWN).
func (s *Server) SetZoneStatus(zone, status string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if z, ok := s.zones[zone]; ok {
		z.Status = proto.String(status)
	}
}

// SetProjectQuota sets a global quota of the project (FIREWALLS: limit 200 at the start,
// its usage the rules there are unless set).
func (s *Server) SetProjectQuota(metric string, limit, usage float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.projectQuotas {
		if q.GetMetric() == metric {
			q.Limit, q.Usage = proto.Float64(limit), proto.Float64(usage)
			return
		}
	}
	s.projectQuotas = append(s.projectQuotas, &computepb.Quota{Metric: proto.String(metric), Limit: proto.Float64(limit), Usage: proto.Float64(usage)})
}

// SetQuota sets a region's quota of metric.
func (s *Server) SetQuota(region, metric string, limit, usage float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.quotas[region] {
		if q.GetMetric() == metric {
			q.Limit, q.Usage = proto.Float64(limit), proto.Float64(usage)
			return
		}
	}
	s.quotas[region] = append(s.quotas[region], &computepb.Quota{Metric: proto.String(metric), Limit: proto.Float64(limit), Usage: proto.Float64(usage)})
}

func (s *Server) zoneKnown(w http.ResponseWriter, zone string) bool {
	if _, ok := s.zones[zone]; !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s' was not found", s.project, zone))
		return false
	}
	return true
}

func (s *Server) getZone(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.start(w, r, ZonesGet, nil); !ok {
		return
	}
	z, ok := s.zones[r.PathValue("zone")]
	if !ok {
		s.zoneKnown(w, r.PathValue("zone"))
		return
	}
	writeProto(w, z)
}

// machineTypeRE is a predefined machine type of the families the fake knows: the family,
// a class and the vCPU count (n2d-standard-2), or a shared-core type (e2-micro).
var machineTypeRE = regexp.MustCompile(`^(e2|n1|n2|n2d|n4|c2|c2d|c3|c3d|c4|t2d|t2a)-(standard|highcpu|highmem)-([0-9]+)$`)

// sharedCore are the shared-core types and their guestCpus, as GCE reports them.
var sharedCore = map[string]int32{"e2-micro": 2, "e2-small": 2, "e2-medium": 2, "f1-micro": 1, "g1-small": 1}

// getMachineType answers a machine type's guestCpus (what it takes of the CPU quotas);
// a name the fake does not know is 404, as an unoffered type is.
func (s *Server) getMachineType(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.start(w, r, MachineTypesGet, nil); !ok {
		return
	}
	zone, name := r.PathValue("zone"), r.PathValue("name")
	if !s.zoneKnown(w, zone) {
		return
	}
	cpus, shared := sharedCore[name]
	if m := machineTypeRE.FindStringSubmatch(name); m != nil {
		var n int32
		fmt.Sscanf(m[3], "%d", &n)
		cpus = n
	} else if !shared {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s/machineTypes/%s' was not found", s.project, zone, name))
		return
	}
	writeProto(w, &computepb.MachineType{Name: proto.String(name), Zone: proto.String(zone), GuestCpus: proto.Int32(cpus),
		IsSharedCpu: proto.Bool(shared), SelfLink: proto.String(s.link("zones/" + zone + "/machineTypes/" + name))})
}

// getProject answers the project with its global quotas; FIREWALLS counts the rules the
// fake holds, at least the usage SetProjectQuota set.
func (s *Server) getProject(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.start(w, r, ProjectsGet, nil); !ok {
		return
	}
	quotas := make([]*computepb.Quota, 0, len(s.projectQuotas))
	for _, q := range s.projectQuotas {
		q = proto.CloneOf(q)
		if q.GetMetric() == "FIREWALLS" && q.GetUsage() < float64(len(s.firewalls)) {
			q.Usage = proto.Float64(float64(len(s.firewalls)))
		}
		quotas = append(quotas, q)
	}
	writeProto(w, &computepb.Project{Name: proto.String(s.project), Quotas: quotas})
}

func (s *Server) getRegion(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.start(w, r, RegionsGet, nil); !ok {
		return
	}
	region := r.PathValue("region")
	q, ok := s.quotas[region]
	if !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/regions/%s' was not found", s.project, region))
		return
	}
	writeProto(w, &computepb.Region{Name: proto.String(region), Status: proto.String("UP"), Quotas: q})
}
