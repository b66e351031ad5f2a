package hcloudfake

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/hetznercloud/hcloud-go/v2/hcloud/schema"
)

// MaxFirewallRules is how many rules a firewall takes (the API reference's limit).
const MaxFirewallRules = 50

type firewall struct {
	schema.Firewall
	servers   []int64  // applied to directly
	selectors []string // applied to by label selector
}

// appliesTo says whether fw applies to sv, directly or through a label selector.
func (s *Server) appliesTo(fw *firewall, sv *server) bool {
	if slices.Contains(fw.servers, sv.ID) {
		return true
	}
	for _, raw := range fw.selectors {
		if sel, err := parseSelector(raw); err == nil && sel.matches(sv.Labels) {
			return true
		}
	}
	return false
}

func (s *Server) fwView(fw *firewall) schema.Firewall {
	out := fw.Firewall
	out.Labels = copyLabels(fw.Labels)
	out.Rules = append([]schema.FirewallRule{}, fw.Rules...)
	out.AppliedTo = []schema.FirewallResource{}
	for _, id := range fw.servers {
		out.AppliedTo = append(out.AppliedTo, schema.FirewallResource{Type: "server", Server: &schema.FirewallResourceServer{ID: id}})
	}
	for _, raw := range fw.selectors {
		res := schema.FirewallResource{Type: "label_selector", LabelSelector: &schema.FirewallResourceLabelSelector{Selector: raw},
			AppliedToResources: []schema.FirewallResource{}}
		sel, _ := parseSelector(raw)
		for _, id := range sortedKeys(s.servers) {
			if sel.matches(s.servers[id].Labels) {
				res.AppliedToResources = append(res.AppliedToResources, schema.FirewallResource{Type: "server", Server: &schema.FirewallResourceServer{ID: id}})
			}
		}
		out.AppliedTo = append(out.AppliedTo, res)
	}
	return out
}

// checkRules validates rules as the API does: direction in or out; protocol tcp, udp,
// icmp, esp or gre; a port ("80", "1024-5000" ascending, or "any") for tcp and udp and
// none for the others; source_ips (in) or destination_ips (out), at least one, each a
// CIDR of either family (an address without its prefix length is refused), and not the
// other list; a description of at most 255 characters; at most MaxFirewallRules rules.
func checkRules(w http.ResponseWriter, rules []schema.FirewallRuleRequest) bool {
	if len(rules) > MaxFirewallRules {
		invalidInput(w, "rules", fmt.Sprintf("%d rules, more than the limit of %d", len(rules), MaxFirewallRules))
		return false
	}
	for i, rule := range rules {
		field := func(f string) string { return fmt.Sprintf("rules[%d].%s", i, f) }
		if rule.Direction != "in" && rule.Direction != "out" {
			invalidInput(w, field("direction"), fmt.Sprintf("direction %q is not one of in, out", rule.Direction))
			return false
		}
		switch rule.Protocol {
		case "tcp", "udp":
			if rule.Port == nil || *rule.Port == "" {
				invalidInput(w, field("port"), "port is required for tcp and udp")
				return false
			}
			if !validPort(*rule.Port) {
				invalidInput(w, field("port"), fmt.Sprintf("port %q is not a port (1-65535), an ascending range of ports or any", *rule.Port))
				return false
			}
		case "icmp", "esp", "gre":
			if rule.Port != nil {
				invalidInput(w, field("port"), fmt.Sprintf("port is not allowed for protocol %s", rule.Protocol))
				return false
			}
		default:
			invalidInput(w, field("protocol"), fmt.Sprintf("protocol %q is not one of tcp, udp, icmp, esp, gre", rule.Protocol))
			return false
		}
		ips, other, name, otherName := rule.SourceIPs, rule.DestinationIPs, "source_ips", "destination_ips"
		if rule.Direction == "out" {
			ips, other, name, otherName = other, ips, otherName, name
		}
		if len(other) > 0 {
			invalidInput(w, field(otherName), fmt.Sprintf("%s is not allowed for direction %s", otherName, rule.Direction))
			return false
		}
		if len(ips) == 0 {
			invalidInput(w, field(name), fmt.Sprintf("%s needs at least one network for direction %s", name, rule.Direction))
			return false
		}
		for _, ip := range ips {
			if _, err := netip.ParsePrefix(ip); err != nil {
				invalidInput(w, field(name), fmt.Sprintf("%q is not a network in CIDR notation", ip))
				return false
			}
		}
		if rule.Description != nil && len(*rule.Description) > 255 {
			invalidInput(w, field("description"), "description is longer than 255 characters")
			return false
		}
	}
	return true
}

