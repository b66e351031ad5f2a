package hcloudfake

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
)

// TestInjectedErrorShapes: every code injected on a route reaches the client as a
// hcloud.Error that hcloud.IsError recognises, with the real API's status; invalid_input
// carries its fields. The client here does not retry, so retried codes show too.
func TestInjectedErrorShapes(t *testing.T) {
	for _, tc := range []struct {
		code   hcloud.ErrorCode
		status int
	}{
		{hcloud.ErrorCodeRateLimitExceeded, 429},
		{hcloud.ErrorCodeResourceUnavailable, 412},
		{hcloud.ErrorCodeUniquenessError, 409},
		{hcloud.ErrorCodeInvalidInput, 400},
		{hcloud.ErrorCodePlacementError, 412},
		{hcloud.ErrorCodeLocked, 423},
		{hcloud.ErrorCodeConflict, 409},
		{hcloud.ErrorCodeNotFound, 404},
		{hcloud.ErrorCodeForbidden, 403},
		{hcloud.ErrorCodeUnauthorized, 401},
		{hcloud.ErrorCodeServerError, 500},
		{hcloud.ErrorCodeServiceError, 503},
		{hcloud.ErrorCodeResourceLimitExceeded, 403},
		{hcloud.ErrorCodeTimeout, 504},
		{hcloud.ErrorCodeMaintenance, 503},
		{hcloud.ErrorCodeJSONError, 400},
		{hcloud.ErrorCodeProtected, 403},
		{hcloud.ErrorCodeBadGateway, 502},
		{hcloud.ErrorCodeFirewallAlreadyApplied, 422},
	} {
		t.Run(string(tc.code), func(t *testing.T) {
			s, c := fake(t, hcloud.WithRetryOpts(hcloud.RetryOpts{MaxRetries: 0}))
			f := Failure{Code: string(tc.code), Message: "injected " + string(tc.code)}
			if tc.code == hcloud.ErrorCodeInvalidInput {
				f.Fields = map[string][]string{"name": {"is bad"}}
			}
			s.Fail(ServersCreate, f)
			_, err := create(t, c, "p", nil)
			if !hcloud.IsError(err, tc.code) {
				t.Fatalf("got %v", err)
			}
			he := apiErr(t, err)
			if he.Response().StatusCode != tc.status || StatusOf(string(tc.code)) != tc.status || he.Message != "injected "+string(tc.code) {
				t.Errorf("status %d (StatusOf %d), message %q; want %d", he.Response().StatusCode, StatusOf(string(tc.code)), he.Message, tc.status)
			}
			if tc.code == hcloud.ErrorCodeInvalidInput {
				if got := fieldsOf(t, err); got["name"][0] != "is bad" {
					t.Errorf("fields %v", got)
				}
			}
			if len(s.Servers()) != 0 {
				t.Error("a failed create made a server")
			}
			// One call only: the next goes through.
			if _, err := create(t, c, "p", nil); err != nil {
				t.Errorf("after the failure: %v", err)
			}
		})
	}
}

// TestStatusOverrideAndQueue: Failure.Status overrides the status; failures queue in
// order, a zero Failure letting its call through.
func TestStatusOverrideAndQueue(t *testing.T) {
	s, c := fake(t, hcloud.WithRetryOpts(hcloud.RetryOpts{MaxRetries: 0}))
	s.Fail(LocationsList, Failure{})
	s.Fail(LocationsList, Failure{Code: "service_error", Status: 502})
	if _, err := c.Location.All(t.Context()); err != nil {
		t.Fatalf("first call: %v", err)
	}
	_, err := c.Location.All(t.Context())
	if !hcloud.IsError(err, hcloud.ErrorCodeServiceError) || apiErr(t, err).Response().StatusCode != 502 {
		t.Fatalf("second call: %v", err)
	}
	if _, err := c.Location.All(t.Context()); err != nil {
		t.Fatalf("third call: %v", err)
	}
}

