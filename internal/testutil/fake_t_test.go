package testutil

import (
	"fmt"
	"testing"
)

// fakeT is a testing.TB whose Fatal and Fatalf record the message and end the calling
// function, as the real ones end the test.
type fakeT struct {
	testing.TB
	msg  string
	logs []string
}

func (r *fakeT) Helper() {}

func (r *fakeT) Fatal(args ...any) {
	r.msg = fmt.Sprint(args...)
	panic(r)
}

func (r *fakeT) Fatalf(format string, args ...any) { r.Fatal(fmt.Sprintf(format, args...)) }

func (r *fakeT) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

// run calls f with r and reports whether it ended in r.Fatal.
func (r *fakeT) run(f func()) (fatal bool) {
	defer func() {
		if p := recover(); p != nil {
			if p != r {
				panic(p)
			}
			fatal = true
		}
	}()
	f()
	return false
}
