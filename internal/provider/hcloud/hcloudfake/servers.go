package hcloudfake

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud/schema"
)

// MaxUserData is the size limit of a server's user_data: 32 KiB, as the API reference
// (Create a Server, user_data) states; the API refuses more with invalid_input.
const MaxUserData = 32 * 1024

// RootPassword is the root_password a create answers (no SSH key is ever given).
const RootPassword = "hcloudfake-root-password"

type server struct {
	schema.Server
	userData   string
	ipv4, ipv6 int64 // primary IP ids; 0: none
}

type primaryIP struct {
	schema.PrimaryIP
}

// wireServer is a server as the API sends it: public_net.ipv4 and ipv6 are null when
// the server has none (hcloud-go's schema has plain structs there).
type wireServer struct {
	schema.Server
	PublicNet wirePublicNet `json:"public_net"`
}

type wirePublicNet struct {
	IPv4        *schema.ServerPublicNetIPv4 `json:"ipv4"`
	IPv6        *schema.ServerPublicNetIPv6 `json:"ipv6"`
	FloatingIPs []int64                     `json:"floating_ips"`
	Firewalls   []schema.ServerFirewall     `json:"firewalls"`
}

// view is the server as the API shows it now: its firewalls, its lock, its addresses.
func (s *Server) view(sv *server) schema.Server {
	out := sv.Server
	out.Labels = copyLabels(sv.Labels)
	out.Locked = s.locked("server", sv.ID)
	out.PublicNet = schema.ServerPublicNet{FloatingIPs: []int64{}, Firewalls: []schema.ServerFirewall{}}
	if ip, ok := s.primaryIPs[sv.ipv4]; ok {
		out.PublicNet.IPv4 = schema.ServerPublicNetIPv4{ID: ip.ID, IP: ip.IP, Blocked: ip.Blocked, DNSPtr: ip.DNSPtr[0].DNSPtr}
	}
	if ip, ok := s.primaryIPs[sv.ipv6]; ok {
		out.PublicNet.IPv6 = schema.ServerPublicNetIPv6{ID: ip.ID, IP: ip.IP, Blocked: ip.Blocked, DNSPtr: []schema.ServerPublicNetIPv6DNSPtr{}}
	}
	for _, fid := range sortedKeys(s.firewalls) {
		fw := s.firewalls[fid]
		if !s.appliesTo(fw, sv) {
			continue
		}
		status := "applied"
		if s.applying(fid, sv.ID) {
			status = "pending"
		}
		out.PublicNet.Firewalls = append(out.PublicNet.Firewalls, schema.ServerFirewall{ID: fid, Status: status})
	}
	return out
}

func (s *Server) wire(sv *server) wireServer {
	v := s.view(sv)
	w := wireServer{Server: v, PublicNet: wirePublicNet{FloatingIPs: v.PublicNet.FloatingIPs, Firewalls: v.PublicNet.Firewalls}}
	if sv.ipv4 != 0 {
		w.PublicNet.IPv4 = &v.PublicNet.IPv4
	}
	if sv.ipv6 != 0 {
		w.PublicNet.IPv6 = &v.PublicNet.IPv6
	}
	return w
}

// applying says whether an apply_firewall action of firewall fid on server sid runs.
func (s *Server) applying(fid, sid int64) bool {
	for _, a := range s.actions {
		if a.a.Status == "running" && a.a.Command == "apply_firewall" &&
			slices.Contains(a.a.Resources, ref("firewall", fid)) && slices.Contains(a.a.Resources, ref("server", sid)) {
			return true
		}
	}
	return false
}

func (s *Server) serverByName(name string) *server {
	for _, sv := range s.servers {
		if sv.Name == name {
			return sv
		}
	}
	return nil
}

func (s *Server) serverType(ref schema.IDOrName) *schema.ServerType {
	for i := range s.serverTypes {
		if st := &s.serverTypes[i]; ref.ID != 0 && st.ID == ref.ID || ref.ID == 0 && st.Name == ref.Name {
			return st
		}
	}
	return nil
}

