package provider_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"
	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// BenchmarkObserveGet measures what the decorator adds to a Get: bare fake, decorated with
// tracing off (no-op tracer provider), and decorated with a recording SDK tracer.
func BenchmarkObserveGet(b *testing.B) {
	prev := otel.GetTracerProvider()
	b.Cleanup(func() { otel.SetTracerProvider(prev) })
	fake := providertest.NewFake()
	inst, _ := fake.Create(context.Background(), provider.CreateRequest{Name: "proxy-0", UID: "u"})
	run := func(b *testing.B, p provider.Provider) {
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.Get(ctx, inst.ProviderID); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, fake) })
	b.Run("observed-noop", func(b *testing.B) {
		otel.SetTracerProvider(noop.NewTracerProvider())
		run(b, provider.Observe("bench", "fake", fake))
	})
	b.Run("observed-sdk", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
		otel.SetTracerProvider(tp)
		run(b, provider.Observe("bench", "fake", fake))
	})
}

func BenchmarkParseConfig(b *testing.B) {
	k := &provider.KVMConfig{
		SSHKeyFile: "/k", KnownHostsFile: "/kh",
		Images:       map[string]provider.KVMImage{"debian-12": {URL: "https://cloud.debian.org/x.qcow2"}, "ubuntu": {URL: "https://x/y", Format: "raw"}},
		MachineTypes: map[string]provider.KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 1024}, "large": {VCPUs: 4, MemoryMiB: 8192}},
	}
	for _, n := range []string{"a", "b", "c", "d"} {
		k.Hosts = append(k.Hosts, provider.KVMHost{Name: n, Address: n + ":22", User: "u", Bridge: "br0"})
	}
	data, err := yaml.Marshal(&provider.Config{Providers: []provider.ProviderConfig{{Name: "home", Type: provider.TypeKVM2, KVM2: k}}})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := provider.ParseConfig(data); err != nil {
			b.Fatal(err)
		}
	}
}