func validPort(p string) bool {
	if p == "any" {
		return true
	}
	lo, hi, isRange := strings.Cut(p, "-")
	a, err := strconv.Atoi(lo)
	if err != nil || a < 1 || a > 65535 {
		return false
	}
	if !isRange {
		return true
	}
	b, err := strconv.Atoi(hi)
	return err == nil && b <= 65535 && b > a
}

func toRules(req []schema.FirewallRuleRequest) []schema.FirewallRule {
	out := []schema.FirewallRule{}
	for _, r := range req {
		out = append(out, schema.FirewallRule{Direction: r.Direction, SourceIPs: nonNil(r.SourceIPs), DestinationIPs: nonNil(r.DestinationIPs),
			Protocol: r.Protocol, Port: r.Port, Description: r.Description})
	}
	return out
}

// checkResources validates apply_to / remove_from entries: a server that exists, or a
// label selector that parses.
func (s *Server) checkResources(w http.ResponseWriter, field string, res []schema.FirewallResource) bool {
	for i, r := range res {
		switch r.Type {
		case "server":
			if r.Server == nil {
				invalidInput(w, fmt.Sprintf("%s[%d].server", field, i), "server is required for type server")
				return false
			}
			if _, ok := s.servers[r.Server.ID]; !ok {
				writeError(w, StatusOf("firewall_resource_not_found"), "firewall_resource_not_found", fmt.Sprintf("server %d not found", r.Server.ID), nil)
				return false
			}
		case "label_selector":
			if r.LabelSelector == nil {
				invalidInput(w, fmt.Sprintf("%s[%d].label_selector", field, i), "label_selector is required for type label_selector")
				return false
			}
			if _, err := parseSelector(r.LabelSelector.Selector); err != nil || strings.TrimSpace(r.LabelSelector.Selector) == "" {
				invalidInput(w, fmt.Sprintf("%s[%d].label_selector.selector", field, i), fmt.Sprintf("invalid label selector %q", r.LabelSelector.Selector))
				return false
			}
		default:
			invalidInput(w, fmt.Sprintf("%s[%d].type", field, i), fmt.Sprintf("type %q is not one of server, label_selector", r.Type))
			return false
		}
	}
	return true
}

// applyAction starts apply_firewall of fw on a server.
func (s *Server) applyAction(fw *firewall, serverID int64) *action {
	return s.newAction("apply_firewall", nil, nil, func() {
		fw.servers = slices.DeleteFunc(fw.servers, func(x int64) bool { return x == serverID })
	}, ref("firewall", fw.ID), ref("server", serverID))
}

// apply applies fw to resources and returns the actions, one per resource.
func (s *Server) apply(fw *firewall, res []schema.FirewallResource) []schema.Action {
	var out []schema.Action
	for _, r := range res {
		if r.Type == "server" {
			fw.servers = append(fw.servers, r.Server.ID)
			out = append(out, s.applyAction(fw, r.Server.ID).a)
			continue
		}
		sel := r.LabelSelector.Selector
		fw.selectors = append(fw.selectors, sel)
		out = append(out, s.newAction("apply_firewall", nil, nil, func() {
			fw.selectors = slices.DeleteFunc(fw.selectors, func(x string) bool { return x == sel })
		}, ref("firewall", fw.ID)).a)
	}
	return out
}

func (s *Server) firewallByName(name string) *firewall {
	for _, fw := range s.firewalls {
		if fw.Name == name {
			return fw
		}
	}
	return nil
}

