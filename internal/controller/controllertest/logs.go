// Package controllertest holds what the controllers' tests share: the fake provider's
// name, a log sink for assertions, clients that count or refuse watches, the stand-in for
// the health engine's status writes, an admission check, and PoolEnv, one test's
// namespace, manager, fake provider and fake clock with the pool reconciler's helpers.
package controllertest

import (
	"fmt"
	"strings"
	"sync"

	"github.com/go-logr/logr"
)

// LogLines keeps every log line (message and key/values) for assertions.
type LogLines struct {
	mu    sync.Mutex
	lines []string
}

// Logger writes to l.
func (l *LogLines) Logger() logr.Logger { return logr.New(&linesSink{to: l}) }

// Count is how many lines contain sub.
func (l *LogLines) Count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if strings.Contains(s, sub) {
			n++
		}
	}
	return n
}

// Add keeps line as it is (for a logger of another kind, such as funcr).
func (l *LogLines) Add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
}

func (l *LogLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

type linesSink struct {
	to *LogLines
	kv []any
}

func (s *linesSink) Init(logr.RuntimeInfo)                  {}
func (s *linesSink) Enabled(int) bool                       { return true }
func (s *linesSink) Info(_ int, msg string, kv ...any)      { s.add(msg, kv) }
func (s *linesSink) Error(err error, msg string, kv ...any) { s.add(msg+": "+err.Error(), kv) }
func (s *linesSink) WithName(string) logr.LogSink           { return s }
func (s *linesSink) WithValues(kv ...any) logr.LogSink {
	return &linesSink{to: s.to, kv: append(append([]any(nil), s.kv...), kv...)}
}

func (s *linesSink) add(msg string, kv []any) {
	s.to.mu.Lock()
	defer s.to.mu.Unlock()
	s.to.lines = append(s.to.lines, fmt.Sprint(msg, " ", s.kv, kv))
}
