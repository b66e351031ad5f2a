package provider

import (
	"context"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

// TracerName is the instrumentation scope of the operation spans.
const TracerName = "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"

// Span attribute keys of the operation spans.
const (
	AttrProvider     = attribute.Key("provider.name")
	AttrType         = attribute.Key("provider.type")
	AttrInstance     = attribute.Key("provider.instance")
	AttrProviderID   = attribute.Key("provider.id")
	AttrErrorClass   = attribute.Key("provider.error_class")
	AttrInstanceSeen = attribute.Key("provider.instances")
)

// Operation names, used in span names (provider.<op>), log lines and metric labels.
const (
	OpCreate = "create"
	OpGet    = "get"
	OpDelete = "delete"
	OpList   = "list"
	OpReboot = "reboot"
)

var (
	operationsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_provider_operations_total",
		Help: "Provider operations by provider, operation and error class (none on success).",
	}, []string{"provider", "op", "class"})
	operationDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "proxy_operator_provider_operation_duration_seconds",
		Help: "Duration of provider operations; a create includes any image download.",
		// From a cached Get to a Create that fetches a large image.
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200},
	}, []string{"provider", "op"})
)

// Collectors are the operation metrics Observe records, for the manager to register on
// the registry it serves at /metrics (controller-runtime's). The package registers
// nothing itself, so that it does not import controller-runtime's metrics and, with
// them, client-go.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{operationsTotal, operationDuration}
}

// observed decorates a Provider with operation spans, outcome log lines and metrics.
type observed struct {
	name, typ string
	p         Provider
}

var _ Provider = (*observed)(nil)

// Observe wraps p so that Create, Get, Delete, ListByTag and Reboot each open a span
// (provider.create, provider.get, provider.delete, provider.list, provider.reboot) that
// the provider's own spans become children of, write one V(1) outcome line to the context's logger, and
// count into proxy_operator_provider_operations_total{provider,op,class} and
// proxy_operator_provider_operation_duration_seconds{provider,op}. Check is passed
// through: its caller opens its own span.
func Observe(name, typ string, p Provider) Provider {
	return &observed{name: name, typ: typ, p: p}
}

// Unwrap returns the decorated provider.
func (o *observed) Unwrap() Provider { return o.p }

// Close closes the decorated provider when it holds resources (io.Closer).
func (o *observed) Close() error {
	if c, ok := o.p.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// start opens the operation span for op.
func (o *observed) start(ctx context.Context, op string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	attrs = append([]attribute.KeyValue{AttrProvider.String(o.name), AttrType.String(o.typ)}, attrs...)
	return otel.Tracer(TracerName).Start(ctx, "provider."+op,
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
}

// finish records the outcome of op on the span, the log and the metrics, and ends the span.
func (o *observed) finish(ctx context.Context, span trace.Span, op string, began time.Time, err error, kv ...any) {
	d := time.Since(began)
	class := ClassName(err)
	span.SetAttributes(AttrErrorClass.String(class))
	// A pending result is not a failure: the span keeps an unset status.
	if err != nil && class != "pending" {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	operationsTotal.WithLabelValues(o.name, op, class).Inc()
	operationDuration.WithLabelValues(o.name, op).Observe(d.Seconds())

	l := tracing.Logger(ctx, log.FromContext(ctx)).V(1)
	if l.Enabled() {
		kv = append([]any{"provider", o.name, "type", o.typ, "op", op, "class", class, "duration", d}, kv...)
		if err != nil {
			kv = append(kv, "error", err.Error())
		}
		l.Info("provider operation finished", kv...)
	}
	span.End()
}

func (o *observed) Create(ctx context.Context, req CreateRequest) (Instance, error) {
	ctx, span := o.start(ctx, OpCreate, AttrInstance.String(req.Name))
	began := time.Now()
	inst, err := o.p.Create(ctx, req)
	if err == nil {
		span.SetAttributes(AttrProviderID.String(inst.ProviderID))
	}
	o.finish(ctx, span, OpCreate, began, err, "name", req.Name, "providerID", inst.ProviderID)
	return inst, err
}

func (o *observed) Get(ctx context.Context, providerID string) (Instance, error) {
	ctx, span := o.start(ctx, OpGet, AttrProviderID.String(providerID))
	began := time.Now()
	inst, err := o.p.Get(ctx, providerID)
	o.finish(ctx, span, OpGet, began, err, "providerID", providerID, "state", inst.State)
	return inst, err
}

func (o *observed) Delete(ctx context.Context, providerID string) error {
	ctx, span := o.start(ctx, OpDelete, AttrProviderID.String(providerID))
	began := time.Now()
	err := o.p.Delete(ctx, providerID)
	o.finish(ctx, span, OpDelete, began, err, "providerID", providerID)
	return err
}

func (o *observed) ListByTag(ctx context.Context) ([]Instance, error) {
	ctx, span := o.start(ctx, OpList)
	began := time.Now()
	list, err := o.p.ListByTag(ctx)
	span.SetAttributes(AttrInstanceSeen.Int(len(list)))
	o.finish(ctx, span, OpList, began, err, "instances", len(list))
	return list, err
}

// Reboot restarts the instance through the decorated provider's Rebooter, observed like
// the other calls (span provider.reboot, op reboot). RebooterOf hands out this method only
// when the decorated provider can reboot; called on one that cannot, it is ErrPermanent.
func (o *observed) Reboot(ctx context.Context, providerID string) error {
	ctx, span := o.start(ctx, OpReboot, AttrProviderID.String(providerID))
	began := time.Now()
	var err error
	if r, ok := RebooterOf(o.p); ok {
		err = r.Reboot(ctx, providerID)
	} else {
		err = Errorf(ErrPermanent, "provider %s of type %s cannot reboot instances (%s)", o.name, o.typ, providerID)
	}
	o.finish(ctx, span, OpReboot, began, err, "providerID", providerID)
	return err
}

// Check is passed through unobserved; the health monitor traces and records it.
func (o *observed) Check(ctx context.Context) []TargetStatus { return o.p.Check(ctx) }
