package provider_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// closingFake is a fake that records Close, like a provider holding connections.
type closingFake struct {
	*providertest.Fake
	closed bool
}

func (c *closingFake) Close() error { c.closed = true; return nil }

func kvmBlock() *provider.KVMConfig {
	return &provider.KVMConfig{
		SSHKeyFile: "/k", InsecureIgnoreHostKey: true,
		MachineTypes: map[string]provider.KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 512}},
		Hosts:        []provider.KVMHost{{Name: "h", Address: "h:22", User: "u", Bridge: "br0"}},
	}
}

func TestBuild(t *testing.T) {
	var seen []provider.ProviderConfig
	fakes := map[string]*providertest.Fake{}
	reg := provider.Registry{provider.TypeKVM2: func(pc provider.ProviderConfig, _ logr.Logger) (provider.Provider, error) {
		seen = append(seen, pc)
		f := providertest.NewFake()
		fakes[pc.Name] = f
		return f, nil
	}}
	cfg := &provider.Config{Providers: []provider.ProviderConfig{
		{Name: "home", Type: provider.TypeKVM2, KVM2: kvmBlock()},
		{Name: "lab", Type: provider.TypeKVM2, KVM2: kvmBlock()},
	}}
	got, err := provider.Build(cfg, reg, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(seen) != 2 || seen[0].Name != "home" || seen[1].KVM2 == nil {
		t.Fatalf("built %v from entries %+v", got, seen)
	}
	for name, p := range got {
		u, ok := p.(interface{ Unwrap() provider.Provider })
		if !ok || u.Unwrap() != provider.Provider(fakes[name]) {
			t.Fatalf("provider %s is not the constructor's provider wrapped by Observe", name)
		}
	}
	// A call through the built provider reaches the constructed one.
	if _, err := got["lab"].Create(t.Context(), provider.CreateRequest{Name: "x", UID: "u"}); err != nil || fakes["lab"].CountOf(providertest.OpCreate) != 1 {
		t.Fatalf("create through the built provider: %v", err)
	}
}

func TestBuildErrors(t *testing.T) {
	var built []*closingFake
	ok := func(pc provider.ProviderConfig, _ logr.Logger) (provider.Provider, error) {
		c := &closingFake{Fake: providertest.NewFake()}
		built = append(built, c)
		return c, nil
	}
	failing := func(pc provider.ProviderConfig, _ logr.Logger) (provider.Provider, error) {
		return nil, errors.New("read /k: permission denied")
	}
	cases := []struct {
		name string
		cfg  *provider.Config
		reg  provider.Registry
		want []string
	}{
		{"type without a constructor",
			&provider.Config{Providers: []provider.ProviderConfig{{Name: "old", Type: provider.TypeKVM, KVM: kvmBlock()}}},
			provider.Registry{provider.TypeKVM2: ok},
			[]string{`provider "old": type "kvm" is not available (available: kvm2)`}},
		{"constructor error, earlier providers closed",
			&provider.Config{Providers: []provider.ProviderConfig{
				{Name: "a", Type: provider.TypeKVM2, KVM2: kvmBlock()}, {Name: "b", Type: provider.TypeKVM, KVM: kvmBlock()}}},
			provider.Registry{provider.TypeKVM2: ok, provider.TypeKVM: failing},
			[]string{`provider "b": read /k: permission denied`}},
		{"invalid config",
			&provider.Config{Providers: []provider.ProviderConfig{{Name: "a", Type: provider.TypeKVM2}}},
			provider.Registry{provider.TypeKVM2: ok},
			[]string{`provider "a": type kvm2 needs a kvm2: block`}},
		{"empty registry",
			&provider.Config{Providers: []provider.ProviderConfig{{Name: "a", Type: provider.TypeKVM2, KVM2: kvmBlock()}}},
			provider.Registry{},
			[]string{`provider "a": type "kvm2" is not available (available: none)`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			built = nil
			got, err := provider.Build(tc.cfg, tc.reg, logr.Discard())
			if got != nil || err == nil || err.Error() != strings.Join(tc.want, "\n") {
				t.Fatalf("Build = %v, %v; want %q", got, err, tc.want)
			}
			for _, c := range built {
				if !c.closed {
					t.Fatal("a provider built before the failure was not closed")
				}
			}
		})
	}
	if got, err := provider.Build(nil, provider.Registry{}, logr.Discard()); err != nil || len(got) != 0 {
		t.Fatalf("Build(nil) = %v, %v", got, err)
	}
}
