package gcefake

import (
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"
)

type operation struct {
	pb    *computepb.Operation
	polls int
	// done runs when the operation reaches DONE without an error.
	done func()
	// failed runs when it reaches DONE with an error.
	failed func()
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
