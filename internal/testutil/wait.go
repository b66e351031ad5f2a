package testutil

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// WaitLong is the deadline of an in-process or envtest wait (WaitFor): one only a broken
// test reaches, generous enough for a loaded machine. Tiers that boot guests set their own.
const WaitLong = 30 * time.Second

// WaitOption changes how WaitFor polls or what it says.
type WaitOption func(*waitConfig)

type waitConfig struct {
	every     time.Duration // 0: from 1 ms, doubling up to maxInterval
	logEvery  time.Duration // 0: no progress lines
	onTimeout func() string
}

// maxInterval is where WaitFor's default interval stops growing: an in-process condition
// is seen within a millisecond or two, one behind an API server costs one read per 50 ms.
const maxInterval = 50 * time.Millisecond

// Every polls at a fixed interval, for conditions that are costly to evaluate (a virsh
// call, a process on a real host).
func Every(d time.Duration) WaitOption { return func(c *waitConfig) { c.every = d } }

// LogEvery logs, every d, how long WaitFor has been waiting and the last state seen, for
// waits of minutes.
func LogEvery(d time.Duration) WaitOption { return func(c *waitConfig) { c.logEvery = d } }

// OnTimeout adds what describe returns to the failure, for context too costly to gather
// on every poll (a process's log, the host's domains).
func OnTimeout(describe func() string) WaitOption {
	return func(c *waitConfig) { c.onTimeout = describe }
}

// WaitFor calls cond until it reports true and returns how long that took. cond's error is
// the last state it observed, or why it could not look ("phase Provisioning", "3 of 5
// Running", a failed read); nil when it has nothing to say. When timeout passes first,
// WaitFor fails the test with what it waited for, for how long, and that last state.
//
// timeout is a deadline only a broken test reaches, never a measure of speed: tests wait
// on conditions, never on a fixed sleep. WaitFor calls t.Fatalf, so it must run on the
// test's goroutine; cond may call t.Fatalf too (to stop on something that will never
// change).
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, error), opts ...WaitOption) time.Duration {
	t.Helper()
	var c waitConfig
	for _, o := range opts {
		o(&c)
	}
	start := time.Now()
	deadline := start.Add(timeout)
	nextLog := start.Add(c.logEvery)
	interval := c.every
	if interval <= 0 {
		interval = time.Millisecond
	}
	for {
		ok, state := cond()
		if ok {
			return time.Since(start)
		}
		now := time.Now()
		if now.After(deadline) {
			msg := fmt.Sprintf("gave up after %s waiting for %s; last seen: %s", timeout, what, describeState(state))
			if c.onTimeout != nil {
				msg += "\n" + strings.TrimRight(c.onTimeout(), "\n")
			}
			t.Fatal(msg)
		}
		if c.logEvery > 0 && now.After(nextLog) {
			t.Logf("still waiting (%s) for %s: %s", now.Sub(start).Round(time.Second), what, describeState(state))
			nextLog = now.Add(c.logEvery)
		}
		time.Sleep(min(interval, time.Until(deadline)+time.Millisecond))
		if c.every <= 0 {
			interval = min(2*interval, maxInterval)
		}
	}
}

func describeState(err error) string {
	if err == nil {
		return "nothing reported"
	}
	return err.Error()
}