// TestRateLimit: every answer carries RateLimit-Limit, -Remaining and -Reset; an empty
// budget is 429 rate_limit_exceeded with the reset in the future; an injected 429 is
// retried by the client after its backoff and then succeeds.
func TestRateLimit(t *testing.T) {
	s, c := fake(t, hcloud.WithRetryOpts(hcloud.RetryOpts{MaxRetries: 0}))
	_, resp, err := c.Location.List(t.Context(), hcloud.LocationListOpts{})
	if err != nil || resp.Meta.Ratelimit.Limit != 3600 || resp.Meta.Ratelimit.Remaining != 3599 || time.Since(resp.Meta.Ratelimit.Reset) > time.Minute {
		t.Fatalf("rate limit %+v, %v", resp.Meta.Ratelimit, err)
	}
	s.SetRateLimit(2, 0)
	for i := range 2 {
		if _, _, err := c.Location.List(t.Context(), hcloud.LocationListOpts{}); err != nil {
			t.Fatalf("call %d within the limit: %v", i, err)
		}
	}
	_, resp, err = c.Location.List(t.Context(), hcloud.LocationListOpts{})
	if !hcloud.IsError(err, hcloud.ErrorCodeRateLimitExceeded) || resp.StatusCode != 429 || resp.Meta.Ratelimit.Remaining != 0 || !resp.Meta.Ratelimit.Reset.After(time.Now()) {
		t.Fatalf("beyond the limit: %v, %+v", err, resp.Meta.Ratelimit)
	}

	s2, retrying := fake(t)
	s2.Fail(ServersList, Failure{Code: "rate_limit_exceeded", ResetAfter: time.Minute})
	if _, err := retrying.Server.All(t.Context()); err != nil {
		t.Fatalf("retried list: %v", err)
	}
	calls := s2.Calls()
	if len(calls) != 2 || calls[0].Status != 429 || calls[1].Status != 200 {
		t.Errorf("calls %+v", calls)
	}
}

