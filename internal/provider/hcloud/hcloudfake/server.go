package hcloudfake

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud/schema"
)

// Routes, as used by Fail, CallCount and Calls: the HTTP method and the path pattern
// under /v1, as the API reference names them.
const (
	ServersCreate       = "POST /servers"
	ServersList         = "GET /servers"
	ServersGet          = "GET /servers/{id}"
	ServersUpdate       = "PUT /servers/{id}"
	ServersDelete       = "DELETE /servers/{id}"
	ServersPoweron      = "POST /servers/{id}/actions/poweron"
	ServersPoweroff     = "POST /servers/{id}/actions/poweroff"
	ServersShutdown     = "POST /servers/{id}/actions/shutdown"
	ServersReboot       = "POST /servers/{id}/actions/reboot"
	ServersReset        = "POST /servers/{id}/actions/reset"
	ActionsGet          = "GET /actions/{id}"
	ActionsList         = "GET /actions"
	FirewallsCreate     = "POST /firewalls"
	FirewallsList       = "GET /firewalls"
	FirewallsGet        = "GET /firewalls/{id}"
	FirewallsUpdate     = "PUT /firewalls/{id}"
	FirewallsDelete     = "DELETE /firewalls/{id}"
	FirewallsSetRules   = "POST /firewalls/{id}/actions/set_rules"
	FirewallsApplyTo    = "POST /firewalls/{id}/actions/apply_to_resources"
	FirewallsRemoveFrom = "POST /firewalls/{id}/actions/remove_from_resources"
	LocationsList       = "GET /locations"
	LocationsGet        = "GET /locations/{id}"
	ServerTypesList     = "GET /server_types"
	ServerTypesGet      = "GET /server_types/{id}"
	ImagesList          = "GET /images"
	ImagesGet           = "GET /images/{id}"
	PrimaryIPsList      = "GET /primary_ips"
	PrimaryIPsGet       = "GET /primary_ips/{id}"
	PricingGet          = "GET /pricing"
	// The datacenters endpoints answer 410 deprecated_api_endpoint, as the real API has
	// since they were removed (1 October 2026).
	DatacentersList = "GET /datacenters"
	DatacentersGet  = "GET /datacenters/{id}"
)

// Token is the API token the fake accepts unless SetTokens says otherwise.
const Token = "hcloudfake-token-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOP"

// Failure is an injected error for one call of a route.
//
// With Code set the call fails synchronously: HTTP Status (0: the status the real API
// gives Code, see StatusOf) and the error envelope {"error":{"code","message","details"}};
// Fields fills details.fields for invalid_input; ResetAfter sets RateLimit-Reset to now
// plus it (for rate_limit_exceeded: the client's retry reads it) and RateLimit-Remaining
// to 0.
//
// With ActionCode set instead the call is accepted and answered as usual, but its action
// (every action it starts) ends in status "error" with error {ActionCode, Message} and its
// effect does not happen: a failed create_server leaves the server "off" (the real API
// keeps a server whose creation failed; the caller deletes it), a failed delete_server
// leaves it as it was, a failed apply_firewall leaves the firewall unapplied.
//
// A zero Failure lets its call through, so that a queued failure hits a later call.
type Failure struct {
	Code       string
	Status     int
	Message    string
	Fields     map[string][]string
	ResetAfter time.Duration

	ActionCode string
}

// Call is one request the fake answered.
type Call struct {
	// Route is the matched route constant ("POST /servers"), or METHOD and path when
	// none matched.
	Route string
	Path  string
	Query string
	// Authorization is the request's Authorization header, as sent.
	Authorization string
	Body          string
	// Status is the HTTP status answered.
	Status int
}

// Quota is the project's resource limits. The Hetzner API has no endpoint that reads
// them; it refuses a create beyond them with resource_limit_exceeded.
type Quota struct {
	Servers    int
	Firewalls  int
	PrimaryIPs int
}

