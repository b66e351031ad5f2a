// Package tracing puts the current trace and span IDs on log lines. It imports only the
// OpenTelemetry API, so that every package that logs can use it cheaply; the tracer
// provider and its exporters are installed by internal/tracing/otlp.
package tracing

import (
	"context"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"
)

// Logger returns l with traceID and spanID when ctx carries a valid span, and l itself
// otherwise.
func Logger(ctx context.Context, l logr.Logger) logr.Logger {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return l
	}
	return l.WithValues("traceID", sc.TraceID().String(), "spanID", sc.SpanID().String())
}
