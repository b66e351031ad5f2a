package gcefake

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// SetNATAddress makes every instance created from now on get addr as its external IP
// (and its internal one), such as 127.0.0.1 for a test whose probes must reach it.
func (s *Server) SetNATAddress(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.natAddress = addr
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
		for _, ac := range ni.Ipv6AccessConfigs {
			ac.ExternalIpv6 = nil
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
		s.assignIPv6(ni)
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

// instanceCall is the common front of a call on one existing instance (delete, start, reset):
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
			s.restarts[zone+"/"+inst.GetName()]++
			nat, _ := s.addresses()
			for _, ni := range inst.NetworkInterfaces {
				for _, ac := range ni.AccessConfigs {
					ac.NatIP = proto.String(nat)
				}
				s.assignIPv6(ni)
			}
		}
	}
	writeProto(w, s.newOperation("start", zone, inst.GetSelfLink(), rid, fail, done))
}

// resetInstance is instances.reset: a RUNNING instance is reset in place, as by the power
// button; it stays RUNNING with its addresses, and Restarts counts it once the operation
// is done. Any other status is 400 resourceNotReady, as GCE answers for a stopped VM.
func (s *Server) resetInstance(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, zone, rid, fail, ok := s.instanceCall(w, r, InstancesReset)
	if !ok {
		return
	}
	if inst.GetStatus() != "RUNNING" {
		writeError(w, http.StatusBadRequest, "resourceNotReady",
			fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' is not ready", s.project, zone, inst.GetName()))
		return
	}
	var done func()
	if fail == nil {
		done = func() {
			if cur, ok := s.instances[zone][inst.GetName()]; ok && cur == inst {
				s.restarts[zone+"/"+inst.GetName()]++
			}
		}
	}
	writeProto(w, s.newOperation("reset", zone, inst.GetSelfLink(), rid, fail, done))
}

// Restarts is how many resets and starts of the named instance have completed.
func (s *Server) Restarts(zone, name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restarts[zone+"/"+name]
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

// assignIPv6 gives each IPv6 access config of ni the next external IPv6 address, the
// first of a /96 from 2001:db8::/32, as GCE gives an instance a /96.
func (s *Server) assignIPv6(ni *computepb.NetworkInterface) {
	for _, ac := range ni.Ipv6AccessConfigs {
		s.nextIP++
		ac.ExternalIpv6 = proto.String(fmt.Sprintf("2001:db8:%x::", s.nextIP))
		ac.ExternalIpv6PrefixLength = proto.Int32(96)
	}
}
