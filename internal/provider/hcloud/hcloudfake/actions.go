package hcloudfake

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud/schema"
)

type action struct {
	a schema.Action
	// reads is how many reads moved it on; lastSeq the request that did last.
	reads   int
	lastSeq uint64
	// after is an action that must finish before this one moves (start_server after
	// create_server).
	after *action
	// fail is the error it ends with; nil: success.
	fail *schema.ActionError
	// done runs when it ends in success, failed when it ends in error.
	done, failed func()
}

// newAction starts an action of command on resources ("server", id...). A failure
// injected on the call makes it end in error. It finishes at once when actionPolls is 0.
func (s *Server) newAction(command string, after *action, done, failed func(), resources ...schema.ActionResourceReference) *action {
	a := &action{a: schema.Action{
		ID: s.id(), Command: command, Status: "running", Progress: 0, Started: s.now(),
		Resources: resources,
	}, after: after, done: done, failed: failed}
	if s.pendingFail != nil {
		msg := s.pendingFail.Message
		if msg == "" {
			msg = fmt.Sprintf("injected %s for %s", s.pendingFail.ActionCode, command)
		}
		a.fail = &schema.ActionError{Code: s.pendingFail.ActionCode, Message: msg}
	}
	s.actions[a.a.ID] = a
	if s.actionPolls == 0 {
		s.finish(a)
	}
	return a
}

func ref(typ string, id int64) schema.ActionResourceReference {
	return schema.ActionResourceReference{ID: id, Type: typ}
}

func (s *Server) finish(a *action) {
	if a.a.Status != "running" {
		return
	}
	if a.after != nil && a.after.a.Status == "running" {
		s.finish(a.after)
	}
	if a.after != nil && a.after.a.Status == "error" && a.fail == nil {
		// What depends on a failed action fails with it.
		a.fail = &schema.ActionError{Code: a.after.a.Error.Code, Message: a.after.a.Error.Message}
	}
	t := s.now()
	a.a.Finished = &t
	if a.fail != nil {
		a.a.Status, a.a.Error = "error", a.fail
		if a.failed != nil {
			a.failed()
		}
		return
	}
	a.a.Status, a.a.Progress = "success", 100
	if a.done != nil {
		a.done()
	}
}

// advance moves a running action one read on, once per request.
func (s *Server) advance(a *action) {
	if a.a.Status != "running" || a.lastSeq == s.seq {
		return
	}
	if a.after != nil && a.after.a.Status == "running" {
		return
	}
	a.lastSeq = s.seq
	a.reads++
	if a.reads >= s.actionPolls {
		s.finish(a)
		return
	}
	a.a.Progress = 100 * a.reads / s.actionPolls
}

// touch advances the running actions on a resource: reading it is how time passes.
func (s *Server) touch(typ string, id int64) {
	for _, aid := range sortedKeys(s.actions) {
		a := s.actions[aid]
		if a.a.Status != "running" {
			continue
		}
		for _, r := range a.a.Resources {
			if r.Type == typ && r.ID == id {
				s.advance(a)
				break
			}
		}
	}
}

// locked says whether a resource has a running action: the API refuses another with
// "locked".
func (s *Server) locked(typ string, id int64) bool {
	for _, a := range s.actions {
		if a.a.Status != "running" {
			continue
		}
		for _, r := range a.a.Resources {
			if r.Type == typ && r.ID == id {
				return true
			}
		}
	}
	return false
}

func writeLocked(w http.ResponseWriter, typ string, id int64) {
	writeError(w, http.StatusLocked, "locked", fmt.Sprintf("%s %d is locked: another action is running", typ, id), nil)
}

// Action returns an action as the API shows it.
func (s *Server) Action(id int64) (schema.Action, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.actions[id]
	if !ok {
		return schema.Action{}, false
	}
	return a.a, true
}

func (s *Server) getAction(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "action")
	if !ok {
		return
	}
	a, ok := s.actions[id]
	if !ok {
		notFound(w, "action", id)
		return
	}
	s.advance(a)
	writeJSON(w, http.StatusOK, schema.ActionGetResponse{Action: a.a})
}

// listActions answers GET /actions?id=..: the API has served it only filtered by id since
// 30 January 2025 (hcloud-go's ActionClient.All says so), so a call without id is
// invalid_input. It takes
// status and sort (id, command, status, progress, started, finished; :asc or :desc).
func (s *Server) listActions(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if len(q["id"]) == 0 {
		invalidInput(w, "id", "at least one id is required")
		return
	}
	var out []schema.Action
	for _, raw := range q["id"] {
		id, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			invalidInput(w, "id", fmt.Sprintf("%q is not an integer", raw))
			return
		}
		a, ok := s.actions[id]
		if !ok {
			continue
		}
		s.advance(a)
		if st := q["status"]; len(st) > 0 && !slices.Contains(st, a.a.Status) {
			continue
		}
		out = append(out, a.a)
	}
	respond(w, r, "actions", out, map[string]func(a, b schema.Action) int{
		"id":       func(a, b schema.Action) int { return cmpInt(a.ID, b.ID) },
		"command":  func(a, b schema.Action) int { return strings.Compare(a.Command, b.Command) },
		"status":   func(a, b schema.Action) int { return strings.Compare(a.Status, b.Status) },
		"progress": func(a, b schema.Action) int { return cmpInt(a.Progress, b.Progress) },
		"started":  func(a, b schema.Action) int { return a.Started.Compare(b.Started) },
		"finished": func(a, b schema.Action) int { return cmpTime(a.Finished, b.Finished) },
	})
}

func cmpInt[T int | int64](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpTime(a, b *time.Time) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return -1
	case b == nil:
		return 1
	}
	return a.Compare(*b)
}
