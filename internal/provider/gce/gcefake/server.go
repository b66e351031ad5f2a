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
	"net/netip"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/google/uuid"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Method names, as used by Fail and Calls: the resource's collection and the verb.
const (
	InstancesGet            = "instances.get"
	InstancesInsert         = "instances.insert"
	InstancesDelete         = "instances.delete"
	InstancesStart          = "instances.start"
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

type operation struct {
	pb    *computepb.Operation
	polls int
	// done runs when the operation reaches DONE without an error.
	done func()
	// failed runs when it reaches DONE with an error.
	failed func()
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

// RegionOf is the region of a zone name (europe-west1-b: europe-west1).
func RegionOf(zone string) string {
	if i := strings.LastIndex(zone, "-"); i > 0 {
		return zone[:i]
	}
	return zone
}

func (s *Server) link(rel string) string {
	return s.URL + "/compute/v1/projects/" + s.project + "/" + rel
}

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

// SetNATAddress makes every instance created from now on get addr as its external IP
// (and its internal one), such as 127.0.0.1 for a test whose probes must reach it.
func (s *Server) SetNATAddress(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.natAddress = addr
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

// Preempt ends a Spot instance the way GCE does: with instanceTerminationAction DELETE
// it is gone; otherwise it is TERMINATED. It reports whether the instance existed.
func (s *Server) Preempt(zone, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, ok := s.instances[zone][name]
	if !ok {
		return false
	}
	// GCE records the preemption as a system operation on the instance.
	s.nextOp++
	opName := fmt.Sprintf("systemevent-%d", s.nextOp)
	now := time.Now().UTC().Format(time.RFC3339Nano)
	s.ops[opName] = &operation{pb: &computepb.Operation{
		Name: proto.String(opName), OperationType: proto.String("compute.instances.preempted"),
		TargetLink: proto.String(inst.GetSelfLink()), TargetId: proto.Uint64(inst.GetId()),
		Status: computepb.Operation_DONE.Enum(), Progress: proto.Int32(100), User: proto.String("system"),
		StatusMessage: proto.String("Instance was preempted."),
		InsertTime:    proto.String(now), StartTime: proto.String(now), EndTime: proto.String(now),
		Zone: proto.String(s.link("zones/" + zone)), SelfLink: proto.String(s.link("zones/" + zone + "/operations/" + opName)),
	}}
	if inst.GetScheduling().GetInstanceTerminationAction() == "DELETE" {
		delete(s.instances[zone], name)
		return true
	}
	inst.Status = proto.String("TERMINATED")
	for _, ni := range inst.NetworkInterfaces {
		for _, ac := range ni.AccessConfigs {
			ac.NatIP = nil
		}
	}
	return true
}

// SetInstanceStatus sets the status of an instance (REPAIRING, PENDING_STOP...), as GCE
// does by itself; it reports whether the instance exists.
func (s *Server) SetInstanceStatus(zone, name, status string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, ok := s.instances[zone][name]
	if ok {
		inst.Status = proto.String(status)
	}
	return ok
}

// PutInstance stores inst in zone as it is, as if made outside the provider (by another
// install, by hand).
func (s *Server) PutInstance(zone string, inst *computepb.Instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst = proto.CloneOf(inst)
	inst.Zone = proto.String(s.link("zones/" + zone))
	if inst.Status == nil {
		inst.Status = proto.String("RUNNING")
	}
	if inst.CreationTimestamp == nil {
		inst.CreationTimestamp = proto.String(time.Now().UTC().Format(time.RFC3339))
	}
	if s.instances[zone] == nil {
		s.instances[zone] = map[string]*computepb.Instance{}
	}
	s.instances[zone][inst.GetName()] = inst
}

// Instance returns a copy of the named instance, or nil.
func (s *Server) Instance(zone, name string) *computepb.Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	if inst, ok := s.instances[zone][name]; ok {
		return proto.CloneOf(inst)
	}
	return nil
}

// Instances is the number of instances in all zones.
func (s *Server) Instances() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, z := range s.instances {
		n += len(z)
	}
	return n
}

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

// Firewalls is the number of firewall rules.
func (s *Server) Firewalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.firewalls)
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