func (s *Server) location(idOrName string) *schema.Location {
	id, _ := strconv.ParseInt(idOrName, 10, 64)
	for i := range s.locations {
		if l := &s.locations[i]; id != 0 && l.ID == id || l.Name == idOrName {
			return l
		}
	}
	return nil
}

// image finds an image by ID or, by name, the one of arch.
func (s *Server) image(ref schema.IDOrName, arch string) *schema.Image {
	for i := range s.images {
		img := &s.images[i]
		if ref.ID != 0 && img.ID == ref.ID || ref.ID == 0 && img.Name != nil && *img.Name == ref.Name && img.Architecture == arch {
			return img
		}
	}
	return nil
}

// availableIn says whether a server type can be ordered in a location now.
func (s *Server) availableIn(st *schema.ServerType, loc string) bool {
	if d := st.Deprecation; d != nil && !d.UnavailableAfter.IsZero() && s.now().After(d.UnavailableAfter) {
		return false
	}
	for _, l := range st.Locations {
		if l.Name == loc {
			if d := l.Deprecation; d != nil && !d.UnavailableAfter.IsZero() && s.now().After(d.UnavailableAfter) {
				return false
			}
			return l.Available
		}
	}
	return false
}

func (s *Server) createServer(w http.ResponseWriter, r *http.Request) {
	var req schema.ServerCreateRequest
	if !decode(w, r, &req) {
		return
	}
	switch {
	case req.Name == "":
		invalidInput(w, "name", "name is required")
		return
	case !validHostname(req.Name):
		invalidInput(w, "name", fmt.Sprintf("name '%s' is not a valid hostname (RFC 1123)", req.Name))
		return
	case len(req.SSHKeys) > 0 || len(req.Volumes) > 0 || len(req.Networks) > 0 || req.PlacementGroup != 0 ||
		req.PublicNet != nil && (req.PublicNet.IPv4ID != 0 || req.PublicNet.IPv6ID != 0):
		invalidInput(w, "ssh_keys", "hcloudfake serves no ssh_keys, volumes, networks, placement_group or existing primary IPs")
		return
	case len(req.UserData) > MaxUserData:
		invalidInput(w, "user_data", fmt.Sprintf("user_data is %d bytes, more than the limit of %d (32 KiB)", len(req.UserData), MaxUserData))
		return
	}
	var labels map[string]string
	if req.Labels != nil {
		labels = *req.Labels
	}
	if !checkLabels(w, labels) {
		return
	}
	st := s.serverType(req.ServerType)
	if st == nil {
		invalidInput(w, "server_type", fmt.Sprintf("server type %s not found", idOrName(req.ServerType)))
		return
	}
	img := s.image(req.Image, st.Architecture)
	if img == nil {
		invalidInput(w, "image", fmt.Sprintf("image %s not found for architecture %s", idOrName(req.Image), st.Architecture))
		return
	}
	if img.Architecture != st.Architecture {
		invalidInput(w, "image", fmt.Sprintf("image %d is for %s, server type %s is %s", img.ID, img.Architecture, st.Name, st.Architecture))
		return
	}
	var loc *schema.Location
	if req.Location != "" {
		if loc = s.location(req.Location); loc == nil {
			invalidInput(w, "location", fmt.Sprintf("location %s not found", req.Location))
			return
		}
	} else {
		for i := range s.locations {
			if s.availableIn(st, s.locations[i].Name) {
				loc = &s.locations[i]
				break
			}
		}
		if loc == nil {
			writeError(w, StatusOf("resource_unavailable"), "resource_unavailable", "error during placement", nil)
			return
		}
	}
	if !s.availableIn(st, loc.Name) {
		// The real message says no more than this.
		writeError(w, StatusOf("resource_unavailable"), "resource_unavailable", "error during placement", nil)
		return
	}
	pn := schema.ServerCreatePublicNet{EnableIPv4: true, EnableIPv6: true}
	if req.PublicNet != nil {
		pn = *req.PublicNet
	}
	if !pn.EnableIPv4 && !pn.EnableIPv6 {
		invalidInput(w, "public_net", "a server without a private network needs IPv4 or IPv6 enabled")
		return
	}
	for _, f := range req.Firewalls {
		if _, ok := s.firewalls[f.Firewall]; !ok {
			invalidInput(w, "firewalls", fmt.Sprintf("firewall with ID %d not found", f.Firewall))
			return
		}
	}
	if s.serverByName(req.Name) != nil {
		writeError(w, StatusOf("uniqueness_error"), "uniqueness_error", fmt.Sprintf("server name '%s' is already used", req.Name),
			fieldDetails(map[string][]string{"name": {"is already used"}}))
		return
	}
	if len(s.servers) >= s.quota.Servers {
		writeError(w, StatusOf("resource_limit_exceeded"), "resource_limit_exceeded", fmt.Sprintf("server limit of %d exceeded", s.quota.Servers), nil)
		return
	}
	need := 0
	if pn.EnableIPv4 {
		need++
	}
	if pn.EnableIPv6 {
		need++
	}
	if len(s.primaryIPs)+need > s.quota.PrimaryIPs {
		writeError(w, StatusOf("resource_limit_exceeded"), "resource_limit_exceeded", fmt.Sprintf("primary IP limit of %d exceeded", s.quota.PrimaryIPs), nil)
		return
	}

	sv := s.newServer(req.Name, "initializing", st, loc, img, labels, pn)
	sv.userData = req.UserData
	start := req.StartAfterCreate == nil || *req.StartAfterCreate
	create := s.newAction("create_server", nil, func() {
		if start {
			sv.Status = "starting"
		} else {
			sv.Status = "off"
		}
	}, func() { sv.Status = "off" }, ref("server", sv.ID))
	var next []schema.Action
	if start {
		startA := s.newAction("start_server", create, func() {
			if !s.holdStart[sv.Name] {
				sv.Status = "running"
			}
		}, func() { sv.Status = "off" }, ref("server", sv.ID))
		next = append(next, startA.a)
	}
	for _, f := range req.Firewalls {
		fw := s.firewalls[f.Firewall]
		if !slices.Contains(fw.servers, sv.ID) {
			fw.servers = append(fw.servers, sv.ID)
		}
		next = append(next, s.applyAction(fw, sv.ID).a)
	}
	pw := RootPassword
	writeJSON(w, http.StatusCreated, struct {
		Server       wireServer      `json:"server"`
		Action       schema.Action   `json:"action"`
		NextActions  []schema.Action `json:"next_actions"`
		RootPassword *string         `json:"root_password"`
	}{s.wire(sv), create.a, nonNil(next), &pw})
}