// Server is the fake. Its methods are safe for concurrent use.
type Server struct {
	// URL is the API's endpoint, ending in /v1, as https://api.hetzner.cloud/v1 does: the
	// value for hcloud.WithEndpoint.
	URL string
	srv *httptest.Server

	mu          sync.Mutex
	tokens      map[string]bool // token -> read-write
	servers     map[int64]*server
	firewalls   map[int64]*firewall
	primaryIPs  map[int64]*primaryIP
	actions     map[int64]*action
	locations   []schema.Location
	serverTypes []schema.ServerType
	images      []schema.Image
	ipPrices    []schema.PricingPrimaryIP
	quota       Quota
	failures    map[string][]Failure
	// routes are the route constants served, for Fail to check.
	routes map[string]bool
	// pendingFail is the ActionCode failure of the call being handled, if any.
	pendingFail *Failure
	calls       []Call
	nextID      int64
	nextIPv4    int
	ipv4        string
	ipv6Net     string
	actionPolls int
	holdStart   map[string]bool
	latency     time.Duration
	seq         uint64
	now         func() time.Time

	// clock is what the rate limit counts time by (time.Now; tests set their own).
	clock        func() time.Time
	rateLimit    int
	rateRemain   int
	rateRefill   time.Duration
	rateLastFill time.Time
}

// New starts a fake project with the default catalogue (see Seed: the locations fsn1,
// nbg1, hel1, ash, hil and sin, the server types cx23, cpx22, cax11 and the deprecated
// cx22, the images debian-12, debian-13 and ubuntu-24.04 for x86 and arm, prices in EUR),
// the quota of a new project (10 servers, 50 firewalls, 20 primary IPs), Token as its
// only token, a rate limit of 3600 requests refilled one a second, and actions that
// finish at their second read.
func New() *Server {
	s := &Server{
		tokens:      map[string]bool{Token: true},
		servers:     map[int64]*server{},
		firewalls:   map[int64]*firewall{},
		primaryIPs:  map[int64]*primaryIP{},
		actions:     map[int64]*action{},
		failures:    map[string][]Failure{},
		holdStart:   map[string]bool{},
		quota:       Quota{Servers: 10, Firewalls: 50, PrimaryIPs: 20},
		nextID:      1000,
		actionPolls: 2,
		now:         func() time.Time { return time.Now().UTC().Truncate(time.Second) },
		rateLimit:   3600,
		rateRemain:  3600,
		rateRefill:  time.Second,
	}
	s.clock = time.Now
	s.rateLastFill = s.clock()
	seed(s)
	mux := http.NewServeMux()
	s.routes = map[string]bool{DatacentersList: true, DatacentersGet: true}
	for route, h := range map[string]http.HandlerFunc{
		ServersCreate:       s.createServer,
		ServersList:         s.listServers,
		ServersGet:          s.getServer,
		ServersUpdate:       s.updateServer,
		ServersDelete:       s.deleteServer,
		ServersPoweron:      s.serverAction("start_server", "starting", "running"),
		ServersPoweroff:     s.serverAction("stop_server", "stopping", "off"),
		ServersShutdown:     s.serverAction("shutdown_server", "", "off"),
		ServersReboot:       s.serverAction("reboot_server", "", "running"),
		ServersReset:        s.serverAction("reset_server", "", "running"),
		ActionsGet:          s.getAction,
		ActionsList:         s.listActions,
		FirewallsCreate:     s.createFirewall,
		FirewallsList:       s.listFirewalls,
		FirewallsGet:        s.getFirewall,
		FirewallsUpdate:     s.updateFirewall,
		FirewallsDelete:     s.deleteFirewall,
		FirewallsSetRules:   s.setRules,
		FirewallsApplyTo:    s.applyTo,
		FirewallsRemoveFrom: s.removeFrom,
		LocationsList:       s.listLocations,
		LocationsGet:        s.getLocation,
		ServerTypesList:     s.listServerTypes,
		ServerTypesGet:      s.getServerType,
		ImagesList:          s.listImages,
		ImagesGet:           s.getImage,
		PrimaryIPsList:      s.listPrimaryIPs,
		PrimaryIPsGet:       s.getPrimaryIP,
		PricingGet:          s.getPricing,
	} {
		method, path, _ := strings.Cut(route, " ")
		mux.Handle(method+" /v1"+path, s.front(route, h))
		s.routes[route] = true
	}
	gone := func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusGone, "deprecated_api_endpoint", "the datacenters endpoints were removed after 1 October 2026",
			map[string]string{"announcement": "https://docs.hetzner.cloud/changelog#2026-06-02-datacenters-deprecated"})
	}
	mux.Handle("GET /v1/datacenters", s.front(DatacentersList, gone))
	mux.Handle("GET /v1/datacenters/{id}", s.front(DatacentersGet, gone))
	mux.Handle("/", s.front("", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("the fake serves no %s %s", r.Method, r.URL.Path), nil)
	}))
	s.srv = httptest.NewServer(mux)
	s.URL = s.srv.URL + "/v1"
	return s
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Fail makes the next call of route (a route constant, ServersCreate say) fail with f;
// several Fails queue up in order. A route the fake does not serve panics, so that a
// mistyped one does not pass a test that never injected anything.
func (s *Server) Fail(route string, f Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.routes[route] {
		panic(fmt.Sprintf("hcloudfake: Fail(%q): the fake serves no such route", route))
	}
	s.failures[route] = append(s.failures[route], f)
}