// newOperation makes an operation (zonal when zone is set) for target, stores it and
// remembers requestID.
func (s *Server) newOperation(kind, zone, target, requestID string, fail *Failure, done func()) *computepb.Operation {
	s.nextOp++
	name := fmt.Sprintf("operation-%d", s.nextOp)
	pb := &computepb.Operation{
		Name:          proto.String(name),
		OperationType: proto.String(kind),
		TargetLink:    proto.String(target),
		Status:        computepb.Operation_PENDING.Enum(),
		Progress:      proto.Int32(0),
		InsertTime:    proto.String(time.Now().UTC().Format(time.RFC3339)),
	}
	if zone != "" {
		pb.Zone = proto.String(s.link("zones/" + zone))
		pb.SelfLink = proto.String(s.link("zones/" + zone + "/operations/" + name))
	} else {
		pb.SelfLink = proto.String(s.link("global/operations/" + name))
	}
	op := &operation{pb: pb, done: done}
	if fail != nil {
		code, msg := fail.OpCode, fail.Message
		if msg == "" {
			msg = fmt.Sprintf("injected operation error %s", code)
		}
		op.done = nil
		op.failed = func() {
			pb.Error = &computepb.Error{Errors: []*computepb.Errors{{Code: proto.String(code), Message: proto.String(msg)}}}
			if !fail.OpWithoutHTTPStatus {
				status := fail.OpHTTPStatus
				if status == 0 {
					status = defaultOpHTTPStatus(code)
				}
				pb.HttpErrorStatusCode = proto.Int32(status)
				pb.HttpErrorMessage = proto.String(strings.ToUpper(http.StatusText(int(status))))
			}
		}
	}
	s.ops[name] = op
	if requestID != "" {
		s.requestIDs[requestID] = name
	}
	if s.opPolls == 0 {
		s.finish(op)
	}
	return proto.CloneOf(pb)
}

// finish moves op to DONE and applies its effect.
func (s *Server) finish(op *operation) {
	op.pb.Status = computepb.Operation_DONE.Enum()
	op.pb.Progress = proto.Int32(100)
	op.pb.EndTime = proto.String(time.Now().UTC().Format(time.RFC3339))
	if op.failed != nil {
		op.failed()
	} else if op.done != nil {
		op.done()
	}
}

// advance moves op one step on: PENDING to RUNNING, RUNNING to DONE at the last poll.
func (s *Server) advance(op *operation) {
	if op.pb.GetStatus() == computepb.Operation_DONE {
		return
	}
	op.polls++
	if op.polls >= s.opPolls {
		s.finish(op)
		return
	}
	op.pb.Status = computepb.Operation_RUNNING.Enum()
	op.pb.Progress = proto.Int32(int32(100 * op.polls / s.opPolls))
}

// replay answers a request whose requestId was seen before with that call's operation.
func (s *Server) replay(w http.ResponseWriter, requestID string) bool {
	if requestID == "" {
		return false
	}
	name, ok := s.requestIDs[requestID]
	if !ok {
		return false
	}
	writeProto(w, s.ops[name].pb)
	return true
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// validUUID says whether id is a UUID of the kinds GCE documents as valid: the RFC 4122
// variant, versions 1 to 5 (nothing shows it takes the newer versions 6 to 8, so the
// fake refuses them), and not the zero UUID.
func validUUID(id string) bool {
	if !uuidRE.MatchString(id) {
		return false
	}
	u, err := uuid.Parse(id)
	return err == nil && u.Variant() == uuid.RFC4122 && u.Version() >= 1 && u.Version() <= 5
}

// checkRequestID refuses a requestId that is not a valid UUID, as GCE does.
func checkRequestID(w http.ResponseWriter, id string) bool {
	if id != "" && !validUUID(id) {
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'requestId': '%s'. The requestId must be a valid UUID with the exception that zero UUID is not supported.", id))
		return false
	}
	return true
}

func (s *Server) zoneKnown(w http.ResponseWriter, zone string) bool {
	if _, ok := s.zones[zone]; !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s' was not found", s.project, zone))
		return false
	}
	return true
}

func (s *Server) instanceNotFound(w http.ResponseWriter, zone, name string) {
	writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", s.project, zone, name))
}