func (s *Server) createFirewall(w http.ResponseWriter, r *http.Request) {
	var req schema.FirewallCreateRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Name == "" {
		invalidInput(w, "name", "name is required")
		return
	}
	var labels map[string]string
	if req.Labels != nil {
		labels = *req.Labels
	}
	if !checkLabels(w, labels) || !checkRules(w, req.Rules) || !s.checkResources(w, "apply_to", req.ApplyTo) {
		return
	}
	if s.firewallByName(req.Name) != nil {
		writeError(w, StatusOf("uniqueness_error"), "uniqueness_error", fmt.Sprintf("firewall name '%s' is already used", req.Name),
			fieldDetails(map[string][]string{"name": {"is already used"}}))
		return
	}
	if len(s.firewalls) >= s.quota.Firewalls {
		writeError(w, StatusOf("resource_limit_exceeded"), "resource_limit_exceeded", fmt.Sprintf("firewall limit of %d exceeded", s.quota.Firewalls), nil)
		return
	}
	fw := &firewall{Firewall: schema.Firewall{ID: s.id(), Name: req.Name, Labels: copyLabels(labels), Created: s.now(), Rules: toRules(req.Rules)}}
	s.firewalls[fw.ID] = fw
	actions := []schema.Action{}
	if len(req.Rules) > 0 {
		actions = append(actions, s.newAction("set_firewall_rules", nil, nil, nil, ref("firewall", fw.ID)).a)
	}
	actions = append(actions, s.apply(fw, req.ApplyTo)...)
	writeJSON(w, http.StatusCreated, schema.FirewallCreateResponse{Firewall: s.fwView(fw), Actions: actions})
}

