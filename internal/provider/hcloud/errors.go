package hcloud

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	hc "github.com/hetznercloud/hcloud-go/v2/hcloud"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// errAlreadyExists marks a create refused because a resource of that name exists
// (uniqueness_error): Create reads it again and adopts it, or refuses it by the ownership
// rules.
var errAlreadyExists = errors.New("already exists")

// errInUse marks a firewall delete refused because the firewall is still applied
// (resource_in_use): the server's deletion has not released it yet.
var errInUse = errors.New("in use")

// errCredentials marks an unauthorized or forbidden answer: the token is refused.
var errCredentials = errors.New("token refused")

// Mapping is how one error code of the API (in an error answer, or in a failed action's
// error) is classed.
type Mapping struct {
	// Code is the API's error code.
	Code hc.ErrorCode
	// Class is the provider error class: permanent, quota, transient, notfound, or adopt
	// (uniqueness_error: the resource is read again and adopted).
	Class string
	// Says is what the code means, for the docs' table.
	Says string
}

// Mappings are the error codes the provider classes, in the order of the docs' table.
// A code not listed is classed by its HTTP status: 5xx and 429 transient, any other
// permanent; a failed action's unlisted code is permanent.
var Mappings = []Mapping{
	{hc.ErrorCodeRateLimitExceeded, "transient", "`rate_limit_exceeded` (429; 3600 requests an hour per project): the message names when the limit resets, from the `RateLimit-Reset` header, and `RetryAfter` returns the wait"},
	{hc.ErrorCodeResourceUnavailable, "quota", "`resource_unavailable` (the server type is sold out in the location)"},
	{hc.ErrorCodePlacementError, "quota", "`placement_error` (no host in the location could take the server; usually a failed `create_server` action)"},
	{hc.ErrorCodeResourceLimitExceeded, "quota", "`resource_limit_exceeded` (a project limit: servers, primary IPs, firewalls, cores)"},
	{hc.ErrorCodeNoSpaceLeftInLocation, "quota", "`no_space_left_in_location`"},
	{hc.ErrorCodeUniquenessError, "adopt", "`uniqueness_error` (a server or firewall of that name exists)"},
	{hc.ErrorCodeInvalidInput, "permanent", "`invalid_input` (400): the message names each field the API refused and what it stands for (`server_type`: `placement.machineType`, `location`: `placement.zone`, `image`: `placement.image`, `user_data`: the cloud-init, `rules`: the source ranges)"},
	{hc.ErrorCodeJSONError, "permanent", "`json_error`"},
	{hc.ErrorCodeUnauthorized, "permanent", "`unauthorized` (401: the token is unknown or revoked); the message names `hcloud.tokenFile`. From Delete it is ErrTransient, so that a refused token never lets a Proxy go while its server runs"},
	{hc.ErrorCodeForbidden, "permanent", "`forbidden` (403: a read-only token); the message names `hcloud.tokenFile`; ErrTransient from Delete, as `unauthorized`"},
	{hc.ErrorCodeProtected, "permanent", "`protected` (someone turned on the server's delete protection)"},
	{hc.ErrorCodeResourceLocked, "permanent", "`resource_locked` (Hetzner locked the resource; only support can unlock it)"},
	{hc.ErrorCodeInvalidServerType, "permanent", "`invalid_server_type`"},
	{hc.ErrorUnsupportedError, "permanent", "`unsupported_error`"},
	{hc.ErrorDeprecatedAPIEndpoint, "permanent", "`deprecated_api_endpoint`"},
	{hc.ErrorCodeNotFound, "notfound", "`not_found` (404): Get and Reboot say ErrNotFound, Delete success; on a create it is ErrPermanent (a resource the request names does not exist), and as a failed action's code ErrTransient (what the action worked on vanished)"},
	{hc.ErrorCodeLocked, "transient", "`locked` (423: another action is running on the resource)"},
	{hc.ErrorCodeConflict, "transient", "`conflict` (409: the resource changed during the request)"},
	{hc.ErrorCodeResourceInUse, "transient", "`resource_in_use` (a firewall still applied to the server being deleted)"},
	{hc.ErrorCodeServerNotStopped, "transient", "`server_not_stopped`"},
	{hc.ErrorCodeMaintenance, "transient", "`maintenance`"},
	{hc.ErrorCodeServiceError, "transient", "`service_error`"},
	{hc.ErrorCodeServerError, "transient", "`server_error` (500)"},
	{hc.ErrorCodeUnknownError, "transient", "`unknown_error`"},
	{hc.ErrorCodeBadGateway, "transient", "`bad_gateway` (502)"},
	{hc.ErrorCodeTimeout, "transient", "`timeout` (504)"},
	{hc.ErrorCodeRobotUnavailable, "transient", "`robot_unavailable`"},
}

