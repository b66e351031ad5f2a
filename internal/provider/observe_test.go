package provider_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// recordSpans installs a tracer provider that keeps every ended span in memory.
func recordSpans(t *testing.T) (*tracetest.InMemoryExporter, *sdktrace.TracerProvider) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev); _ = tp.Shutdown(context.Background()) })
	return exp, tp
}

// logLines returns a context whose controller-runtime logger captures lines at verbosity v.
func logLines(ctx context.Context, v int) (context.Context, func() []string) {
	var mu sync.Mutex
	var lines []string
	l := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{Verbosity: v})
	return log.IntoContext(ctx, l), func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), lines...)
	}
}

// registry holds provider.Collectors, as the manager's /metrics registry does.
var registry = func() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(provider.Collectors()...)
	return r
}()

// metricValue reads a sample of name with labels from registry: the counter value, or a
// histogram's sample count. It returns -1 when there is no such series.
func metricValue(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				if h := m.GetHistogram(); h != nil {
					return float64(h.GetSampleCount())
				}
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

func matches(m *dto.Metric, labels map[string]string) bool {
	if len(m.GetLabel()) != len(labels) {
		return false
	}
	for _, lp := range m.GetLabel() {
		if labels[lp.GetName()] != lp.GetValue() {
			return false
		}
	}
	return true
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

func spanNamed(t *testing.T, spans tracetest.SpanStubs, name string) tracetest.SpanStub {
	t.Helper()
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no span %q among %d spans", name, len(spans))
	return tracetest.SpanStub{}
}

func TestObserveSpans(t *testing.T) {
	exp, tp := recordSpans(t)
	fake := providertest.NewFake()
	fake.SetCreateHook(func(ctx context.Context, _ provider.CreateRequest) error {
		_, s := otel.Tracer("inner").Start(ctx, "inner.step")
		s.End()
		return nil
	})
	p := provider.Observe("obs-spans", "fake", fake)

	ctx, root := tp.Tracer("test").Start(t.Context(), "reconcile")
	inst, err := p.Create(ctx, provider.CreateRequest{Name: "proxy-1", UID: "u1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx, providertest.ProviderID("proxy-missing")); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("get of a missing instance through Observe: %v, want ErrNotFound kept", err)
	}
	root.End()

	spans := exp.GetSpans()
	create := spanNamed(t, spans, "provider.create")
	inner := spanNamed(t, spans, "inner.step")
	get := spanNamed(t, spans, "provider.get")
	if create.Parent.SpanID() != root.SpanContext().SpanID() || get.Parent.SpanID() != root.SpanContext().SpanID() {
		t.Fatal("operation spans are not children of the caller's span")
	}
	if inner.Parent.SpanID() != create.SpanContext.SpanID() {
		t.Fatal("the provider's own span is not a child of provider.create")
	}
	if create.SpanKind != trace.SpanKindInternal {
		t.Fatalf("provider.create kind %v, want internal", create.SpanKind)
	}
	ca := attrs(create.Snapshot())
	want := map[attribute.Key]string{
		provider.AttrProvider: "obs-spans", provider.AttrType: "fake", provider.AttrInstance: "proxy-1",
		provider.AttrProviderID: inst.ProviderID, provider.AttrErrorClass: "none",
	}
	for k, v := range want {
		if ca[k].AsString() != v {
			t.Errorf("provider.create %s = %q, want %q", k, ca[k].AsString(), v)
		}
	}
	if create.Status.Code != codes.Unset {
		t.Errorf("successful create has status %v", create.Status.Code)
	}
	ga := attrs(get.Snapshot())
	if ga[provider.AttrErrorClass].AsString() != "notfound" || ga[provider.AttrProviderID].AsString() != "fake/proxy-missing" {
		t.Errorf("provider.get attributes %v", ga)
	}
	if get.Status.Code != codes.Error {
		t.Errorf("failed get has status %v, want Error", get.Status.Code)
	}
}

func TestObserveSpanPerOperation(t *testing.T) {
	exp, _ := recordSpans(t)
	fake := providertest.NewFake()
	p := provider.Observe("obs-ops", "fake", fake)
	ctx := t.Context()
	inst, _ := p.Create(ctx, provider.CreateRequest{Name: "a", UID: "u"})
	_, _ = p.Get(ctx, inst.ProviderID)
	list, _ := p.ListByTag(ctx)
	fake.NextDeleteErr(provider.Transient(errors.New("host gone")))
	_ = p.Delete(ctx, inst.ProviderID)
	got := p.Check(ctx)

	var names []string
	for _, s := range exp.GetSpans() {
		names = append(names, s.Name)
	}
	if diff := cmp.Diff([]string{"provider.create", "provider.get", "provider.list", "provider.delete"}, names); diff != "" {
		t.Fatalf("spans, want one per operation and none for check (-want +got):\n%s", diff)
	}
	l := spanNamed(t, exp.GetSpans(), "provider.list")
	if n := attrs(l.Snapshot())[provider.AttrInstanceSeen].AsInt64(); n != int64(len(list)) || n != 1 {
		t.Errorf("provider.list instances = %d, want 1", n)
	}
	d := spanNamed(t, exp.GetSpans(), "provider.delete")
	if attrs(d.Snapshot())[provider.AttrErrorClass].AsString() != "transient" || d.Status.Code != codes.Error ||
		d.Status.Description != "host gone" {
		t.Errorf("provider.delete status %+v attrs %v", d.Status, attrs(d.Snapshot()))
	}
	if len(got) != 1 || got[0].Target != "fake" || fake.CountOf(providertest.OpCheck) != 1 {
		t.Errorf("check not passed through: %+v", got)
	}
}

func TestObserveMetrics(t *testing.T) {
	fake := providertest.NewFake()
	// The metrics are process-wide: a name of this run's own keeps a repeated run (-count)
	// from counting the earlier runs' operations.
	name := fmt.Sprintf("obs-metrics-%d", time.Now().UnixNano())
	p := provider.Observe(name, "fake", fake)
	ctx := t.Context()
	inst, _ := p.Create(ctx, provider.CreateRequest{Name: "a", UID: "u"})
	_, _ = p.Create(ctx, provider.CreateRequest{Name: "a", UID: "u"})
	fake.NextCreateErr(errors.New("no class"))
	_, _ = p.Create(ctx, provider.CreateRequest{Name: "a", UID: "u"})
	fake.NextCreateErr(provider.QuotaExceeded(errors.New("pool full")))
	_, _ = p.Create(ctx, provider.CreateRequest{Name: "b", UID: "u"})
	_ = p.Delete(ctx, inst.ProviderID)
	_, _ = p.Get(ctx, inst.ProviderID)
	fake.NextListErr(provider.Permanent(errors.New("auth")))
	_, _ = p.ListByTag(ctx)

	const total = "proxy_operator_provider_operations_total"
	cases := []struct {
		op, class string
		want      float64
	}{
		{"create", "none", 2}, {"create", "unclassified", 1}, {"create", "quota", 1},
		{"delete", "none", 1}, {"get", "notfound", 1}, {"list", "permanent", 1},
	}
	for _, c := range cases {
		got := metricValue(t, total, map[string]string{"provider": name, "op": c.op, "class": c.class})
		if got != c.want {
			t.Errorf("%s{op=%s,class=%s} = %v, want %v", total, c.op, c.class, got, c.want)
		}
	}
	const hist = "proxy_operator_provider_operation_duration_seconds"
	if got := metricValue(t, hist, map[string]string{"provider": name, "op": "create"}); got != 4 {
		t.Errorf("%s{op=create} count = %v, want 4", hist, got)
	}
	if got := metricValue(t, hist, map[string]string{"provider": name, "op": "list"}); got != 1 {
		t.Errorf("%s{op=list} count = %v, want 1", hist, got)
	}
}

func TestObserveLogLines(t *testing.T) {
	_, tp := recordSpans(t)
	fake := providertest.NewFake()
	p := provider.Observe("obs-logs", "fake", fake)

	ctx, lines := logLines(t.Context(), 1)
	ctx, root := tp.Tracer("test").Start(ctx, "reconcile")
	defer root.End()
	inst, _ := p.Create(ctx, provider.CreateRequest{Name: "proxy-1", UID: "u", CloudInit: []byte("#cloud-config secret-ish")})
	fake.NextGetErr(provider.Transient(errors.New("connection reset")))
	_, _ = p.Get(ctx, inst.ProviderID)
	_ = p.Check(ctx)

	got := lines()
	if len(got) != 2 {
		t.Fatalf("got %d lines %q, want one per operation (and none for check)", len(got), got)
	}
	traceID := root.SpanContext().TraceID().String()
	for _, want := range []string{`"msg"="provider operation finished"`, `"provider"="obs-logs"`, `"type"="fake"`, `"op"="create"`,
		`"class"="none"`, `"duration"=`, `"name"="proxy-1"`, `"providerID"="fake/proxy-1"`, `"traceID"="` + traceID + `"`, `"spanID"=`} {
		if !strings.Contains(got[0], want) {
			t.Errorf("create line %s lacks %s", got[0], want)
		}
	}
	if strings.Contains(got[0], root.SpanContext().SpanID().String()) {
		t.Error("create line carries the caller's spanID, want the provider.create span's")
	}
	if strings.Contains(got[0], "cloud-config") {
		t.Error("create line carries cloud-init content")
	}
	for _, want := range []string{`"op"="get"`, `"class"="transient"`, `"error"="connection reset"`} {
		if !strings.Contains(got[1], want) {
			t.Errorf("get line %s lacks %s", got[1], want)
		}
	}

	quiet, quietLines := logLines(t.Context(), 0)
	_, _ = p.ListByTag(quiet)
	if n := len(quietLines()); n != 0 {
		t.Fatalf("%d outcome lines at verbosity 0, want none (they are V(1))", n)
	}
}

func TestObservePassesTheContract(t *testing.T) {
	providertest.RunContract(t, func(t *testing.T) providertest.ContractEnv {
		return providertest.ContractEnv{
			Provider:    provider.Observe("obs-contract", "fake", providertest.NewFake()),
			Request:     provider.CreateRequest{Name: "proxy-0", UID: "u", Port: 3128},
			MissingID:   providertest.ProviderID("proxy-missing"),
			MalformedID: "nope",
			Targets:     []string{"fake"},
		}
	})
}

// TestObserveReboot: a Reboot through Observe opens provider.reboot, writes the outcome
// line and counts op reboot, as the other calls do; RebooterOf finds it through Observe.
func TestObserveReboot(t *testing.T) {
	exp, tp := recordSpans(t)
	fake := providertest.NewFake()
	name := fmt.Sprintf("obs-reboot-%d", time.Now().UnixNano())
	p := provider.Observe(name, "fake", fake)
	r, ok := provider.RebooterOf(p)
	if !ok {
		t.Fatal("RebooterOf(Observe(fake)): no Rebooter")
	}
	if _, isFake := r.(*providertest.Fake); isFake {
		t.Fatal("RebooterOf skipped the observing decorator")
	}
	ctx, lines := logLines(t.Context(), 1)
	ctx, root := tp.Tracer("test").Start(ctx, "remediate")
	inst, _ := p.Create(ctx, provider.CreateRequest{Name: "proxy-1", UID: "u"})
	if err := r.Reboot(ctx, inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	err := r.Reboot(ctx, providertest.ProviderID("proxy-gone"))
	if !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("reboot of a missing instance through Observe: %v, want ErrNotFound kept", err)
	}
	root.End()
	if fake.Reboots(inst.ProviderID) != 1 {
		t.Fatalf("the fake counted %d reboots, want 1", fake.Reboots(inst.ProviderID))
	}

	var reboots []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "provider.reboot" {
			reboots = append(reboots, s)
		}
	}
	if len(reboots) != 2 {
		t.Fatalf("%d provider.reboot spans, want 2", len(reboots))
	}
	ok0 := attrs(reboots[0].Snapshot())
	if reboots[0].Parent.SpanID() != root.SpanContext().SpanID() || reboots[0].SpanKind != trace.SpanKindInternal ||
		ok0[provider.AttrProviderID].AsString() != inst.ProviderID || ok0[provider.AttrErrorClass].AsString() != "none" ||
		ok0[provider.AttrProvider].AsString() != name || ok0[provider.AttrType].AsString() != "fake" || reboots[0].Status.Code != codes.Unset {
		t.Errorf("provider.reboot span %+v attrs %v", reboots[0], ok0)
	}
	if a := attrs(reboots[1].Snapshot()); a[provider.AttrErrorClass].AsString() != "notfound" || reboots[1].Status.Code != codes.Error {
		t.Errorf("failed provider.reboot span status %+v attrs %v", reboots[1].Status, a)
	}

	got := lines()
	if len(got) != 3 {
		t.Fatalf("got %d lines %q, want one per operation", len(got), got)
	}
	for _, want := range []string{`"msg"="provider operation finished"`, `"op"="reboot"`, `"class"="none"`,
		`"providerID"="fake/proxy-1"`, `"traceID"="` + root.SpanContext().TraceID().String() + `"`} {
		if !strings.Contains(got[1], want) {
			t.Errorf("reboot line %s lacks %s", got[1], want)
		}
	}
	if !strings.Contains(got[2], `"class"="notfound"`) || !strings.Contains(got[2], `"error"="fake: instance fake/proxy-gone not found"`) {
		t.Errorf("failed reboot line %s", got[2])
	}

	const total = "proxy_operator_provider_operations_total"
	for class, want := range map[string]float64{"none": 1, "notfound": 1} {
		if got := metricValue(t, total, map[string]string{"provider": name, "op": "reboot", "class": class}); got != want {
			t.Errorf("%s{op=reboot,class=%s} = %v, want %v", total, class, got, want)
		}
	}
	if got := metricValue(t, "proxy_operator_provider_operation_duration_seconds", map[string]string{"provider": name, "op": "reboot"}); got != 2 {
		t.Errorf("reboot duration count = %v, want 2", got)
	}
}

// TestRebooterOf: found on the provider itself and through Observe; not found for a
// provider without Reboot, also when a decorator that has the method wraps it.
func TestRebooterOf(t *testing.T) {
	fake := providertest.NewFake()
	if r, ok := provider.RebooterOf(fake); !ok || r != provider.Rebooter(fake) {
		t.Errorf("RebooterOf(fake) = %v, %v", r, ok)
	}
	if _, ok := provider.RebooterOf(provider.Observe("a", "fake", provider.Observe("b", "fake", fake))); !ok {
		t.Error("RebooterOf through two decorators: not found")
	}
	plain := providertest.WithoutReboot(fake)
	if _, ok := provider.RebooterOf(plain); ok {
		t.Error("RebooterOf a provider without Reboot: found")
	}
	if _, ok := provider.RebooterOf(provider.Observe("c", "fake", plain)); ok {
		t.Error("RebooterOf(Observe(provider without Reboot)): found the decorator's method")
	}
	if _, ok := provider.RebooterOf(nil); ok {
		t.Error("RebooterOf(nil): found")
	}
	// Called anyway, the decorator's Reboot over a provider without one is permanent.
	o := provider.Observe("d", "fake", plain).(provider.Rebooter)
	err := o.Reboot(t.Context(), providertest.ProviderID("x"))
	if !errors.Is(err, provider.ErrPermanent) || !strings.Contains(err.Error(), "provider d of type fake cannot reboot instances") {
		t.Errorf("Reboot through Observe of a provider without it: %v", err)
	}
}
