//go:build e2e

package e2e

import (
	"testing"
	"time"
)

// TestSpanSaysWhatItCouldNotMeasure: a moment never recorded (the replacement's domain
// start, say) prints as not measured, never as a subtraction from the zero time.
func TestSpanSaysWhatItCouldNotMeasure(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		from, to time.Time
		want     string
	}{
		{t0, t0.Add(1500 * time.Millisecond), "1.5s"},
		{time.Time{}, t0, "not measured (start not seen)"},
		{t0, time.Time{}, "not measured (end not seen)"},
		{time.Time{}, time.Time{}, "not measured (neither end seen)"},
	} {
		if got := span(tc.from, tc.to, 100*time.Millisecond); got != tc.want {
			t.Errorf("span(%v, %v) = %q, want %q", tc.from, tc.to, got, tc.want)
		}
	}
}