// classOf is the class name of code, "" when it is not in Mappings.
func classOf(code string) string {
	for _, m := range Mappings {
		if string(m.Code) == code {
			return m.Class
		}
	}
	return ""
}

// retryAfterError is a rate-limited call: the error and when the limit resets.
type retryAfterError struct {
	err   error
	reset time.Time
}

func (e *retryAfterError) Error() string { return e.err.Error() }
func (e *retryAfterError) Unwrap() error { return e.err }

// RetryAfter is the wait until the limit resets, which provider.RetryAfter reads.
func (e *retryAfterError) RetryAfter() time.Duration { return time.Until(e.reset) }

// RetryAfter returns how long to wait before the API takes calls again, when err is a
// rate-limited call whose answer carried RateLimit-Reset.
func RetryAfter(err error) (time.Duration, bool) {
	var ra *retryAfterError
	if !errors.As(err, &ra) || ra.reset.IsZero() {
		return 0, false
	}
	return max(time.Until(ra.reset), 0), true
}

// classify gives a failed call's error its class; what names the call and its object.
func (p *Provider) classify(err error, what string) error {
	if err == nil {
		return nil
	}
	var ae hc.Error
	var acte hc.ActionError
	switch {
	case errors.As(err, &acte):
		wrapped := fmt.Errorf("%s: action %s failed: %w", what, actionName(acte), err)
		return p.byCode(acte.Code, 0, wrapped, nil)
	case errors.As(err, &ae):
		status := 0
		if r := ae.Response(); r != nil && r.Response != nil {
			status = r.StatusCode
		}
		wrapped := fmt.Errorf("%s: %w%s", what, err, fieldsOf(ae))
		return p.byCode(string(ae.Code), status, wrapped, ae.Response())
	case errors.Is(err, hc.ErrStatusCode):
		// An answer without an error body: its status decides.
		var status int
		_, _ = fmt.Sscanf(err.Error()[strings.LastIndex(err.Error(), " ")+1:], "%d", &status)
		wrapped := fmt.Errorf("%s: %w", what, err)
		if status >= 500 || status == http.StatusTooManyRequests || status == 0 {
			return provider.Transient(wrapped)
		}
		return provider.Permanent(wrapped)
	}
	return provider.Transient(fmt.Errorf("%s: %w", what, err))
}

// byCode classes an error of code (status 0 for a failed action) by Mappings.
func (p *Provider) byCode(code string, status int, wrapped error, resp *hc.Response) error {
	switch classOf(code) {
	case "transient":
		if code == string(hc.ErrorCodeRateLimitExceeded) {
			return provider.Transient(p.rateLimited(wrapped, resp))
		}
		if code == string(hc.ErrorCodeResourceInUse) {
			return provider.Transient(&markedError{mark: errInUse, err: wrapped})
		}
		return provider.Transient(wrapped)
	case "quota":
		return provider.QuotaExceeded(wrapped)
	case "adopt":
		return provider.Permanent(&markedError{mark: errAlreadyExists, err: wrapped})
	case "notfound":
		return provider.NotFound(wrapped)
	case "permanent":
		if code == string(hc.ErrorCodeUnauthorized) || code == string(hc.ErrorCodeForbidden) {
			return provider.Permanent(&markedError{mark: errCredentials, err: fmt.Errorf(
				"%w; the API refuses the token in hcloud.tokenFile %s: it needs a valid token with Read & Write permission", wrapped, p.cfg.TokenFile)})
		}
		return provider.Permanent(wrapped)
	}
	if status >= 500 || status == http.StatusTooManyRequests {
		return provider.Transient(wrapped)
	}
	return provider.Permanent(wrapped)
}

