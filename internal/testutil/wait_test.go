package testutil

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	WaitFor(t, time.Minute, "the third call", func() (bool, error) { return calls.Add(1) == 3, nil })
	if n := calls.Load(); n != 3 {
		t.Fatalf("cond called %d times, want exactly until it held (3)", n)
	}
}

// TestWaitForTimeoutSaysWhatAndLastState: the failure names what was awaited, the
// deadline, and the last state the condition reported, not an earlier one.
func TestWaitForTimeoutSaysWhatAndLastState(t *testing.T) {
	r := &fakeT{TB: t}
	n := 0
	fatal := r.run(func() {
		WaitFor(r, 30*time.Millisecond, "the proxy to run", func() (bool, error) {
			n++
			return false, fmt.Errorf("phase Provisioning, poll %d", n)
		})
	})
	if !fatal {
		t.Fatal("WaitFor returned for a condition that never held")
	}
	for _, want := range []string{"gave up after 30ms waiting for the proxy to run", fmt.Sprintf("last seen: phase Provisioning, poll %d", n)} {
		if !strings.Contains(r.msg, want) {
			t.Errorf("failure %q lacks %q", r.msg, want)
		}
	}
	if n < 2 {
		t.Errorf("cond called %d times in 30 ms, want it polled", n)
	}
}

func TestWaitForWithoutStateAndOnTimeout(t *testing.T) {
	r := &fakeT{TB: t}
	r.run(func() {
		WaitFor(r, 5*time.Millisecond, "nothing", func() (bool, error) { return false, nil },
			OnTimeout(func() string { return "--- manager log:\nline one\n" }))
	})
	if !strings.Contains(r.msg, "last seen: nothing reported\n--- manager log:\nline one") || strings.HasSuffix(r.msg, "\n") {
		t.Errorf("failure %q", r.msg)
	}
}

// TestWaitForEveryAndLogEvery: a fixed interval is kept (no call sooner than it after the
// first), and progress lines carry the last state.
func TestWaitForEveryAndLogEvery(t *testing.T) {
	r := &fakeT{TB: t}
	var times []time.Time
	r.run(func() {
		WaitFor(r, 60*time.Millisecond, "slow thing", func() (bool, error) {
			times = append(times, time.Now())
			return false, errors.New("still 2 left")
		}, Every(20*time.Millisecond), LogEvery(time.Nanosecond))
	})
	if len(times) < 2 || len(times) > 5 {
		t.Fatalf("%d calls in 60 ms at a 20 ms interval", len(times))
	}
	for i := 1; i < len(times)-1; i++ { // the last sleep is cut to the deadline
		if d := times[i].Sub(times[i-1]); d < 20*time.Millisecond {
			t.Errorf("call %d came %s after the one before, want at least 20ms", i, d)
		}
	}
	if len(r.logs) == 0 || !strings.Contains(r.logs[0], "for slow thing: still 2 left") {
		t.Errorf("progress lines %q", r.logs)
	}
}
