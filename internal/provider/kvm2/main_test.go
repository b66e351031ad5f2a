package kvm2

import (
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
)

// testSpans records every span the package's tests end. Tests tell theirs apart by a
// host name of their own.
var testSpans = tracetest.NewSpanRecorder()

func TestMain(m *testing.M) {
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(testSpans)))
	// Every connection, keepalive, dial and abandoned call must be gone when the tests
	// are: a goroutine left behind here is one the manager would leak per reconnect.
	goleak.VerifyTestMain(m)
}
