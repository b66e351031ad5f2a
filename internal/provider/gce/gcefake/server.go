// Package gcefake is an in-process Compute Engine API: an httptest server speaking the
// REST wire format (protojson of computepb) for the calls the gce provider makes, so
// that the official client runs unchanged in tests. It holds instances, firewalls,
// zones and region quotas; zonal and global operations go PENDING, RUNNING, DONE over
// successive polls; a repeated requestId returns the first call's operation; aggregated
// lists honour label filters; external addresses come from 203.0.113.0/24 (TEST-NET-3)
// unless SetNATAddress says otherwise; and every call can be made to fail once, either
// synchronously with an HTTP error or through the operation's own error list.
package gcefake

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Method names, as used by Fail and Calls: the resource's collection and the verb.
const (
	InstancesGet            = "instances.get"
	InstancesInsert         = "instances.insert"
	InstancesDelete         = "instances.delete"
	InstancesStart          = "instances.start"
	InstancesReset          = "instances.reset"
	InstancesAggregatedList = "instances.aggregatedList"
	ZoneOperationsGet       = "zoneOperations.get"
	ZoneOperationsList      = "zoneOperations.list"
	GlobalOperationsGet     = "globalOperations.get"
	ZonesGet                = "zones.get"
	MachineTypesGet         = "machineTypes.get"
	ProjectsGet             = "projects.get"
	RegionsGet              = "regions.get"
	FirewallsGet            = "firewalls.get"
	FirewallsList           = "firewalls.list"
	FirewallsInsert         = "firewalls.insert"
	FirewallsDelete         = "firewalls.delete"
	FirewallsPatch          = "firewalls.patch"
)

// Failure is an injected error. With Code set the call fails synchronously with that
// HTTP status and, when Reason is set, one error item of that reason (rateLimitExceeded,
// alreadyExists...). With OpCode set instead, the call is accepted, its operation runs
// and ends DONE carrying OpCode in its error list and nothing happens. The operation
// carries an httpErrorStatusCode, as real failed operations do: OpHTTPStatus, or when it
// is zero the status GCE gives that code (403 QUOTA_EXCEEDED, 503 for a stock-out, 500
// INTERNAL_ERROR, 409 RESOURCE_ALREADY_EXISTS, 400 otherwise); OpWithoutHTTPStatus
// leaves it out, as GCE still does for some codes. A zero Failure lets its call through,
// so that a queued failure hits a later call (the second page of a list, say).
// ErrorShapes holds the real shapes, by name.
type Failure struct {
	Code    int
	Reason  string
	Message string

	OpCode              string
	OpHTTPStatus        int32
	OpWithoutHTTPStatus bool
}

// Call is one request the server answered.
type Call struct {
	Method    string
	Path      string
	RequestID string
	// Authorization is the request's Authorization header, to show what went on the wire.
	Authorization string
	Body          string
}

// Server is the fake. Its methods are safe for concurrent use.
type Server struct {
	URL string
	srv *httptest.Server

	mu         sync.Mutex
	project    string
	instances  map[string]map[string]*computepb.Instance // zone -> name
	firewalls  map[string]*computepb.Firewall
	networks   map[string]bool
	subnets    map[string]subnet // "region/name"
	ops        map[string]*operation
	requestIDs map[string]string // requestId -> operation name
	zones      map[string]*computepb.Zone
	quotas     map[string][]*computepb.Quota
	// projectQuotas are the project's global quotas (FIREWALLS).
	projectQuotas []*computepb.Quota
	failures      map[string][]Failure
	calls         []Call
	nextOp        int
	nextID        uint64
	nextIP        int
	natAddress    string
	opPolls       int
	tokens        int
	pageSize      int
	// restarts counts, by "zone/name", the resets and starts that completed.
	restarts map[string]int
}