// newServer stores a server with its primary IPs.
func (s *Server) newServer(name, status string, st *schema.ServerType, loc *schema.Location, img *schema.Image, labels map[string]string, pn schema.ServerCreatePublicNet) *server {
	sv := &server{Server: schema.Server{
		ID: s.id(), Name: name, Status: status, Created: s.now(),
		ServerType: *st, Location: *loc, Image: ptr(*img), Labels: copyLabels(labels),
		IncludedTraffic: includedTraffic(st, loc.Name), PrimaryDiskSize: st.Disk,
		PrivateNet: []schema.ServerPrivateNet{}, Volumes: []int64{}, LoadBalancers: []int64{},
	}}
	v4, v6 := s.addrFor()
	if pn.EnableIPv4 {
		sv.ipv4 = s.newPrimaryIP("ipv4", v4, sv.ID, *loc)
	}
	if pn.EnableIPv6 {
		sv.ipv6 = s.newPrimaryIP("ipv6", v6, sv.ID, *loc)
	}
	s.servers[sv.ID] = sv
	return sv
}

// includedTraffic is the traffic a server type includes in a location (its price
// entry there says; the type's own field is always 0 now).
func includedTraffic(st *schema.ServerType, loc string) uint64 {
	for _, p := range st.Prices {
		if p.Location == loc {
			return p.IncludedTraffic
		}
	}
	return 0
}

func idOrName(r schema.IDOrName) string {
	if r.ID != 0 {
		return strconv.FormatInt(r.ID, 10)
	}
	return "'" + r.Name + "'"
}