func (s *Server) getInstance(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.start(w, r, InstancesGet, nil); !ok {
		return
	}
	zone, name := r.PathValue("zone"), r.PathValue("name")
	if !s.zoneKnown(w, zone) {
		return
	}
	inst, ok := s.instances[zone][name]
	if !ok {
		s.instanceNotFound(w, zone, name)
		return
	}
	// An operation goes on whether or not anyone polls it: reading its instance moves it
	// along too.
	for _, op := range s.ops {
		if op.pb.GetTargetLink() == inst.GetSelfLink() {
			s.advance(op)
		}
	}
	if inst, ok = s.instances[zone][name]; !ok {
		s.instanceNotFound(w, zone, name)
		return
	}
	writeProto(w, inst)
}

var nameRE = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

// labelValueRE is GCE's charset for label keys and values.
var labelValueRE = regexp.MustCompile(`^[\p{Ll}\p{Lo}0-9_-]{0,63}$`)

func (s *Server) insertInstance(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	fail, ok := s.start(w, r, InstancesInsert, body)
	if !ok {
		return
	}
	zone, rid := r.PathValue("zone"), r.URL.Query().Get("requestId")
	if !s.zoneKnown(w, zone) || !checkRequestID(w, rid) || s.replay(w, rid) {
		return
	}
	inst := &computepb.Instance{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(body, inst); err != nil {
		writeError(w, http.StatusBadRequest, "parseError", fmt.Sprintf("Invalid JSON payload received. %v", err))
		return
	}
	name := inst.GetName()
	if !nameRE.MatchString(name) {
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.name': '%s'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'", name))
		return
	}
	for k, v := range inst.Labels {
		if k == "" || !labelValueRE.MatchString(k) || !labelValueRE.MatchString(v) {
			writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'resource.labels': %q=%q", k, v))
			return
		}
	}
	if !s.checkNetworks(w, zone, inst) {
		return
	}
	if _, exists := s.instances[zone][name]; exists {
		writeError(w, http.StatusConflict, "alreadyExists", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' already exists", s.project, zone, name))
		return
	}
	if fail != nil {
		writeProto(w, s.newOperation("insert", zone, s.link("zones/"+zone+"/instances/"+name), rid, fail, nil))
		return
	}
	s.nextID++
	nat, internal := s.addresses()
	inst.Id = proto.Uint64(s.nextID)
	inst.Zone = proto.String(s.link("zones/" + zone))
	inst.SelfLink = proto.String(s.link("zones/" + zone + "/instances/" + name))
	inst.Status = proto.String("PROVISIONING")
	inst.CreationTimestamp = proto.String(time.Now().UTC().Format(time.RFC3339Nano))
	for i, ni := range inst.NetworkInterfaces {
		ni.Name = proto.String(fmt.Sprintf("nic%d", i))
		ni.NetworkIP = proto.String(internal)
		for _, ac := range ni.AccessConfigs {
			ac.NatIP = proto.String(nat)
		}
	}
	if s.instances[zone] == nil {
		s.instances[zone] = map[string]*computepb.Instance{}
	}
	s.instances[zone][name] = inst
	writeProto(w, s.newOperation("insert", zone, inst.GetSelfLink(), rid, nil, func() {
		if cur, ok := s.instances[zone][name]; ok && cur == inst {
			inst.Status = proto.String("RUNNING")
		}
	}))
}

// instanceCall is the common front of a call on one existing instance (delete, start):
// it records the call, answers injected, invalid and replayed requests and a missing
// instance, under s.mu. ok is false when it has answered.
func (s *Server) instanceCall(w http.ResponseWriter, r *http.Request, method string) (inst *computepb.Instance, zone, rid string, fail *Failure, ok bool) {
	fail, ok = s.start(w, r, method, nil)
	if !ok {
		return nil, "", "", nil, false
	}
	zone, name, rid := r.PathValue("zone"), r.PathValue("name"), r.URL.Query().Get("requestId")
	if !s.zoneKnown(w, zone) || !checkRequestID(w, rid) || s.replay(w, rid) {
		return nil, "", "", nil, false
	}
	inst, exists := s.instances[zone][name]
	if !exists {
		s.instanceNotFound(w, zone, name)
		return nil, "", "", nil, false
	}
	return inst, zone, rid, fail, true
}

func (s *Server) deleteInstance(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, zone, rid, fail, ok := s.instanceCall(w, r, InstancesDelete)
	if !ok {
		return
	}
	var done func()
	if fail == nil {
		inst.Status = proto.String("STOPPING")
		done = func() {
			if cur, ok := s.instances[zone][inst.GetName()]; ok && cur == inst {
				delete(s.instances[zone], inst.GetName())
			}
		}
	}
	writeProto(w, s.newOperation("delete", zone, inst.GetSelfLink(), rid, fail, done))
}

func (s *Server) startInstance(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, zone, rid, fail, ok := s.instanceCall(w, r, InstancesStart)
	if !ok {
		return
	}
	var done func()
	if fail == nil {
		inst.Status = proto.String("STAGING")
		done = func() {
			inst.Status = proto.String("RUNNING")
			nat, _ := s.addresses()
			for _, ni := range inst.NetworkInterfaces {
				for _, ac := range ni.AccessConfigs {
					ac.NatIP = proto.String(nat)
				}
			}
		}
	}
	writeProto(w, s.newOperation("start", zone, inst.GetSelfLink(), rid, fail, done))
}

// addresses hands out the next external and internal address: from 203.0.113.0/24 and
// 198.51.100.0/24, or the address SetNATAddress set for both.
func (s *Server) addresses() (nat, internal string) {
	if s.natAddress != "" {
		return s.natAddress, s.natAddress
	}
	s.nextIP++
	return fmt.Sprintf("203.0.113.%d", s.nextIP%254+1), fmt.Sprintf("198.51.100.%d", s.nextIP%254+1)
}

func (s *Server) getOperation(method string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.start(w, r, method, nil); !ok {
			return
		}
		op, ok := s.ops[r.PathValue("op")]
		zonal := method == ZoneOperationsGet
		if ok && zonal && op.pb.GetZone() != s.link("zones/"+r.PathValue("zone")) || ok && !zonal && op.pb.Zone != nil {
			ok = false
		}
		if !ok {
			writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource '%s' was not found", r.URL.Path))
			return
		}
		s.advance(op)
		writeProto(w, op.pb)
	}
}

// opFilterRE is the one filter the fake takes on operations: operationType = "TYPE".
var opFilterRE = regexp.MustCompile(`^\(?\s*operationType\s*=\s*"([a-zA-Z.]+)"\s*\)?$`)

// listZoneOperations answers the zone's operations, all or those of one operationType,
// newest first; any other filter is refused, so that one the provider gets wrong fails.
func (s *Server) listZoneOperations(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.start(w, r, ZoneOperationsList, nil); !ok {
		return
	}
	zone := r.PathValue("zone")
	if !s.zoneKnown(w, zone) {
		return
	}
	typ := ""
	if f := strings.TrimSpace(r.URL.Query().Get("filter")); f != "" {
		m := opFilterRE.FindStringSubmatch(f)
		if m == nil {
			writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for field 'filter': cannot parse %q", f))
			return
		}
		typ = m[1]
	}
	out := &computepb.OperationList{}
	for _, op := range s.ops {
		if op.pb.GetZone() == s.link("zones/"+zone) && (typ == "" || op.pb.GetOperationType() == typ) {
			out.Items = append(out.Items, op.pb)
		}
	}
	sort.Slice(out.Items, func(i, j int) bool { return out.Items[i].GetInsertTime() > out.Items[j].GetInsertTime() })
	writeProto(w, out)
}

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
// GCE does: one rule holds one family.
func mixedFamilies(ranges []string) string {
	fam := map[bool]string{}
	for i, r := range ranges {
		pfx, err := netip.ParsePrefix(r)
		if err != nil {
			return fmt.Sprintf("Invalid value for field 'resource.sourceRanges[%d]': '%s'. Must be a valid IPV4 or IPV6 CIDR.", i, r)
		}
		fam[pfx.Addr().Is4()] = r
	}
	if len(fam) == 2 {
		return fmt.Sprintf("Invalid value for field 'resource.sourceRanges': IPv4 (%s) and IPv6 (%s) ranges cannot be mixed in one firewall rule.", fam[true], fam[false])
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
