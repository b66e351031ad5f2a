package gcefake

import "net/http"

// Shape is one error as the real Compute API reports it, with what the gce provider
// makes of it. ErrorShapes is the single table of them: the fake injects them (Failure),
// the provider's mapping test runs every row, and the error mapping table of
// docs/gce-provider.md is rendered from it.
type Shape struct {
	// Name identifies the row (ShapeNamed).
	Name string
	// Failure is the injection that makes the fake answer this way.
	Failure Failure
	// Class is the provider's class for it, as provider.ClassName names it (permanent,
	// quota, transient), or "adopt" for an insert refused because the resource exists.
	Class string
	// Says is what GCE says, for the docs table.
	Says string
}

// ErrorShapes are the real error shapes the provider classifies: synchronous answers
// (an HTTP error with one error item of a reason) and operations that end DONE with an
// error list and, as real failed operations do, an httpErrorStatusCode; the last rows
// are operations without one, which GCE still sends for some codes.
var ErrorShapes = []Shape{
	{"sync 400 resourceNotReady", Failure{Code: http.StatusBadRequest, Reason: "resourceNotReady",
		Message: "The resource 'projects/p/zones/europe-west1-b/instances/proxy-0' is not ready"},
		"transient", "synchronous 400 `resourceNotReady` (the instance is busy with another operation)"},
	{"sync 503 ZONE_RESOURCE_POOL_EXHAUSTED", Failure{Code: http.StatusServiceUnavailable, Reason: "ZONE_RESOURCE_POOL_EXHAUSTED",
		Message: "The zone 'projects/p/zones/europe-west1-b' does not have enough resources available to fulfill the request.  Try a different zone, or try again later."},
		"quota", "synchronous 503 `ZONE_RESOURCE_POOL_EXHAUSTED` (a stock-out)"},
	{"sync 503 insufficientCapacity", Failure{Code: http.StatusServiceUnavailable, Reason: "insufficientCapacity",
		Message: "There is insufficient capacity in the zone to fulfill the request."},
		"quota", "synchronous 503 `insufficientCapacity`"},
	{"sync 403 quotaExceeded", Failure{Code: http.StatusForbidden, Reason: "quotaExceeded",
		Message: "Quota 'CPUS' exceeded.  Limit: 24.0 in region europe-west1."},
		"quota", "synchronous 403 `quotaExceeded`"},
	{"sync 403 rateLimitExceeded", Failure{Code: http.StatusForbidden, Reason: "rateLimitExceeded", Message: "Rate Limit Exceeded"},
		"transient", "synchronous 403 `rateLimitExceeded` / `userRateLimitExceeded`"},
	{"sync 429 rateLimitExceeded", Failure{Code: http.StatusTooManyRequests, Reason: "rateLimitExceeded", Message: "Too Many Requests"},
		"transient", "synchronous 429"},
	{"sync 500 backendError", Failure{Code: http.StatusInternalServerError, Reason: "backendError", Message: "Internal error. Please try again or contact Google Support."},
		"transient", "synchronous 500 `backendError`"},
	{"sync 502", Failure{Code: http.StatusBadGateway, Message: "Bad Gateway"},
		"transient", "synchronous 502"},
	{"sync 503 backendError", Failure{Code: http.StatusServiceUnavailable, Reason: "backendError", Message: "Service Unavailable"},
		"transient", "synchronous 503 of any other reason"},
	{"sync 400 invalid", Failure{Code: http.StatusBadRequest, Reason: "invalid", Message: "Invalid value for field 'resource.machineType'"},
		"permanent", "synchronous 400 `invalid` (or any other 400 reason)"},
	{"sync 401 authError", Failure{Code: http.StatusUnauthorized, Reason: "authError", Message: "Request had invalid authentication credentials."},
		"permanent", "synchronous 401"},
	{"sync 403 forbidden", Failure{Code: http.StatusForbidden, Reason: "forbidden", Message: "Required 'compute.instances.create' permission for 'projects/p/zones/europe-west1-b/instances/proxy-0'"},
		"permanent", "synchronous 403 `forbidden`"},
	{"sync 404 notFound of an insert", Failure{Code: http.StatusNotFound, Reason: "notFound",
		Message: "The resource 'projects/ubuntu-os-cloud/global/images/family/ubuntu-9904-lts' was not found"},
		"permanent", "synchronous 404 of an insert (an image family, machine type or network that does not exist)"},
	{"sync 409 alreadyExists", Failure{Code: http.StatusConflict, Reason: "alreadyExists",
		Message: "The resource 'projects/p/zones/europe-west1-b/instances/proxy-0' already exists"},
		"adopt", "synchronous 409 `alreadyExists`"},
	{"operation RESOURCE_NOT_READY 400", Failure{OpCode: "RESOURCE_NOT_READY", OpHTTPStatus: http.StatusBadRequest,
		Message: "The resource 'projects/p/zones/europe-west1-b/disks/proxy-0' is not ready"},
		"transient", "operation error `RESOURCE_NOT_READY` with `httpErrorStatusCode` 400 (and the other busy codes: `RESOURCE_OPERATION_RATE_EXCEEDED`, `RATE_LIMIT_EXCEEDED`, `UNSUPPORTED_OPERATION_ON_BUSY_RESOURCE`, whatever the status)"},
	{"operation QUOTA_EXCEEDED 403", Failure{OpCode: "QUOTA_EXCEEDED", OpHTTPStatus: http.StatusForbidden,
		Message: "Quota 'CPUS' exceeded.  Limit: 24.0 in region europe-west1."},
		"quota", "operation error `QUOTA_EXCEEDED`"},
	{"operation ZONE_RESOURCE_POOL_EXHAUSTED 503", Failure{OpCode: "ZONE_RESOURCE_POOL_EXHAUSTED", OpHTTPStatus: http.StatusServiceUnavailable,
		Message: "The zone 'projects/p/zones/europe-west1-b' does not have enough resources available to fulfill the request.  Try a different zone, or try again later."},
		"quota", "operation error with a code containing `RESOURCE_POOL_EXHAUSTED` (`ZONE_RESOURCE_POOL_EXHAUSTED`, `…_WITH_DETAILS`), whatever the status"},
	{"operation ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS 503", Failure{OpCode: "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", OpHTTPStatus: http.StatusServiceUnavailable,
		Message: "The zone 'projects/p/zones/europe-west1-b' does not have enough resources available to fulfill the request. '(resource type:compute)'."},
		"quota", ""},
	{"operation RESOURCE_ALREADY_EXISTS 409", Failure{OpCode: "RESOURCE_ALREADY_EXISTS", OpHTTPStatus: http.StatusConflict,
		Message: "The resource 'projects/p/zones/europe-west1-b/instances/proxy-0' already exists"},
		"adopt", "operation error `RESOURCE_ALREADY_EXISTS`"},
	{"operation INTERNAL_ERROR 500", Failure{OpCode: "INTERNAL_ERROR", OpHTTPStatus: http.StatusInternalServerError, Message: "Internal error."},
		"transient", "operation error with `httpErrorStatusCode` 5xx or 429"},
	{"operation INVALID_FIELD_VALUE 400", Failure{OpCode: "INVALID_FIELD_VALUE", OpHTTPStatus: http.StatusBadRequest,
		Message: "Invalid value for field 'resource.disks[0].initializeParams.diskSizeGb': '1'."},
		"permanent", "operation error with another `httpErrorStatusCode` (400, 403, 404) and another code"},
	{"operation INTERNAL_ERROR without status", Failure{OpCode: "INTERNAL_ERROR", OpWithoutHTTPStatus: true, Message: "Internal error."},
		"transient", "operation error without a status: `INTERNAL_ERROR`, `SERVICE_UNAVAILABLE`, `OPERATION_CANCELED` or one of the busy codes"},
	{"operation unknown code without status", Failure{OpCode: "IMAGE_NOT_FOUND_SOMEWHERE", OpWithoutHTTPStatus: true, Message: "something no retry mends"},
		"permanent", "operation error without a status, any other code"},
}

// ShapeNamed returns the injection of the row called name; it panics on a name not in
// ErrorShapes, so that a test cannot inject a shape the table does not hold.
func ShapeNamed(name string) Failure {
	for _, s := range ErrorShapes {
		if s.Name == name {
			return s.Failure
		}
	}
	panic("gcefake: no error shape " + name)
}

// defaultOpHTTPStatus is the httpErrorStatusCode real GCE puts on a failed operation of
// code, for an injection that names none.
func defaultOpHTTPStatus(code string) int32 {
	switch code {
	case "QUOTA_EXCEEDED":
		return http.StatusForbidden
	case "RESOURCE_ALREADY_EXISTS":
		return http.StatusConflict
	case "INTERNAL_ERROR":
		return http.StatusInternalServerError
	case "SERVICE_UNAVAILABLE", "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS":
		return http.StatusServiceUnavailable
	case "RESOURCE_NOT_FOUND":
		return http.StatusNotFound
	}
	return http.StatusBadRequest
}
