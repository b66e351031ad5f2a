package hcloud

import (
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

// callTracer opens the hcloud.<method> <route> spans, one per HTTP request to the API.
var callTracer = otel.Tracer("gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud")

// idSegment is a path segment that is a resource ID.
var idSegment = regexp.MustCompile(`/[0-9]+(/|$)`)

// route is the API route of a request path: /v1/servers/42/actions/reset is
// /servers/{id}/actions/reset.
func route(path string) string {
	if i := strings.Index(path, "/v1/"); i >= 0 {
		path = path[i+len("/v1"):]
	}
	for idSegment.MatchString(path) {
		path = idSegment.ReplaceAllString(path, "/{id}$1")
	}
	return path
}

// callLog is the transport of the API clients: every request gets a client span
// hcloud.<METHOD> <route> (under the operation span provider.<op>) and, when it ends, one
// V(1) line "hcloud call" with the method, the route, the query, the HTTP status and the
// duration. Neither carries a header (so never the token) nor a body (so never the
// user-data).
type callLog struct {
	base http.RoundTripper
	log  logr.Logger
}

func (c *callLog) RoundTrip(req *http.Request) (*http.Response, error) {
	r := route(req.URL.Path)
	ctx, span := callTracer.Start(req.Context(), "hcloud."+req.Method+" "+r, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("http.request.method", req.Method), attribute.String("hcloud.route", r)))
	defer span.End()
	start := time.Now()
	resp, err := c.base.RoundTrip(req.WithContext(ctx))
	kv := []any{"method", req.Method, "route", r, "duration", time.Since(start)}
	if q := req.URL.RawQuery; q != "" {
		kv = append(kv, "query", q)
	}
	switch {
	case err != nil:
		kv = append(kv, "error", err.Error())
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	default:
		kv = append(kv, "status", resp.StatusCode)
		span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
		if resp.StatusCode >= 400 {
			span.SetStatus(codes.Error, resp.Status)
		}
	}
	tracing.Logger(ctx, c.log).V(1).Info("hcloud call", kv...)
	return resp, err
}

// CloseIdleConnections closes the idle connections of the transport under it.
func (c *callLog) CloseIdleConnections() {
	if ci, ok := c.base.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}
