package provider

import (
	"errors"
	"fmt"
	"time"
)

// The error classes. A provider wraps every error it returns with exactly one of them;
// callers test with errors.Is.
var (
	// ErrPermanent: retrying the same request cannot succeed. The reconciler latches the
	// Proxy as Failed until its spec changes.
	ErrPermanent = errors.New("permanent")
	// ErrQuotaExceeded: capacity is short right now. The reconciler waits QuotaRetry and
	// tries again, off the error backoff curve.
	ErrQuotaExceeded = errors.New("quota exceeded")
	// ErrNotFound: the instance does not exist (Get and Reboot only).
	ErrNotFound = errors.New("not found")
	// ErrTransient: anything a retry may fix.
	ErrTransient = errors.New("transient")
	// ErrPending: not a failure. The provider started (or joined) work that outlives the
	// call, such as a base image download, and the same request should be repeated
	// shortly; a repeat either finds the work done and goes on, is pending again, or
	// reports how the work failed. The reconciler waits PendingRetry, off the error
	// backoff curve, and shows the progress the error carries (PendingProgress).
	ErrPending = errors.New("pending")
)

// ErrLeftBehind is not a class: Delete wraps it (with ErrPermanent) when it cannot reach
// or even name the place the instance lives in any more (a kvm2 host removed from the
// providers config), so the instance may still run there. The reconciler lets the Proxy
// finish deleting, but says so with a Warning event instead of a "deleted" one.
var ErrLeftBehind = errors.New("instance left behind")

// ErrOwnedByOther is not a class either: Create wraps it (with ErrPermanent) when the
// instance of the requested name exists but belongs to another Proxy UID of this install (a
// Proxy deleted and applied again, or restored from a backup, while its old instance is
// still there). An instance of another install is plain ErrPermanent: this install's GC
// never removes it, so nothing here can clear it. Retrying the same request cannot succeed while
// that instance stands, but the cause can clear by itself (orphan GC deletes the old
// instance once no Proxy owns it), so the reconciler checks such a Failed Proxy again
// on a slow timer and as soon as orphan GC deletes an instance of that name, instead of
// latching it Failed until its spec changes.
var ErrOwnedByOther = errors.New("instance owned by another")

// ErrPreempted is not a class either: Get wraps it (with ErrNotFound) when the instance is
// gone because the cloud reclaimed it (a gce Spot VM preempted), not because anyone
// deleted it. The reconciler builds the instance again as for any ErrNotFound, but says
// so: a Warning Preempted Event with the provider's message, the preemptions counter by
// zone, and a Preempted condition on the Proxy until its successor is Ready.
var ErrPreempted = errors.New("instance preempted")

// Preempted marks err with ErrPreempted and the ErrNotFound class, keeping its text.
func Preempted(err error) error {
	if err == nil {
		return nil
	}
	return NotFound(&markError{mark: ErrPreempted, err: err})
}

// OwnedByOther marks err with ErrOwnedByOther and the ErrPermanent class, keeping its
// text: provider.OwnedByOther(fmt.Errorf("domain %s on host %s belongs to UID %s, not %s", ...)).
func OwnedByOther(err error) error {
	if err == nil {
		return nil
	}
	return Permanent(&markError{mark: ErrOwnedByOther, err: err})
}

// markError carries a marker next to an error, like classError, showing only the error.
type markError struct {
	mark error
	err  error
}

func (e *markError) Error() string   { return e.err.Error() }
func (e *markError) Unwrap() []error { return []error{e.err, e.mark} }

// classError carries a class next to the underlying error, so that errors.Is finds both
// the class and whatever the cause wraps, while Error() shows only the cause.
type classError struct {
	class error
	err   error
}

func (e *classError) Error() string   { return e.err.Error() }
func (e *classError) Unwrap() []error { return []error{e.err, e.class} }

// WithClass attaches class to err. An err that already carries a class keeps it.
func WithClass(class, err error) error {
	if err == nil {
		return nil
	}
	if Class(err) != nil {
		return err
	}
	return &classError{class: class, err: err}
}

// Errorf formats an error and attaches class to it.
func Errorf(class error, format string, args ...any) error {
	return WithClass(class, fmt.Errorf(format, args...))
}

// Permanent, QuotaExceeded, NotFound and Transient are shorthands for WithClass.
func Permanent(err error) error     { return WithClass(ErrPermanent, err) }
func QuotaExceeded(err error) error { return WithClass(ErrQuotaExceeded, err) }
func NotFound(err error) error      { return WithClass(ErrNotFound, err) }
func Transient(err error) error     { return WithClass(ErrTransient, err) }

// Class returns the class err carries, or nil when it carries none.
func Class(err error) error {
	for _, c := range []error{ErrPermanent, ErrQuotaExceeded, ErrNotFound, ErrTransient, ErrPending} {
		if errors.Is(err, c) {
			return c
		}
	}
	return nil
}

// ClassName names err's class for metrics and logs: permanent, quota, notfound,
// transient, pending, unclassified, or none for a nil error.
func ClassName(err error) string {
	if err == nil {
		return "none"
	}
	switch Class(err) {
	case ErrPermanent:
		return "permanent"
	case ErrQuotaExceeded:
		return "quota"
	case ErrNotFound:
		return "notfound"
	case ErrTransient:
		return "transient"
	case ErrPending:
		return "pending"
	}
	return "unclassified"
}

// pendingError is the ErrPending result: the progress of the work the call is waiting
// for, its message as the error text.
type pendingError struct{ p Progress }

func (e *pendingError) Error() string {
	if e.p.Message == "" {
		return "pending"
	}
	return e.p.Message
}
func (e *pendingError) Unwrap() error { return ErrPending }

// Pending returns an ErrPending result carrying p, the progress of the work the caller
// should come back for.
func Pending(p Progress) error { return &pendingError{p: p} }

// PendingProgress returns the progress an ErrPending result carries; ok is false for
// any other error.
func PendingProgress(err error) (p Progress, ok bool) {
	var pe *pendingError
	if errors.As(err, &pe) {
		return pe.p, true
	}
	return Progress{}, false
}

// retryAfterer is an error that knows how long the provider's API will refuse calls (a
// rate limit's reset): hcloud's rate-limited answers implement it.
type retryAfterer interface{ RetryAfter() time.Duration }

// RetryAfter returns how long to wait before calling the provider again after err (an
// ErrTransient error whose cause, such as a rate limit, says when it clears), or 0 when
// err says nothing of it or the wait is over. The Proxy reconciler requeues a transient
// error after this wait (at most its error backoff's cap) instead of on the backoff curve.
func RetryAfter(err error) time.Duration {
	var ra retryAfterer
	if !errors.As(err, &ra) {
		return 0
	}
	return max(ra.RetryAfter(), 0)
}
