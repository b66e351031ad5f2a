package gcefake

import (
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"sort"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Firewall returns a copy of the named firewall rule, or nil.
func (s *Server) Firewall(name string) *computepb.Firewall {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fw, ok := s.firewalls[name]; ok {
		return proto.CloneOf(fw)
	}
	return nil
}

// PutFirewall stores fw as it is, as if made outside the provider (by hand, by another
// install).
func (s *Server) PutFirewall(fw *computepb.Firewall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fw = proto.CloneOf(fw)
	fw.SelfLink = proto.String(s.link("global/firewalls/" + fw.GetName()))
	if fw.CreationTimestamp == nil {
		fw.CreationTimestamp = proto.String(time.Now().UTC().Format(time.RFC3339))
	}
	s.firewalls[fw.GetName()] = fw
}

// DeleteFirewall removes the named rule at once, as if deleted outside the provider.
func (s *Server) DeleteFirewall(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.firewalls, name)
}

// FirewallNames are the names of the firewall rules, sorted.
func (s *Server) FirewallNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.firewalls))
	for n := range s.firewalls {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Firewalls is the number of firewall rules.
func (s *Server) Firewalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.firewalls)
}

func (s *Server) getFirewall(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.start(w, r, FirewallsGet, nil); !ok {
		return
	}
	fw, ok := s.firewalls[r.PathValue("name")]
	if !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' was not found", s.project, r.PathValue("name")))
		return
	}
	writeProto(w, fw)
}

// mixedFamilies refuses a rule whose source ranges are not CIDRs or mix IPv4 and IPv6, as
// GCE does: "A firewall rule can contain either IPv4 or IPv6 ranges, but not both"
// (cloud.google.com/firewall/docs/using-firewalls). The API's own text for that refusal
// is not published; the words here follow the shape of its invalid-field errors (the
// field with its index, the value, then why), naming the first range whose family
// differs from the first range's.
func mixedFamilies(ranges []string) string {
	var first netip.Prefix
	for i, r := range ranges {
		pfx, err := netip.ParsePrefix(r)
		if err != nil {
			return fmt.Sprintf("Invalid value for field 'resource.sourceRanges[%d]': '%s'. Must be a valid IPV4 or IPV6 CIDR.", i, r)
		}
		if i == 0 {
			first = pfx
			continue
		}
		if pfx.Addr().Is4() != first.Addr().Is4() {
			return fmt.Sprintf("Invalid value for field 'resource.sourceRanges[%d]': '%s'. "+
				"A firewall rule can contain either IPv4 or IPv6 ranges, but not both (resource.sourceRanges[0] is '%s').", i, r, ranges[0])
		}
	}
	return ""
}

// listFirewalls answers every rule of the project, by name, in pages of the page size
// (SetPageSize).
func (s *Server) listFirewalls(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.start(w, r, FirewallsList, nil); !ok {
		return
	}
	if f := r.URL.Query().Get("filter"); f != "" {
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("the fake takes no filter on firewalls, got %q", f))
		return
	}
	names := make([]string, 0, len(s.firewalls))
	for n := range s.firewalls {
		names = append(names, n)
	}
	sort.Strings(names)
	from, to, ok := s.page(w, r, len(names))
	if !ok {
		return
	}
	out := &computepb.FirewallList{}
	for _, n := range names[from:to] {
		out.Items = append(out.Items, s.firewalls[n])
	}
	if to < len(names) {
		out.NextPageToken = proto.String(fmt.Sprintf("offset-%d", to))
	}
	writeProto(w, out)
}

func (s *Server) insertFirewall(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	fail, ok := s.start(w, r, FirewallsInsert, body)
	if !ok {
		return
	}
	rid := r.URL.Query().Get("requestId")
	if !checkRequestID(w, rid) || s.replay(w, rid) {
		return
	}
	fw := &computepb.Firewall{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(body, fw); err != nil {
		writeError(w, http.StatusBadRequest, "parseError", fmt.Sprintf("Invalid JSON payload received. %v", err))
		return
	}
	name := fw.GetName()
	if !nameRE.MatchString(name) {
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.name': '%s'", name))
		return
	}
	if network := lastPart(fw.GetNetwork()); fw.Network != nil && !s.networks[network] {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/global/networks/%s' was not found", s.project, network))
		return
	}
	if msg := mixedFamilies(fw.GetSourceRanges()); msg != "" {
		writeError(w, http.StatusBadRequest, "invalid", msg)
		return
	}
	if _, exists := s.firewalls[name]; exists {
		writeError(w, http.StatusConflict, "alreadyExists", fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' already exists", s.project, name))
		return
	}
	var done func()
	if fail == nil {
		fw.SelfLink = proto.String(s.link("global/firewalls/" + name))
		fw.CreationTimestamp = proto.String(time.Now().UTC().Format(time.RFC3339Nano))
		done = func() { s.firewalls[name] = fw }
	}
	writeProto(w, s.newOperation("insert", "", s.link("global/firewalls/"+name), rid, fail, done))
}

func (s *Server) deleteFirewall(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fail, ok := s.start(w, r, FirewallsDelete, nil)
	if !ok {
		return
	}
	name, rid := r.PathValue("name"), r.URL.Query().Get("requestId")
	if !checkRequestID(w, rid) || s.replay(w, rid) {
		return
	}
	if _, exists := s.firewalls[name]; !exists {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' was not found", s.project, name))
		return
	}
	var done func()
	if fail == nil {
		done = func() { delete(s.firewalls, name) }
	}
	writeProto(w, s.newOperation("delete", "", s.link("global/firewalls/"+name), rid, fail, done))
}

// patchFirewall merges the body into the named rule, as GCE's PATCH does: the fields the
// body sets replace the rule's (a list as a whole); name and network cannot change, and
// the result must still hold one address family.
func (s *Server) patchFirewall(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	fail, ok := s.start(w, r, FirewallsPatch, body)
	if !ok {
		return
	}
	name, rid := r.PathValue("name"), r.URL.Query().Get("requestId")
	if !checkRequestID(w, rid) || s.replay(w, rid) {
		return
	}
	cur, exists := s.firewalls[name]
	if !exists {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' was not found", s.project, name))
		return
	}
	patch := &computepb.Firewall{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(body, patch); err != nil {
		writeError(w, http.StatusBadRequest, "parseError", fmt.Sprintf("Invalid JSON payload received. %v", err))
		return
	}
	if patch.Name != nil && patch.GetName() != name || patch.Network != nil && lastPart(patch.GetNetwork()) != lastPart(cur.GetNetwork()) {
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource': the name and network of firewall rule %s cannot be changed", name))
		return
	}
	next := proto.CloneOf(cur)
	if patch.Description != nil {
		next.Description = patch.Description
	}
	if patch.Disabled != nil {
		next.Disabled = patch.Disabled
	}
	if patch.Direction != nil {
		next.Direction = patch.Direction
	}
	if len(patch.SourceRanges) > 0 {
		next.SourceRanges = patch.SourceRanges
	}
	if len(patch.TargetTags) > 0 {
		next.TargetTags = patch.TargetTags
	}
	if len(patch.Allowed) > 0 {
		next.Allowed = patch.Allowed
	}
	if msg := mixedFamilies(next.GetSourceRanges()); msg != "" {
		writeError(w, http.StatusBadRequest, "invalid", msg)
		return
	}
	var done func()
	if fail == nil {
		done = func() {
			if s.firewalls[name] == cur {
				s.firewalls[name] = next
			}
		}
	}
	writeProto(w, s.newOperation("patch", "", s.link("global/firewalls/"+name), rid, fail, done))
}
