package otlp

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

// exported is what a fake collector saw: span names and the service.name of each batch.
type exported struct {
	span, service string
}

func collect(req *coltracepb.ExportTraceServiceRequest, out chan<- exported) {
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				out <- exported{span: s.GetName(), service: service}
			}
		}
	}
}

type grpcCollector struct {
	coltracepb.UnimplementedTraceServiceServer
	got chan exported
}

func (c *grpcCollector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	collect(req, c.got)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// startGRPC serves a fake OTLP/gRPC collector on loopback and returns its endpoint.
func startGRPC(t *testing.T, got chan exported) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, &grpcCollector{got: got})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return "http://" + lis.Addr().String()
}

// startHTTP serves a fake OTLP/HTTP collector on loopback and returns its endpoint.
func startHTTP(t *testing.T, got chan exported) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		req := &coltracepb.ExportTraceServiceRequest{}
		if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, req) != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		collect(req, got)
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// keepGlobals restores the global tracer provider and propagator after the test.
func keepGlobals(t *testing.T) {
	tp, prop := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() {
		otel.SetTracerProvider(tp)
		otel.SetTextMapPropagator(prop)
	})
}

func clearEnv(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
		"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_SDK_DISABLED", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER"} {
		t.Setenv(k, "")
	}
}

func TestSetupExportsOverOTLP(t *testing.T) {
	cases := []struct {
		name    string
		env     map[string]string
		start   func(*testing.T, chan exported) string
		service string
	}{
		{"http by default", map[string]string{}, startHTTP, ServiceName},
		{"http/protobuf via the traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, startHTTP, ServiceName},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "op-test"}, startGRPC, "op-test"},
		{"grpc via the traces protocol", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, startGRPC, ServiceName},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			keepGlobals(t)
			clearEnv(t)
			got := make(chan exported, 16)
			endpoint := tc.start(t, got)
			if strings.Contains(tc.name, "traces endpoint") {
				t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint+"/v1/traces")
			} else {
				t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			shutdown, err := Setup(ctx)
			if err != nil {
				t.Fatalf("Setup: %v", err)
			}
			_, span := otel.Tracer("test").Start(ctx, "probe-span")
			if !span.SpanContext().IsValid() {
				t.Fatal("Setup with an endpoint installed a tracer provider that records nothing")
			}
			span.End()
			if err := shutdown(ctx); err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			select {
			case e := <-got:
				if e.span != "probe-span" || e.service != tc.service {
					t.Fatalf("collector got span %q of service %q, want probe-span of %q", e.span, e.service, tc.service)
				}
			case <-ctx.Done():
				t.Fatal("the collector received no span before the deadline")
			}
		})
	}
}

func TestSetupWithoutEndpointIsNoop(t *testing.T) {
	for _, disabled := range []bool{false, true} {
		keepGlobals(t)
		clearEnv(t)
		if disabled {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
			t.Setenv("OTEL_SDK_DISABLED", "true")
		}
		shutdown, err := Setup(t.Context())
		if err != nil {
			t.Fatalf("Setup: %v", err)
		}
		_, span := otel.Tracer("test").Start(t.Context(), "x")
		if span.SpanContext().IsValid() || span.IsRecording() {
			t.Fatalf("disabled=%v: spans are recorded without an endpoint", disabled)
		}
		span.End()
		if err := shutdown(t.Context()); err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		if fields := otel.GetTextMapPropagator().Fields(); !strings.Contains(strings.Join(fields, ","), "traceparent") {
			t.Fatalf("propagator fields %v lack traceparent", fields)
		}
	}
}

func TestSetupRejectsUnknownProtocol(t *testing.T) {
	keepGlobals(t)
	clearEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, err := Setup(t.Context()); err == nil || !strings.Contains(err.Error(), `"http/json"`) {
		t.Fatalf("Setup = %v, want an error naming the protocol", err)
	}
}

func TestSetupPropagatesW3C(t *testing.T) {
	keepGlobals(t)
	clearEnv(t)
	if _, err := Setup(t.Context()); err != nil {
		t.Fatal(err)
	}
	carrier := propagation.MapCarrier{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	ctx := otel.GetTextMapPropagator().Extract(t.Context(), carrier)
	var line string
	l := funcr.New(func(prefix, args string) { line = args }, funcr.Options{})
	tracing.Logger(ctx, l).Info("x")
	if !strings.Contains(line, `"traceID"="4bf92f3577b34da6a3ce929d0e0e4736"`) || !strings.Contains(line, `"spanID"="00f067aa0ba902b7"`) {
		t.Fatalf("log line %s lacks the extracted trace and span IDs", line)
	}
}
