package framework

import (
	"fmt"
	"sync"
	"testing"
)

// Checks records the checks a long story failed and repeats them as the test's last
// lines. A real-host story logs minutes of progress after a failed check (it goes on to
// the checks after it), and whoever reads only the end of the output (a CI summary, a
// terminal's scrollback) should still see why it failed.
type Checks struct {
	t      testing.TB
	mu     sync.Mutex
	failed []string
}

// NewChecks returns the recorder of t. Make it first thing in the test: the summary is
// a cleanup, and cleanups run last-registered first, so it then comes after every other.
func NewChecks(t testing.TB) *Checks {
	c := &Checks{t: t}
	t.Cleanup(c.summary)
	return c
}

// Errorf fails the test as t.Errorf does and records the message for the summary.
func (c *Checks) Errorf(format string, args ...any) {
	c.t.Helper()
	msg := fmt.Sprintf(format, args...)
	c.mu.Lock()
	c.failed = append(c.failed, msg)
	c.mu.Unlock()
	c.t.Error(msg)
}

// Failed is every message recorded so far, in order.
func (c *Checks) Failed() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.failed...)
}

func (c *Checks) summary() {
	failed := c.Failed()
	switch {
	case len(failed) > 0:
		c.t.Logf("FAILED: %d check(s):", len(failed))
		for _, msg := range failed {
			c.t.Logf("  - %s", msg)
		}
	case c.t.Failed():
		c.t.Logf("FAILED: the test stopped at a fatal error (above, before the clean-up's lines)")
	}
}