// SetTokens replaces the accepted tokens: each maps to whether it may write (false: a
// read-only token, whose writes get 403 forbidden as the real API answers them).
func (s *Server) SetTokens(tokens map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens = map[string]bool{}
	for t, rw := range tokens {
		s.tokens[t] = rw
	}
}

// SetLatency delays every answer by d (before the request is handled, outside the lock).
func (s *Server) SetLatency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// SetRateLimit sets the limit reported in RateLimit-Limit and refills the remaining
// budget to it; one request comes back every refill (0: never). A request with nothing
// remaining gets 429 rate_limit_exceeded with RateLimit-Reset the time of the next refill.
func (s *Server) SetRateLimit(limit int, refill time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rateLimit, s.rateRemain, s.rateRefill, s.rateLastFill = limit, limit, refill, s.clock()
}

// SetActionPolls sets how many reads an action takes to finish: it is "running" when
// returned and finishes at the n-th read of the action or of a resource it works on
// (default 2; 0 finishes every action before it is returned).
func (s *Server) SetActionPolls(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.actionPolls = n
}

// HoldStarting makes a server of that name, existing or created later, stay "starting"
// for ever: its actions succeed but it never reaches "running" (a guest that never
// boots). ReleaseStarting lets it go on.
func (s *Server) HoldStarting(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdStart[name] = true
}

// ReleaseStarting undoes HoldStarting; a held server that is "starting" goes "running".
func (s *Server) ReleaseStarting(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.holdStart, name)
	for _, sv := range s.servers {
		if sv.Name == name && sv.Status == "starting" && !s.locked("server", sv.ID) {
			sv.Status = "running"
		}
	}
}

// Calls returns the requests answered so far, in order.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// CallCount is how many calls of route were answered.
func (s *Server) CallCount(route string) int {
	n := 0
	for _, c := range s.Calls() {
		if c.Route == route {
			n++
		}
	}
	return n
}