// TestRateLimitRefills: with a refill period one request comes back each period, and
// RateLimit-Reset says when; the fake's clock is stepped by the test.
func TestRateLimitRefills(t *testing.T) {
	s, c := fake(t, hcloud.WithRetryOpts(hcloud.RetryOpts{MaxRetries: 0}))
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	s.mu.Lock()
	s.clock = func() time.Time { return time.Unix(0, now.Load()) }
	s.mu.Unlock()
	s.SetRateLimit(2, 10*time.Second)
	for i := range 2 {
		if _, _, err := c.Location.List(t.Context(), hcloud.LocationListOpts{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	_, resp, err := c.Location.List(t.Context(), hcloud.LocationListOpts{})
	if !hcloud.IsError(err, hcloud.ErrorCodeRateLimitExceeded) || resp.Meta.Ratelimit.Reset.Unix() != time.Unix(0, now.Load()).Add(10*time.Second).Unix() {
		t.Fatalf("empty budget: %v, reset %v", err, resp.Meta.Ratelimit.Reset)
	}
	now.Add(int64(10 * time.Second))
	_, resp, err = c.Location.List(t.Context(), hcloud.LocationListOpts{})
	if err != nil || resp.Meta.Ratelimit.Remaining != 0 {
		t.Fatalf("after one refill: %v, %+v", err, resp.Meta.Ratelimit)
	}
	if _, _, err := c.Location.List(t.Context(), hcloud.LocationListOpts{}); !hcloud.IsError(err, hcloud.ErrorCodeRateLimitExceeded) {
		t.Fatalf("one refill is one request: %v", err)
	}
	now.Add(int64(time.Hour))
	_, resp, err = c.Location.List(t.Context(), hcloud.LocationListOpts{})
	if err != nil || resp.Meta.Ratelimit.Remaining != 1 {
		t.Fatalf("after an hour (full budget of 2, one used): %v, %+v", err, resp.Meta.Ratelimit)
	}
}

// TestTokens: an unknown token is 401 unauthorized on every route; a read-only token
// reads but its writes are 403 forbidden; the Authorization header is recorded.
func TestTokens(t *testing.T) {
	s, c := fake(t)
	bad := client(s, "wrong-token")
	if _, err := bad.Location.All(t.Context()); !hcloud.IsError(err, hcloud.ErrorCodeUnauthorized) || apiErr(t, err).Response().StatusCode != 401 {
		t.Fatalf("wrong token: %v", err)
	}
	if _, err := create(t, bad, "p", nil); !hcloud.IsError(err, hcloud.ErrorCodeUnauthorized) {
		t.Fatalf("wrong token, create: %v", err)
	}
	s.SetTokens(map[string]bool{Token: true, "read-only": false})
	ro := client(s, "read-only")
	if _, err := ro.Server.All(t.Context()); err != nil {
		t.Fatalf("read-only read: %v", err)
	}
	if _, err := create(t, ro, "p", nil); !hcloud.IsError(err, hcloud.ErrorCodeForbidden) {
		t.Fatalf("read-only write: %v", err)
	}
	if _, err := create(t, c, "p", nil); err != nil {
		t.Fatal(err)
	}
	calls := s.Calls()
	last := calls[len(calls)-1]
	if last.Route != ServersCreate || last.Authorization != "Bearer "+Token || !strings.Contains(last.Body, `"user_data":"#cloud-config\n"`) || last.Status != 201 {
		t.Errorf("last call %+v", last)
	}
	if s.CallCount(ServersCreate) != 3 || s.CallCount(LocationsList) != 1 {
		t.Errorf("counts: create %d, locations %d", s.CallCount(ServersCreate), s.CallCount(LocationsList))
	}
}

// TestLatency: SetLatency delays each answer (the call takes at least that long) and a
// caller's deadline shorter than it fails the call.
func TestLatency(t *testing.T) {
	s, c := fake(t, hcloud.WithRetryOpts(hcloud.RetryOpts{MaxRetries: 0}))
	s.SetLatency(100 * time.Millisecond)
	start := time.Now()
	if _, err := c.Location.All(t.Context()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("answered in %v", d)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	if _, err := c.Location.All(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("short deadline: %v", err)
	}
}

// TestUnservedRouteAndBadBodies: a route the fake does not serve is 404 not_found; a
// body that is not JSON is json_error; GET /actions without id is invalid_input.
func TestUnservedRouteAndBadBodies(t *testing.T) {
	_, c := fake(t, hcloud.WithRetryOpts(hcloud.RetryOpts{MaxRetries: 0}))
	if _, err := c.Volume.All(t.Context()); !hcloud.IsError(err, hcloud.ErrorCodeNotFound) {
		t.Errorf("volumes: %v", err)
	}
	req, _ := c.NewRequest(t.Context(), http.MethodPost, "/servers", strings.NewReader("{not json"))
	if _, err := c.Do(req, nil); !hcloud.IsError(err, hcloud.ErrorCodeJSONError) {
		t.Errorf("bad JSON: %v", err)
	}
	//lint:ignore SA1019 listing actions without ids is what is tested
	if _, err := c.Action.All(t.Context()); !hcloud.IsError(err, hcloud.ErrorCodeInvalidInput) {
		t.Errorf("all actions: %v", err)
	}
	if a, _, err := c.Action.GetByID(t.Context(), 12345); a != nil || err != nil {
		t.Errorf("unknown action: %v, %v", a, err)
	}
	//lint:ignore SA1019 the removed endpoint is what is tested
	_, err := c.Datacenter.All(t.Context())
	if !hcloud.IsError(err, hcloud.ErrorDeprecatedAPIEndpoint) || apiErr(t, err).Response().StatusCode != 410 {
		t.Errorf("datacenters: %v", err)
	}
	if d, ok := apiErr(t, err).Details.(hcloud.ErrorDetailsDeprecatedAPIEndpoint); !ok || d.Announcement == "" {
		t.Errorf("datacenters details: %#v", apiErr(t, err).Details)
	}
}

// TestFailOnAnUnservedRoutePanics: a mistyped route is a test bug, not a silent no-op.
func TestFailOnAnUnservedRoutePanics(t *testing.T) {
	s, _ := fake(t)
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "GET /server") {
			t.Errorf("recovered %v", r)
		}
	}()
	s.Fail("GET /server", Failure{Code: "server_error"})
}