func (s *Server) listFirewalls(w http.ResponseWriter, r *http.Request) {
	sel, ok := selectorOf(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	var out []schema.Firewall
	for _, id := range sortedKeys(s.firewalls) {
		s.touch("firewall", id)
		fw := s.firewalls[id]
		if n := q.Get("name"); n != "" && fw.Name != n {
			continue
		}
		if sel.matches(fw.Labels) {
			out = append(out, s.fwView(fw))
		}
	}
	respond(w, r, "firewalls", out, map[string]func(a, b schema.Firewall) int{
		"id":      func(a, b schema.Firewall) int { return cmpInt(a.ID, b.ID) },
		"name":    func(a, b schema.Firewall) int { return strings.Compare(a.Name, b.Name) },
		"created": func(a, b schema.Firewall) int { return a.Created.Compare(b.Created) },
	})
}

func (s *Server) lookupFirewall(w http.ResponseWriter, r *http.Request) *firewall {
	return lookup(s, w, r, "firewall", s.firewalls)
}

func (s *Server) getFirewall(w http.ResponseWriter, r *http.Request) {
	if fw := s.lookupFirewall(w, r); fw != nil {
		writeJSON(w, http.StatusOK, schema.FirewallGetResponse{Firewall: s.fwView(fw)})
	}
}

func (s *Server) updateFirewall(w http.ResponseWriter, r *http.Request) {
	fw := s.lookupFirewall(w, r)
	if fw == nil {
		return
	}
	var req schema.FirewallUpdateRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Name != nil && *req.Name != fw.Name {
		if *req.Name == "" {
			invalidInput(w, "name", "name must not be empty")
			return
		}
		if s.firewallByName(*req.Name) != nil {
			writeError(w, StatusOf("uniqueness_error"), "uniqueness_error", fmt.Sprintf("firewall name '%s' is already used", *req.Name), nil)
			return
		}
	}
	if req.Labels != nil && !checkLabels(w, *req.Labels) {
		return
	}
	if req.Name != nil {
		fw.Name = *req.Name
	}
	if req.Labels != nil {
		fw.Labels = copyLabels(*req.Labels)
	}
	writeJSON(w, http.StatusOK, schema.FirewallUpdateResponse{Firewall: s.fwView(fw)})
}

// deleteFirewall answers 204; a firewall still applied to anything is resource_in_use.
func (s *Server) deleteFirewall(w http.ResponseWriter, r *http.Request) {
	fw := s.lookupFirewall(w, r)
	if fw == nil {
		return
	}
	if len(fw.servers) > 0 || len(fw.selectors) > 0 {
		writeError(w, StatusOf("resource_in_use"), "resource_in_use", fmt.Sprintf("firewall %d is still applied to resources", fw.ID), nil)
		return
	}
	if s.locked("firewall", fw.ID) {
		writeLocked(w, "firewall", fw.ID)
		return
	}
	delete(s.firewalls, fw.ID)
	w.WriteHeader(http.StatusNoContent)
}

// setRules replaces the rules: a set_firewall_rules action and an apply_firewall for
// each server it applies to.
func (s *Server) setRules(w http.ResponseWriter, r *http.Request) {
	fw := s.lookupFirewall(w, r)
	if fw == nil {
		return
	}
	var req schema.FirewallActionSetRulesRequest
	if !decode(w, r, &req) || !checkRules(w, req.Rules) {
		return
	}
	if s.locked("firewall", fw.ID) {
		writeLocked(w, "firewall", fw.ID)
		return
	}
	old := fw.Rules
	fw.Rules = toRules(req.Rules)
	actions := []schema.Action{s.newAction("set_firewall_rules", nil, nil, func() { fw.Rules = old }, ref("firewall", fw.ID)).a}
	for _, id := range sortedKeys(s.servers) {
		if s.appliesTo(fw, s.servers[id]) {
			actions = append(actions, s.newAction("apply_firewall", nil, nil, nil, ref("firewall", fw.ID), ref("server", id)).a)
		}
	}
	writeJSON(w, http.StatusCreated, schema.FirewallActionSetRulesResponse{Actions: actions})
}

func (s *Server) applyTo(w http.ResponseWriter, r *http.Request) {
	fw := s.lookupFirewall(w, r)
	if fw == nil {
		return
	}
	var req schema.FirewallActionApplyToResourcesRequest
	if !decode(w, r, &req) || !s.checkResources(w, "apply_to", req.ApplyTo) {
		return
	}
	for _, res := range req.ApplyTo {
		if res.Type == "server" && slices.Contains(fw.servers, res.Server.ID) ||
			res.Type == "label_selector" && slices.Contains(fw.selectors, res.LabelSelector.Selector) {
			writeError(w, StatusOf("firewall_already_applied"), "firewall_already_applied", fmt.Sprintf("firewall %d is already applied to that resource", fw.ID), nil)
			return
		}
	}
	if s.locked("firewall", fw.ID) {
		writeLocked(w, "firewall", fw.ID)
		return
	}
	writeJSON(w, http.StatusCreated, schema.FirewallActionApplyToResourcesResponse{Actions: nonNil(s.apply(fw, req.ApplyTo))})
}

func (s *Server) removeFrom(w http.ResponseWriter, r *http.Request) {
	fw := s.lookupFirewall(w, r)
	if fw == nil {
		return
	}
	var req schema.FirewallActionRemoveFromResourcesRequest
	if !decode(w, r, &req) || !s.checkResources(w, "remove_from", req.RemoveFrom) {
		return
	}
	for _, res := range req.RemoveFrom {
		if res.Type == "server" && !slices.Contains(fw.servers, res.Server.ID) && s.appliesTo(fw, s.servers[res.Server.ID]) {
			writeError(w, StatusOf("firewall_managed_by_label_selector"), "firewall_managed_by_label_selector",
				fmt.Sprintf("firewall %d is applied to server %d by a label selector", fw.ID, res.Server.ID), nil)
			return
		}
		// firewall_already_removed is no longer used (API changelog 2025-08-04, hcloud-go
		// error.go); a resource the firewall is not applied to is not found.
		if res.Type == "server" && !slices.Contains(fw.servers, res.Server.ID) ||
			res.Type == "label_selector" && !slices.Contains(fw.selectors, res.LabelSelector.Selector) {
			writeError(w, StatusOf("firewall_resource_not_found"), "firewall_resource_not_found", fmt.Sprintf("firewall %d is not applied to that resource", fw.ID), nil)
			return
		}
	}
	if s.locked("firewall", fw.ID) {
		writeLocked(w, "firewall", fw.ID)
		return
	}
	var actions []schema.Action
	for _, res := range req.RemoveFrom {
		refs := []schema.ActionResourceReference{ref("firewall", fw.ID)}
		if res.Type == "server" {
			id := res.Server.ID
			fw.servers = slices.DeleteFunc(fw.servers, func(x int64) bool { return x == id })
			refs = append(refs, ref("server", id))
		} else {
			sel := res.LabelSelector.Selector
			fw.selectors = slices.DeleteFunc(fw.selectors, func(x string) bool { return x == sel })
		}
		actions = append(actions, s.newAction("remove_firewall", nil, nil, nil, refs...).a)
	}
	writeJSON(w, http.StatusCreated, schema.FirewallActionRemoveFromResourcesResponse{Actions: nonNil(actions)})
}

// Firewalls returns the firewalls as the API shows them, by ID.
func (s *Server) Firewalls() []schema.Firewall {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []schema.Firewall
	for _, id := range sortedKeys(s.firewalls) {
		out = append(out, s.fwView(s.firewalls[id]))
	}
	return out
}

// RemoveFirewall deletes a firewall behind the API's back, applied or not.
func (s *Server) RemoveFirewall(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.firewalls, id)
}
