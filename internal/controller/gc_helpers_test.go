package controller

import (
	"fmt"
	"strings"
	"sync"

	"github.com/go-logr/logr"
)

// logLines keeps every log line (message and key/values) for assertions.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logger() logr.Logger { return logr.New(&linesSink{to: l}) }

func (l *logLines) count(sub string) int {
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

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

type linesSink struct {
	to *logLines
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