// statusRecorder keeps the status written, for Calls.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// front is what every request passes: latency, the record of the call, the token, the
// rate limit, an injected failure; then h runs under s.mu with the request's body
// already read (r.Body is replaced by it).
func (s *Server) front(route string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		latency := s.latency
		s.mu.Unlock()
		if latency > 0 {
			select {
			case <-time.After(latency):
			case <-r.Context().Done():
				return
			}
		}
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		rec := &statusRecorder{ResponseWriter: w}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.seq++
		// The real API names every answer with a correlation ID, which hcloud-go puts in
		// its error text: "error during placement (resource_unavailable, 5e3a...)".
		rec.Header().Set("X-Correlation-Id", fmt.Sprintf("%016x", s.seq*0x9e3779b97f4a7c15))
		name := route
		if name == "" {
			name = r.Method + " " + strings.TrimPrefix(r.URL.Path, "/v1")
		}
		defer func() {
			s.calls = append(s.calls, Call{Route: name, Path: r.URL.Path, Query: r.URL.RawQuery,
				Authorization: r.Header.Get("Authorization"), Body: string(body), Status: rec.status})
		}()
		// The token comes first: the real API answers 401 before anything else.
		tok, hasBearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		rw, known := s.tokens[tok]
		if !hasBearer || !known {
			writeError(rec, http.StatusUnauthorized, "unauthorized", "unable to authenticate", nil)
			return
		}
		reset := s.rateHeaders(rec)
		if s.rateRemain <= 0 {
			rec.Header().Set("RateLimit-Reset", strconv.FormatInt(reset, 10))
			writeError(rec, http.StatusTooManyRequests, "rate_limit_exceeded", "limit of "+strconv.Itoa(s.rateLimit)+" requests per hour reached", nil)
			return
		}
		s.rateRemain--
		rec.Header().Set("RateLimit-Remaining", strconv.Itoa(s.rateRemain))
		if q := s.failures[route]; len(q) > 0 {
			f := q[0]
			s.failures[route] = q[1:]
			if f.Code != "" {
				s.writeFailure(rec, route, f)
				return
			}
			if f.ActionCode != "" {
				s.pendingFail = &f
				defer func() { s.pendingFail = nil }()
			}
		}
		if r.Method != http.MethodGet && !rw {
			writeError(rec, http.StatusForbidden, "forbidden", "insufficient permissions for this request: the token is read-only", nil)
			return
		}
		if r.Method != http.MethodGet && len(body) > 0 && !json.Valid(body) {
			writeError(rec, http.StatusBadRequest, "json_error", "request body is not valid JSON", nil)
			return
		}
		h(rec, r)
	})
}

// rateHeaders refills the budget, sets RateLimit-Limit, -Remaining and -Reset and
// returns the reset time (when the budget is full again, or the next refill when empty).
func (s *Server) rateHeaders(w http.ResponseWriter) int64 {
	now := s.clock()
	if s.rateRefill > 0 {
		n := int(now.Sub(s.rateLastFill) / s.rateRefill)
		if n > 0 {
			s.rateRemain = min(s.rateLimit, s.rateRemain+n)
			s.rateLastFill = s.rateLastFill.Add(time.Duration(n) * s.rateRefill)
		}
		if s.rateRemain >= s.rateLimit {
			s.rateLastFill = now
		}
	}
	reset := now.Unix()
	if s.rateRefill > 0 {
		missing := s.rateLimit - s.rateRemain
		if s.rateRemain <= 0 {
			missing = 1
		}
		reset = s.rateLastFill.Add(time.Duration(missing) * s.rateRefill).Unix()
	} else if s.rateRemain <= 0 {
		reset = now.Add(time.Hour).Unix()
	}
	w.Header().Set("RateLimit-Limit", strconv.Itoa(s.rateLimit))
	w.Header().Set("RateLimit-Remaining", strconv.Itoa(max(0, s.rateRemain)))
	w.Header().Set("RateLimit-Reset", strconv.FormatInt(reset, 10))
	return reset
}

func (s *Server) writeFailure(w http.ResponseWriter, route string, f Failure) {
	status := f.Status
	if status == 0 {
		status = StatusOf(f.Code)
	}
	msg := f.Message
	if msg == "" {
		msg = fmt.Sprintf("injected %s for %s", f.Code, route)
	}
	if f.ResetAfter > 0 {
		w.Header().Set("RateLimit-Remaining", "0")
		w.Header().Set("RateLimit-Reset", strconv.FormatInt(s.clock().Add(f.ResetAfter).Unix(), 10))
	}
	var details any
	if len(f.Fields) > 0 {
		details = fieldDetails(f.Fields)
	}
	writeError(w, status, f.Code, msg, details)
}

// StatusOf is the HTTP status the real API answers with an error code, from the error
// table of the API reference (https://docs.hetzner.cloud/#errors) as remembered, and for
// resource_unavailable from what users of the API report (412 "error during
// placement"); 422 for the other call-specific codes.
func StatusOf(code string) int {
	switch code {
	case "invalid_input", "json_error", "unsupported_error":
		return http.StatusBadRequest
	case "unauthorized":
		return http.StatusUnauthorized
	case "forbidden", "resource_limit_exceeded", "protected", "token_readonly":
		return http.StatusForbidden
	case "not_found":
		return http.StatusNotFound
	case "uniqueness_error", "conflict":
		return http.StatusConflict
	case "deprecated_api_endpoint":
		return http.StatusGone
	case "placement_error", "resource_unavailable":
		// A sold-out location answers 412 resource_unavailable "error during
		// placement", as users of the API report it.
		return http.StatusPreconditionFailed
	case "locked":
		return http.StatusLocked
	case "rate_limit_exceeded":
		return http.StatusTooManyRequests
	case "server_error":
		return http.StatusInternalServerError
	case "bad_gateway":
		return http.StatusBadGateway
	case "service_error", "maintenance", "unavailable":
		return http.StatusServiceUnavailable
	case "timeout":
		return http.StatusGatewayTimeout
	}
	return http.StatusUnprocessableEntity
}

