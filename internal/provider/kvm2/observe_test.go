package kvm2

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// logSink collects log lines as funcr renders them (JSON), up to a verbosity.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func newLogSink(verbosity int) (*logSink, logr.Logger) {
	s := &logSink{}
	l := funcr.NewJSON(func(obj string) {
		s.mu.Lock()
		s.lines = append(s.lines, obj)
		s.mu.Unlock()
	}, funcr.Options{Verbosity: verbosity})
	return s, l
}

func (s *logSink) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

// reset forgets the lines collected so far.
func (s *logSink) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = nil
}

// find returns the lines containing every one of parts.
func (s *logSink) find(parts ...string) []string {
	var out []string
	for _, l := range s.all() {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(l, p)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// spansFor returns the ended spans carrying kvm2.host=host.
func spansFor(host string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range testSpans.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == "kvm2.host" && a.Value.AsString() == host {
				out = append(out, s)
			}
		}
	}
	return out
}

// hostSeq makes host names unique per test run: the span recorder is shared by the
// package, so a repeated test (-count) would otherwise see its earlier runs' spans.
var hostSeq atomic.Int64

func uniqueHost(prefix string) string { return fmt.Sprintf("%s-%d", prefix, hostSeq.Add(1)) }

func attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

func TestObservedSuccessfulCall(t *testing.T) {
	host := uniqueHost("obs-ok")
	e := newTestEnv(t, withHosts(host), withName("obs"), withLogVerbosity(2))
	hs, sink := e.hs, e.logs
	ctx, parent := rpcTracer.Start(context.Background(), "provider.create")
	b := must(hs.pooled(ctx, host))
	if _, err := b.DomainDefineXMLFlags(minimalDomainXML("proxy-obs"), 0); err != nil {
		t.Fatal(err)
	}
	parent.End()

	lines := sink.find(`"msg":"libvirt call"`, `"rpc":"DomainDefineXMLFlags"`)
	if len(lines) != 1 {
		t.Fatalf("want one libvirt call line, got %q", sink.all())
	}
	for _, want := range []string{`"logger":"kvm2"`, `"provider":"obs"`, `"host":"` + host + `"`, `"duration"`, `<name>proxy-obs</name>`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("line %s lacks %s", lines[0], want)
		}
	}
	var span sdktrace.ReadOnlySpan
	for _, s := range spansFor(host) {
		if s.Name() == "kvm2.DomainDefineXMLFlags" {
			span = s
		}
	}
	if span == nil {
		t.Fatal("no kvm2.DomainDefineXMLFlags span")
	}
	if span.SpanKind() != trace.SpanKindClient || span.Status().Code == codes.Error {
		t.Errorf("span kind %v status %v, want a client span without error", span.SpanKind(), span.Status())
	}
	if !strings.Contains(lines[0], `"spanID":"`+span.SpanContext().SpanID().String()+`"`) {
		t.Errorf("the libvirt call line %s does not carry its RPC span's ID", lines[0])
	}
	if span.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Error("the RPC span is not a child of the operation span")
	}
	if got := hs.rpcs.methods()["DomainDefineXMLFlags"]; got != 1 {
		t.Errorf("rpc count %d, want 1", got)
	}
}

func TestObservedFailedCall(t *testing.T) {
	host := uniqueHost("obs-fail")
	e := newTestEnv(t, withHosts(host), withName("obs"), withLogVerbosity(1))
	hs, sink := e.hs, e.logs
	b := must(hs.pooled(context.Background(), host))
	if _, err := b.DomainLookupByName("proxy-missing"); err == nil {
		t.Fatal("lookup of a missing domain succeeded")
	}
	lines := sink.find(`"rpc":"DomainLookupByName"`)
	if len(lines) != 1 {
		t.Fatalf("want one libvirt call line, got %q", sink.all())
	}
	for _, want := range []string{`"domain":"proxy-missing"`, `"libvirtCode":42`, `"libvirtError":"ErrNoDomain"`, `"error":`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("line %s lacks %s", lines[0], want)
		}
	}
	spans := spansFor(host)
	if len(spans) != 1 || spans[0].Name() != "kvm2.DomainLookupByName" {
		t.Fatalf("want one kvm2.DomainLookupByName span, got %d", len(spans))
	}
	s := spans[0]
	if s.Status().Code != codes.Error {
		t.Errorf("status %v, want Error", s.Status())
	}
	if v, ok := attr(s, "kvm2.libvirt_code"); !ok || v.AsInt64() != int64(libvirt.ErrNoDomain) {
		t.Errorf("kvm2.libvirt_code = %v, want %d", v.String(), libvirt.ErrNoDomain)
	}
	if v, ok := attr(s, "kvm2.domain"); !ok || v.AsString() != "proxy-missing" {
		t.Errorf("kvm2.domain = %q", v.String())
	}
}

func TestObservedDetailsOnlyAtV2(t *testing.T) {
	e := newTestEnv(t, withHosts("obs-v1"), withName("obs"), withLogVerbosity(1))
	hs, sink := e.hs, e.logs
	b := must(hs.pooled(context.Background(), "obs-v1"))
	pool := must(b.StoragePoolLookupByName("default"))
	if _, _, _, _, err := b.StoragePoolGetInfo(pool); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DomainDefineXMLFlags(minimalDomainXML("proxy-v1"), 0); err != nil {
		t.Fatal(err)
	}
	for _, l := range sink.all() {
		if strings.Contains(l, "<domain") || strings.Contains(l, "poolState") {
			t.Errorf("V(1) line carries V(2) detail: %s", l)
		}
	}
	if len(sink.find(`"rpc":"StoragePoolGetInfo"`, `"pool":"default"`)) != 1 {
		t.Errorf("no V(1) line for StoragePoolGetInfo: %q", sink.all())
	}
}

func TestRPCCounter(t *testing.T) {
	e := newTestEnv(t)
	hs := e.hs
	b := must(hs.pooled(context.Background(), "h1"))
	for range 3 {
		must(b.ConnectGetHostname())
	}
	must(b.ConnectGetLibVersion())
	if hs.rpcs.total() != 4 || hs.rpcs.methods()["ConnectGetHostname"] != 3 {
		t.Fatalf("counts %v, want 3 ConnectGetHostname and 4 in all", hs.rpcs.methods())
	}
	hs.rpcs.reset()
	if hs.rpcs.total() != 0 {
		t.Fatal("reset left counts")
	}
}