// rateLimited adds when the limit resets to a rate-limited call's error.
func (p *Provider) rateLimited(err error, resp *hc.Response) error {
	if resp == nil || resp.Meta.Ratelimit.Reset.IsZero() {
		return fmt.Errorf("%w; the API allows 3600 requests an hour per project", err)
	}
	reset := resp.Meta.Ratelimit.Reset
	return &retryAfterError{
		err: fmt.Errorf("%w; the API allows %d requests an hour per project, the limit resets at %s (in %s)",
			err, resp.Meta.Ratelimit.Limit, reset.UTC().Format(time.RFC3339), max(time.Until(reset), 0).Round(time.Second)),
		reset: reset,
	}
}

// apiFields maps the fields an invalid_input answer names to what the user set.
var apiFields = map[string]string{
	"server_type": "placement.machineType (hcloud.serverTypes)",
	"location":    "placement.zone (hcloud.locations)",
	"image":       "placement.image (hcloud.images)",
	"user_data":   "the cloud-init user-data",
	"name":        "the instance name",
	"labels":      "the labels",
	"rules":       "the firewall's source ranges (spec.proxy.allowedSourceRanges or hcloud.firewall.sourceRanges)",
	"source_ips":  "the firewall's source ranges (spec.proxy.allowedSourceRanges or hcloud.firewall.sourceRanges)",
}

// fieldsOf names the fields of an invalid_input answer and what each stands for.
func fieldsOf(ae hc.Error) string {
	d, ok := ae.Details.(hc.ErrorDetailsInvalidInput)
	if !ok || len(d.Fields) == 0 {
		return ""
	}
	var parts []string
	for _, f := range d.Fields {
		name := f.Name
		if mean, ok := apiFields[strings.Split(name, ".")[0]]; ok {
			name += " (" + mean + ")"
		}
		parts = append(parts, fmt.Sprintf("field %s: %s", name, strings.Join(f.Messages, "; ")))
	}
	return "; " + strings.Join(parts, "; ")
}

// actionName names a failed action: its command and ID.
func actionName(e hc.ActionError) string {
	if a := e.Action(); a != nil {
		return fmt.Sprintf("%s %d", a.Command, a.ID)
	}
	return "(unknown)"
}

// markedError carries a marker next to an error, showing only the error.
type markedError struct {
	mark error
	err  error
}

func (e *markedError) Error() string   { return e.err.Error() }
func (e *markedError) Unwrap() []error { return []error{e.err, e.mark} }

// isNotFound says whether err is a not_found answer.
func isNotFound(err error) bool { return hc.IsError(err, hc.ErrorCodeNotFound) }

// notNotFound keeps ErrNotFound out of Create and Delete: what vanished under them a
// retry mends.
func notNotFound(err error) error {
	if errors.Is(err, provider.ErrNotFound) {
		return provider.Transient(errors.New(err.Error()))
	}
	return err
}

// credentialsRetried turns the ErrPermanent of a refused token into ErrTransient, for
// Delete: a permanent Delete lets the Proxy go, and a token is mended by rotating the
// Secret, which the next call reads.
func credentialsRetried(err error) error {
	if errors.Is(err, errCredentials) {
		return provider.Transient(errors.New(err.Error()))
	}
	return err
}

// referenceMissing turns the ErrNotFound of a create into ErrPermanent: a 404 there is a
// resource the request names that does not exist, which no retry mends.
func referenceMissing(err error) error {
	if errors.Is(err, provider.ErrNotFound) {
		return provider.Permanent(errors.New(err.Error()))
	}
	return err
}