type fieldError struct {
	Name     string   `json:"name"`
	Messages []string `json:"messages"`
}

func fieldDetails(fields map[string][]string) any {
	out := []fieldError{}
	for _, k := range sortedKeys(fields) {
		out = append(out, fieldError{Name: k, Messages: fields[k]})
	}
	return map[string]any{"fields": out}
}

// writeError answers in the API's error envelope, which hcloud-go turns into a
// hcloud.Error (hcloud.IsError(err, code)).
func writeError(w http.ResponseWriter, status int, code, message string, details any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code": code, "message": message, "details": details,
	}})
}

// invalidInput answers invalid_input naming the field, with details.fields as the real
// API sends them.
func invalidInput(w http.ResponseWriter, field, message string) {
	writeError(w, http.StatusBadRequest, "invalid_input", fmt.Sprintf("invalid input in field '%s'", field),
		fieldDetails(map[string][]string{field: {message}}))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil && err != io.EOF {
		writeError(w, http.StatusBadRequest, "json_error", "cannot read the request body: "+err.Error(), nil)
		return false
	}
	return true
}

// pathID reads the {id} path value; a non-number is not_found, as the API answers.
func pathID(w http.ResponseWriter, r *http.Request, kind string) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("%s with ID '%s' not found", kind, r.PathValue("id")), nil)
		return 0, false
	}
	return id, true
}

func notFound(w http.ResponseWriter, kind string, id int64) {
	writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("%s with ID '%d' not found", kind, id), nil)
}

func (s *Server) id() int64 {
	s.nextID++
	return s.nextID
}

// addrFor is the next server's IPv4 (203.0.113.0/24, TEST-NET-3, unless SetIPv4Address)
// and IPv6 /64 (2001:db8:<n>::/64 unless SetIPv6Network).
func (s *Server) addrFor() (string, string) {
	s.nextIPv4++
	v4 := fmt.Sprintf("203.0.113.%d", 1+(s.nextIPv4-1)%254)
	if s.ipv4 != "" {
		v4 = s.ipv4
	}
	v6 := fmt.Sprintf("2001:db8:%x::/64", s.nextIPv4)
	if s.ipv6Net != "" {
		v6 = s.ipv6Net
	}
	return v4, v6
}

// SetIPv4Address makes servers created from now on get ip as their primary IPv4 (for a
// test that reaches the "server" on loopback); "" goes back to 203.0.113.0/24.
func (s *Server) SetIPv4Address(ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ipv4 = ip
}

// SetIPv6Network makes servers created from now on get network (a /64, "fd00::/64") as
// their IPv6 network; "" goes back to 2001:db8:<n>::/64.
func (s *Server) SetIPv6Network(network string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if network != "" {
		if p, err := netip.ParsePrefix(network); err != nil || !p.Addr().Is6() || p.Bits() != 64 {
			panic(fmt.Sprintf("hcloudfake: SetIPv6Network(%q): not an IPv6 /64", network))
		}
	}
	s.ipv6Net = network
}

// ProvidersConfig is a providers config (the manager's --providers-config) with one
// hcloud entry, name, pointed at this fake: the token in tokenFile (write Token there),
// the location fsn1, the server type cx23 and the image ubuntu-24.04, which the fake's
// catalogue holds.
func (s *Server) ProvidersConfig(name, tokenFile string) string {
	return fmt.Sprintf(`providers:
  - name: %s
    type: hcloud
    hcloud:
      tokenFile: %s
      locations: [fsn1]
      serverTypes: [cx23]
      images: [ubuntu-24.04]
      endpoint: %s
`, name, tokenFile, s.URL)
}