// newPrimaryIP makes the auto-deleted primary IP a server gets at create.
func (s *Server) newPrimaryIP(typ, ip string, serverID int64, loc schema.Location) int64 {
	id := s.id()
	assignee := serverID
	p := &primaryIP{schema.PrimaryIP{
		ID: id, IP: ip, Name: fmt.Sprintf("primary_ip-%d", id), Type: typ, Labels: map[string]string{},
		AssigneeID: &assignee, AssigneeType: "server", AutoDelete: true, Created: s.now(), Location: loc,
		DNSPtr: []schema.PrimaryIPDNSPTR{},
	}}
	if typ == "ipv4" {
		ptr := "static.203.0.113.0.clients.your-server.de"
		if a, err := netip.ParseAddr(ip); err == nil && a.Is4() {
			b := a.As4()
			ptr = fmt.Sprintf("static.%d.%d.%d.%d.clients.your-server.de", b[3], b[2], b[1], b[0])
		}
		p.DNSPtr = []schema.PrimaryIPDNSPTR{{IP: ip, DNSPtr: ptr}}
	}
	s.primaryIPs[id] = p
	return id
}

func (s *Server) listServers(w http.ResponseWriter, r *http.Request) {
	sel, ok := selectorOf(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	for _, id := range sortedKeys(s.servers) {
		s.touch("server", id)
	}
	var out []wireServer
	for _, id := range sortedKeys(s.servers) {
		sv := s.servers[id]
		if n := q.Get("name"); n != "" && sv.Name != n {
			continue
		}
		if st := q["status"]; len(st) > 0 && !slices.Contains(st, sv.Status) {
			continue
		}
		if sel.matches(sv.Labels) {
			out = append(out, s.wire(sv))
		}
	}
	respond(w, r, "servers", out, map[string]func(a, b wireServer) int{
		"id":      func(a, b wireServer) int { return cmpInt(a.ID, b.ID) },
		"name":    func(a, b wireServer) int { return strings.Compare(a.Name, b.Name) },
		"created": func(a, b wireServer) int { return a.Created.Compare(b.Created) },
	})
}

// lookupServer reads {id}, moves the server's actions on and answers not_found for a
// server that is not there (any more).
func (s *Server) lookupServer(w http.ResponseWriter, r *http.Request) *server {
	return lookup(s, w, r, "server", s.servers)
}

// lookup reads {id}, moves the actions on the resource of kind on and returns it, or
// answers not_found.
func lookup[T any](s *Server, w http.ResponseWriter, r *http.Request, kind string, m map[int64]*T) *T {
	id, ok := pathID(w, r, kind)
	if !ok {
		return nil
	}
	s.touch(kind, id)
	v, ok := m[id]
	if !ok {
		notFound(w, kind, id)
		return nil
	}
	return v
}

func (s *Server) getServer(w http.ResponseWriter, r *http.Request) {
	if sv := s.lookupServer(w, r); sv != nil {
		writeJSON(w, http.StatusOK, struct {
			Server wireServer `json:"server"`
		}{s.wire(sv)})
	}
}

func (s *Server) updateServer(w http.ResponseWriter, r *http.Request) {
	sv := s.lookupServer(w, r)
	if sv == nil {
		return
	}
	var req schema.ServerUpdateRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Name != "" && req.Name != sv.Name {
		if !validHostname(req.Name) {
			invalidInput(w, "name", fmt.Sprintf("name '%s' is not a valid hostname (RFC 1123)", req.Name))
			return
		}
		if s.serverByName(req.Name) != nil {
			writeError(w, StatusOf("uniqueness_error"), "uniqueness_error", fmt.Sprintf("server name '%s' is already used", req.Name), nil)
			return
		}
	}
	if req.Labels != nil && !checkLabels(w, *req.Labels) {
		return
	}
	if req.Name != "" {
		sv.Name = req.Name
	}
	if req.Labels != nil {
		sv.Labels = copyLabels(*req.Labels)
	}
	writeJSON(w, http.StatusOK, struct {
		Server wireServer `json:"server"`
	}{s.wire(sv)})
}

func (s *Server) deleteServer(w http.ResponseWriter, r *http.Request) {
	sv := s.lookupServer(w, r)
	if sv == nil {
		return
	}
	if s.locked("server", sv.ID) {
		writeLocked(w, "server", sv.ID)
		return
	}
	before := sv.Status
	sv.Status = "deleting"
	a := s.newAction("delete_server", nil, func() { s.removeServer(sv.ID) }, func() { sv.Status = before }, ref("server", sv.ID))
	writeJSON(w, http.StatusOK, schema.ServerDeleteResponse{Action: a.a})
}

// removeServer drops a server, its auto-deleted primary IPs (others are unassigned) and
// its place in firewalls' applied_to.
func (s *Server) removeServer(id int64) {
	sv, ok := s.servers[id]
	if !ok {
		return
	}
	for _, pid := range []int64{sv.ipv4, sv.ipv6} {
		if p, ok := s.primaryIPs[pid]; ok {
			if p.AutoDelete {
				delete(s.primaryIPs, pid)
			} else {
				p.AssigneeID = nil
			}
		}
	}
	for _, fw := range s.firewalls {
		fw.servers = slices.DeleteFunc(fw.servers, func(x int64) bool { return x == id })
	}
	delete(s.servers, id)
}

// serverAction answers a power action: locked while another action runs; the server is
// transient (if set) at once and final when the action succeeds ("running" never for a
// server held by HoldStarting, which stays "starting").
func (s *Server) serverAction(command, transient, final string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sv := s.lookupServer(w, r)
		if sv == nil {
			return
		}
		if s.locked("server", sv.ID) {
			writeLocked(w, "server", sv.ID)
			return
		}
		before := sv.Status
		if transient != "" {
			sv.Status = transient
		}
		a := s.newAction(command, nil, func() {
			sv.Status = final
			if final == "running" && s.holdStart[sv.Name] {
				sv.Status = "starting"
			}
		}, func() { sv.Status = before }, ref("server", sv.ID))
		writeJSON(w, http.StatusCreated, struct {
			Action schema.Action `json:"action"`
		}{a.a})
	}
}

