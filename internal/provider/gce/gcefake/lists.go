package gcefake

import (
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"
)

func (s *Server) aggregatedList(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.start(w, r, InstancesAggregatedList, nil); !ok {
		return
	}
	match, err := parseLabelFilter(r.URL.Query().Get("filter"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'filter': %v", err))
		return
	}
	type hit struct {
		zone string
		inst *computepb.Instance
	}
	var hits []hit
	zones := make([]string, 0, len(s.zones))
	for z := range s.zones {
		zones = append(zones, z)
	}
	sort.Strings(zones)
	for _, z := range zones {
		names := make([]string, 0, len(s.instances[z]))
		for n := range s.instances[z] {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			if inst := s.instances[z][n]; match(inst.Labels) {
				hits = append(hits, hit{z, inst})
			}
		}
	}
	from, to, ok := s.page(w, r, len(hits))
	if !ok {
		return
	}
	out := &computepb.InstanceAggregatedList{Items: map[string]*computepb.InstancesScopedList{}}
	for _, h := range hits[from:to] {
		key := "zones/" + h.zone
		if out.Items[key] == nil {
			out.Items[key] = &computepb.InstancesScopedList{}
		}
		out.Items[key].Instances = append(out.Items[key].Instances, h.inst)
	}
	for _, z := range zones {
		if out.Items["zones/"+z] == nil {
			out.Items["zones/"+z] = &computepb.InstancesScopedList{Warning: &computepb.Warning{Code: proto.String("NO_RESULTS_ON_PAGE"),
				Message: proto.String("There are no results for scope 'zones/" + z + "' on this page.")}}
		}
	}
	if to < len(hits) {
		out.NextPageToken = proto.String(fmt.Sprintf("offset-%d", to))
	}
	writeProto(w, out)
}

// page is the window of n items a list answers: pages of pageSize (all at once when
// unset), the token being the offset. It answers a bad token itself, ok false.
func (s *Server) page(w http.ResponseWriter, r *http.Request, n int) (from, to int, ok bool) {
	if tok := r.URL.Query().Get("pageToken"); tok != "" {
		if _, err := fmt.Sscanf(tok, "offset-%d", &from); err != nil || from < 0 || from > n {
			writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'pageToken': '%s'", tok))
			return 0, 0, false
		}
	}
	to = n
	if s.pageSize > 0 && from+s.pageSize < to {
		to = from + s.pageSize
	}
	return from, to, true
}

// filterTermRE is one term of a label filter as GCE's list filter takes it:
// labels.KEY = "VALUE" (or eq / != / ne), optionally in parentheses.
var filterTermRE = regexp.MustCompile(`^\(?\s*labels\.([a-z0-9_-]+)\s*(=|!=|eq|ne)\s*"?([^"()\s]*)"?\s*\)?$`)

// parseLabelFilter understands terms joined by AND (or by whitespace, which GCE reads as
// AND). Anything else is refused, so that a filter the provider gets wrong fails loudly.
func parseLabelFilter(filter string) (func(map[string]string) bool, error) {
	filter = strings.TrimSpace(filter)
	if filter == "" {
		return func(map[string]string) bool { return true }, nil
	}
	type term struct {
		key, value string
		negate     bool
	}
	var terms []term
	for _, part := range regexp.MustCompile(`\)\s*(AND\s*)?\(`).Split(filter, -1) {
		m := filterTermRE.FindStringSubmatch(strings.TrimSpace(part))
		if m == nil {
			return nil, fmt.Errorf("cannot parse %q", part)
		}
		terms = append(terms, term{key: m[1], value: m[3], negate: m[2] == "!=" || m[2] == "ne"})
	}
	return func(labels map[string]string) bool {
		for _, t := range terms {
			v, ok := labels[t.key]
			if (ok && v == t.value) == t.negate {
				return false
			}
		}
		return true
	}, nil
}
