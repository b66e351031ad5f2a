package tracing

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestLogger(t *testing.T) {
	var lines []string
	l := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	Logger(t.Context(), l).Info("no span")
	ctx, span := tp.Tracer("test").Start(t.Context(), "op")
	defer span.End()
	Logger(ctx, l).Info("in span")

	if strings.Contains(lines[0], "traceID") || strings.Contains(lines[0], "spanID") {
		t.Fatalf("line outside a span carries IDs: %s", lines[0])
	}
	sc := span.SpanContext()
	want := `"traceID"="` + sc.TraceID().String() + `" "spanID"="` + sc.SpanID().String() + `"`
	if !strings.Contains(lines[1], want) {
		t.Fatalf("line in a span %s lacks %s", lines[1], want)
	}
	if got := Logger(t.Context(), logr.Discard()); got != logr.Discard() {
		t.Fatal("Logger changed a logger without a span")
	}
}
