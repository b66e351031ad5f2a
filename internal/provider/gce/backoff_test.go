package gce

import (
	"slices"
	"testing"
	"time"
)

// The wait between polls starts at the first interval and doubles up to the longest,
// where it stays.
func TestPollBackoff(t *testing.T) {
	p := &Provider{pollInitial: time.Second, pollMax: 10 * time.Second}
	b := p.pollBackoff()
	var got []time.Duration
	for range 7 {
		got = append(got, b.Step())
	}
	want := []time.Duration{1, 2, 4, 8, 10, 10, 10}
	for i := range want {
		want[i] *= time.Second
	}
	if !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v", got, want)
	}
	// A first interval above the longest is cut to it.
	p = &Provider{pollInitial: time.Minute, pollMax: 10 * time.Second}
	if d := p.pollBackoff().Step(); d != 10*time.Second {
		t.Errorf("first wait %v with pollInitial above pollMax, want 10s", d)
	}
}
