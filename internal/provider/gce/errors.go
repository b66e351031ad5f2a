package gce

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/googleapi"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// errAlreadyExists marks an insert refused because the resource exists (HTTP 409
// alreadyExists, or an operation failing with RESOURCE_ALREADY_EXISTS): Create adopts.
var errAlreadyExists = errors.New("already exists")

// apiError is the googleapi.Error inside err, if any.
func apiError(err error) (*googleapi.Error, bool) {
	var ae *googleapi.Error
	ok := errors.As(err, &ae)
	return ae, ok
}

// reason is the first error item's reason of a googleapi.Error.
func reason(ae *googleapi.Error) string {
	for _, e := range ae.Errors {
		if e.Reason != "" {
			return e.Reason
		}
	}
	return ""
}

// httpCode is the HTTP status of a call's error, or 0.
func httpCode(err error) int {
	if ae, ok := apiError(err); ok {
		return ae.Code
	}
	return 0
}

func isNotFound(err error) bool { return httpCode(err) == http.StatusNotFound }

// capacityReasons are the reasons of a synchronous answer saying the zone has no room
// (a 503 stock-out): capacity, not a quick retry.
var capacityReasons = map[string]bool{"insufficientCapacity": true, "resourcePoolExhausted": true}

// isCapacity says whether a reason or operation code names a stock-out.
func isCapacity(code string) bool {
	return capacityReasons[code] || strings.Contains(strings.ToUpper(code), "RESOURCE_POOL_EXHAUSTED")
}

// classify gives a failed call's error its class; what names the call and its object.
//   - the capacity reasons of a 503 (ZONE_RESOURCE_POOL_EXHAUSTED, insufficientCapacity)
//     and the quota reasons (quotaExceeded): ErrQuotaExceeded, waited for like quota;
//   - 429, 5xx, the rate-limit reasons and 400 resourceNotReady (the resource is busy
//     with another operation): ErrTransient;
//   - 409 alreadyExists: ErrPermanent, also marked errAlreadyExists for Create;
//   - 404: ErrNotFound (callers turn it into what their contract says);
//   - every other 4xx (400 invalid, 401, 403 forbidden): ErrPermanent;
//   - anything without an HTTP status (network, timeouts): ErrTransient.
func classify(err error, what string) error {
	ae, ok := apiError(err)
	if !ok {
		return provider.Transient(fmt.Errorf("%s: %w", what, err))
	}
	r := reason(ae)
	wrapped := fmt.Errorf("%s: %w", what, err)
	if r != "" && !strings.Contains(err.Error(), r) {
		wrapped = fmt.Errorf("%s: %w (reason %s)", what, err, r)
	}
	switch {
	case isCapacity(r) || ae.Code >= 500 && isCapacity(ae.Message),
		r == "quotaExceeded" || strings.Contains(strings.ToUpper(r), "QUOTA_EXCEEDED"):
		return provider.QuotaExceeded(wrapped)
	case ae.Code == http.StatusTooManyRequests || ae.Code >= 500,
		r == "rateLimitExceeded", r == "userRateLimitExceeded", r == "backendError", r == "resourceNotReady":
		return provider.Transient(wrapped)
	case ae.Code == http.StatusConflict && (r == "alreadyExists" || r == ""):
		return provider.Permanent(&markedError{mark: errAlreadyExists, err: wrapped})
	case ae.Code == http.StatusNotFound:
		return provider.NotFound(wrapped)
	}
	return provider.Permanent(wrapped)
}

// busyOpCodes are operation error codes of a resource busy with another operation, or of
// a rate: transient whatever the httpErrorStatusCode (GCE gives RESOURCE_NOT_READY a 400,
// and retrying it is what mends it).
var busyOpCodes = map[string]bool{
	"RESOURCE_NOT_READY": true, "RATE_LIMIT_EXCEEDED": true, "RESOURCE_OPERATION_RATE_EXCEEDED": true,
	"UNSUPPORTED_OPERATION_ON_BUSY_RESOURCE": true,
}

// transientOpCodes are the further codes a retry may clear when the operation carries no
// httpErrorStatusCode.
var transientOpCodes = map[string]bool{
	"INTERNAL_ERROR": true, "SERVICE_UNAVAILABLE": true, "OPERATION_CANCELED": true,
}

// opError classifies an operation that ended DONE with an error. The error list decides
// first: QUOTA_EXCEEDED and any *RESOURCE_POOL_EXHAUSTED* code are ErrQuotaExceeded,
// RESOURCE_ALREADY_EXISTS is errAlreadyExists, the busyOpCodes are ErrTransient. Then
// the operation's httpErrorStatusCode when it has one (5xx and 429 transient, others
// permanent); without one, the codes of transientOpCodes are transient and every other
// code permanent.
func opError(op *computepb.Operation, what string) error {
	var codes, msgs []string
	for _, e := range op.GetError().GetErrors() {
		codes = append(codes, e.GetCode())
		msgs = append(msgs, e.GetCode()+": "+e.GetMessage())
	}
	err := fmt.Errorf("%s: operation %s failed: %s", what, op.GetName(), strings.Join(msgs, "; "))
	if len(codes) == 0 {
		err = fmt.Errorf("%s: operation %s failed: HTTP %d %s", what, op.GetName(), op.GetHttpErrorStatusCode(), op.GetHttpErrorMessage())
	}
	for _, c := range codes {
		switch {
		case c == "QUOTA_EXCEEDED" || isCapacity(c):
			return provider.QuotaExceeded(err)
		case c == "RESOURCE_ALREADY_EXISTS":
			return provider.Permanent(&markedError{mark: errAlreadyExists, err: err})
		case busyOpCodes[c]:
			return provider.Transient(err)
		}
	}
	if op.HttpErrorStatusCode != nil {
		if s := op.GetHttpErrorStatusCode(); s >= 500 || s == http.StatusTooManyRequests {
			return provider.Transient(err)
		}
		return provider.Permanent(err)
	}
	for _, c := range codes {
		if transientOpCodes[c] {
			return provider.Transient(err)
		}
	}
	return provider.Permanent(err)
}

// markedError carries a marker next to an error, showing only the error.
type markedError struct {
	mark error
	err  error
}

func (e *markedError) Error() string   { return e.err.Error() }
func (e *markedError) Unwrap() []error { return []error{e.err, e.mark} }

// referenceMissing turns the ErrNotFound of an insert into ErrPermanent: a 404 there is a
// resource the request names (an image family, a machine type, a network) that does not
// exist, which no retry mends.
func referenceMissing(err error) error {
	if errors.Is(err, provider.ErrNotFound) {
		return provider.Permanent(errors.New(err.Error()))
	}
	return err
}
