// Package otlp installs the process-wide OpenTelemetry tracer provider, exporting over
// OTLP when the standard environment variables ask for it. (Putting the trace and span
// IDs on log lines is package tracing's, which providers import without this one's
// exporters.)
package otlp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// ServiceName is the service.name of the operator's spans unless OTEL_SERVICE_NAME says
// otherwise.
const ServiceName = "egress-proxies-operator"

// Enabled reports whether the standard OTLP variables ask for an exporter: an endpoint is
// set (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) and the SDK is
// not disabled (OTEL_SDK_DISABLED=true).
func Enabled() bool {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// protocol returns the OTLP protocol the environment asks for; http/protobuf is the
// standard default.
func protocol() string {
	if p := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"); p != "" {
		return p
	}
	if p := os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" {
		return p
	}
	return "http/protobuf"
}

// Setup installs the global tracer provider and the W3C trace-context and baggage
// propagator. With an OTLP endpoint in the environment it exports spans over OTLP (gRPC
// or HTTP, per OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL; the exporter reads the other
// OTEL_EXPORTER_OTLP_* variables itself); otherwise spans are not recorded at all. The
// returned shutdown flushes and stops the exporter.
func Setup(ctx context.Context) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if !Enabled() {
		otel.SetTracerProvider(noop.NewTracerProvider())
		return func(context.Context) error { return nil }, nil
	}
	otel.SetLogger(log.FromContext(ctx).WithName("otel"))

	var exp sdktrace.SpanExporter
	switch p := protocol(); p {
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	case "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	default:
		return nil, fmt.Errorf("otlp protocol %q is not supported (use grpc or http/protobuf)", p)
	}
	if err != nil {
		return nil, fmt.Errorf("create otlp trace exporter: %w", err)
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (read last) win over the built-in name.
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", ServiceName)), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("build trace resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}
