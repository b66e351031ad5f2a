package gateway

import (
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// sessions is this replica's view of the sessions it carries: for the live-sessions gauge
// and to log a soft session's move. It plays no part in the choice, which is the
// Chooser's rendezvous over the session key, the same on every replica.
type sessions struct {
	mu        sync.Mutex
	m         map[string]*sessionEntry
	lastSweep time.Time
}

type sessionEntry struct {
	exit    string
	pool    poolKey // the exit's namespace and the requested pool
	expires time.Time
}

func newSessions() *sessions { return &sessions{m: map[string]*sessionEntry{}} }

func sessionKey(o Options) string {
	return o.Namespace + "/" + o.Pool + "/" + o.Session
}

// touch records that the session of rt now uses exit, for its sesstime from now.
func (s *sessions) touch(rt *route, exit Exit, log logr.Logger) {
	now := time.Now()
	key := sessionKey(rt.opts)
	id := exit.ID()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[key]
	switch {
	case e == nil || now.After(e.expires):
		e = &sessionEntry{exit: id}
		s.m[key] = e
	case e.exit != id:
		log.Info("session moved to another exit", "session", rt.opts.Session, "pool", rt.opts.Pool, "from", e.exit, "to", id, "site", rt.site)
		e.exit = id
	}
	e.pool = rt.demand
	e.expires = now.Add(rt.opts.TTL())
	if now.Sub(s.lastSweep) > time.Minute {
		s.sweepLocked(now)
	}
}

func (s *sessions) sweepLocked(now time.Time) {
	s.lastSweep = now
	for k, e := range s.m {
		if now.After(e.expires) {
			delete(s.m, k)
		}
	}
}

// live is how many sessions are within their sesstime.
func (s *sessions) live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(time.Now())
	return len(s.m)
}

// perPool counts the live sessions of each pool (sessions without a pool are left out).
func (s *sessions) perPool() map[poolKey]int {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[poolKey]int{}
	for _, e := range s.m {
		if e.pool.pool != "" && !now.After(e.expires) {
			out[e.pool]++
		}
	}
	return out
}