// New starts a fake of project with the given zones (status UP), each region with a
// CPUS quota of 24 and an IN_USE_ADDRESSES quota of 8, nothing used.
func New(project string, zones ...string) *Server {
	s := &Server{
		project:       project,
		instances:     map[string]map[string]*computepb.Instance{},
		firewalls:     map[string]*computepb.Firewall{},
		networks:      map[string]bool{"default": true},
		subnets:       map[string]subnet{},
		ops:           map[string]*operation{},
		requestIDs:    map[string]string{},
		zones:         map[string]*computepb.Zone{},
		quotas:        map[string][]*computepb.Quota{},
		failures:      map[string][]Failure{},
		restarts:      map[string]int{},
		opPolls:       2,
		projectQuotas: []*computepb.Quota{{Metric: proto.String("FIREWALLS"), Limit: proto.Float64(200), Usage: proto.Float64(0)}},
		nextID:        1000,
	}
	for _, z := range zones {
		region := RegionOf(z)
		s.zones[z] = &computepb.Zone{Name: proto.String(z), Status: proto.String("UP"),
			Region: proto.String(s.link("regions/" + region))}
		if _, ok := s.quotas[region]; !ok {
			s.quotas[region] = []*computepb.Quota{
				{Metric: proto.String("CPUS"), Limit: proto.Float64(24), Usage: proto.Float64(0)},
				{Metric: proto.String("IN_USE_ADDRESSES"), Limit: proto.Float64(8), Usage: proto.Float64(0)},
			}
		}
	}
	mux := http.NewServeMux()
	p := "/compute/v1/projects/{project}/"
	mux.HandleFunc("GET "+p+"zones/{zone}/instances/{name}", s.getInstance)
	mux.HandleFunc("POST "+p+"zones/{zone}/instances", s.insertInstance)
	mux.HandleFunc("DELETE "+p+"zones/{zone}/instances/{name}", s.deleteInstance)
	mux.HandleFunc("POST "+p+"zones/{zone}/instances/{name}/start", s.startInstance)
	mux.HandleFunc("POST "+p+"zones/{zone}/instances/{name}/reset", s.resetInstance)
	mux.HandleFunc("GET "+p+"aggregated/instances", s.aggregatedList)
	mux.HandleFunc("GET "+p+"zones/{zone}/operations/{op}", s.getOperation(ZoneOperationsGet))
	mux.HandleFunc("GET "+p+"zones/{zone}/operations", s.listZoneOperations)
	mux.HandleFunc("GET "+p+"global/operations/{op}", s.getOperation(GlobalOperationsGet))
	mux.HandleFunc("GET "+p+"zones/{zone}", s.getZone)
	mux.HandleFunc("GET /compute/v1/projects/{project}", s.getProject)
	mux.HandleFunc("GET "+p+"zones/{zone}/machineTypes/{name}", s.getMachineType)
	mux.HandleFunc("GET "+p+"regions/{region}", s.getRegion)
	mux.HandleFunc("GET "+p+"global/firewalls/{name}", s.getFirewall)
	mux.HandleFunc("GET "+p+"global/firewalls", s.listFirewalls)
	mux.HandleFunc("POST "+p+"global/firewalls", s.insertFirewall)
	mux.HandleFunc("DELETE "+p+"global/firewalls/{name}", s.deleteFirewall)
	mux.HandleFunc("PATCH "+p+"global/firewalls/{name}", s.patchFirewall)
	mux.HandleFunc("POST /token", s.token)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("the fake serves no %s %s", r.Method, r.URL.Path))
	})
	s.srv = httptest.NewServer(mux)
	s.URL = s.srv.URL
	return s
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

func (s *Server) link(rel string) string {
	return s.URL + "/compute/v1/projects/" + s.project + "/" + rel
}

// Fail makes the next call of method fail with f; several Fails queue up in order.
func (s *Server) Fail(method string, f Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures[method] = append(s.failures[method], f)
}

// SetOperationPolls sets how many polls an operation takes to reach DONE: it is PENDING
// when returned, RUNNING after the first poll, DONE at the n-th (default 2; 0 makes every
// operation DONE at once).
func (s *Server) SetOperationPolls(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opPolls = n
}

// SetPageSize makes aggregated lists and firewall lists answer n items a page, with a
// nextPageToken while more remain (0, the default: everything on one page).
func (s *Server) SetPageSize(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pageSize = n
}

// Calls returns the requests answered so far, in order.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// CallCount is how many calls of method were answered.
func (s *Server) CallCount(method string) int {
	n := 0
	for _, c := range s.Calls() {
		if c.Method == method {
			n++
		}
	}
	return n
}

// begin records the call and pops its injected failure, under s.mu.
func (s *Server) begin(method string, r *http.Request, body []byte) (Failure, bool) {
	s.calls = append(s.calls, Call{Method: method, Path: r.URL.Path, RequestID: r.URL.Query().Get("requestId"),
		Authorization: r.Header.Get("Authorization"), Body: string(body)})
	q := s.failures[method]
	if len(q) == 0 {
		return Failure{}, false
	}
	s.failures[method] = q[1:]
	return q[0], true
}

// start handles the common front of a call: it records it, answers an injected
// synchronous failure and checks the project. It reports whether the handler goes on,
// and returns an injected operation failure, if any.
func (s *Server) start(w http.ResponseWriter, r *http.Request, method string, body []byte) (opFail *Failure, ok bool) {
	f, failing := s.begin(method, r, body)
	if failing && f.Code != 0 {
		msg := f.Message
		if msg == "" {
			msg = fmt.Sprintf("injected %d for %s", f.Code, method)
		}
		writeError(w, f.Code, f.Reason, msg)
		return nil, false
	}
	if p := r.PathValue("project"); p != s.project {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s' was not found", p))
		return nil, false
	}
	if failing {
		return &f, true
	}
	return nil, true
}

// Token is the access token the fake's OAuth endpoint (POST /token, the token_uri of a
// test service-account key) hands out.
const Token = "ya29.gcefake-access-token"

// TokenRequests is how many tokens the OAuth endpoint handed out.
func (s *Server) TokenRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens
}

// token answers a JWT-bearer grant as Google's token endpoint does, without checking the
// assertion's signature.
func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.Form.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" || r.Form.Get("assertion") == "" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":"invalid_grant","error_description":"not a JWT-bearer grant"}`)
		return
	}
	s.mu.Lock()
	s.tokens++
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"access_token": Token, "token_type": "Bearer", "expires_in": 3600})
}

func writeProto(w http.ResponseWriter, m proto.Message) {
	b, err := protojson.Marshal(m)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "backendError", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_, _ = w.Write(b)
}

// writeError answers in the error shape of Google APIs, which googleapi.CheckResponse parses.
func writeError(w http.ResponseWriter, code int, reason, message string) {
	item := map[string]string{"message": message, "domain": "global"}
	if reason != "" {
		item["reason"] = reason
	}
	if reason == "rateLimitExceeded" {
		item["domain"] = "usageLimits"
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code": code, "message": message, "errors": []any{item},
	}})
}