// Servers returns the servers as the API shows them, by ID.
func (s *Server) Servers() []schema.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []schema.Server
	for _, id := range sortedKeys(s.servers) {
		out = append(out, s.view(s.servers[id]))
	}
	return out
}

// ServerByName returns the server of that name, as the API shows it.
func (s *Server) ServerByName(name string) (schema.Server, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sv := s.serverByName(name); sv != nil {
		return s.view(sv), true
	}
	return schema.Server{}, false
}

// UserData returns the user_data a server was created with.
func (s *Server) UserData(id int64) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sv, ok := s.servers[id]; ok {
		return sv.userData
	}
	return ""
}

// SetServerStatus sets a server's status behind the API's back (a host failure: "off").
func (s *Server) SetServerStatus(id int64, status string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sv, ok := s.servers[id]
	if ok {
		sv.Status = status
	}
	return ok
}

// RemoveServer deletes a server behind the API's back (someone used the console).
func (s *Server) RemoveServer(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeServer(id)
}

// SeedServer adds a running server, as if created before the test, with an IPv4 and an
// IPv6 /64, and returns its ID. The server type, image and location must be known.
func (s *Server) SeedServer(name, serverType, image, location string, labels map[string]string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.serverType(schema.IDOrName{Name: serverType})
	if st == nil {
		return 0, fmt.Errorf("hcloudfake: no server type %q", serverType)
	}
	img := s.image(schema.IDOrName{Name: image}, st.Architecture)
	loc := s.location(location)
	if img == nil || loc == nil {
		return 0, fmt.Errorf("hcloudfake: no image %q for %s or no location %q", image, st.Architecture, location)
	}
	if s.serverByName(name) != nil {
		return 0, fmt.Errorf("hcloudfake: a server %q exists", name)
	}
	sv := s.newServer(name, "running", st, loc, img, labels, schema.ServerCreatePublicNet{EnableIPv4: true, EnableIPv6: true})
	sv.Created = sv.Created.Add(-time.Hour)
	return sv.ID, nil
}
