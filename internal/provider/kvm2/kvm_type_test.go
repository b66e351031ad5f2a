package kvm2

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// The first-generation type, kvm, runs on this code with its own config block, logger
// name and metadata namespace. These tests run it beside kvm2 on the same in-memory hosts.

func TestKVMTypeMetadataNamespace(t *testing.T) {
	const want = "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/kvm"
	if got := MetadataURI(provider.TypeKVM); got != want {
		t.Fatalf("MetadataURI(kvm) = %q, want %q", got, want)
	}
	if MetadataURI(provider.TypeKVM2) != metadataURI || metadataURI != want+"2" {
		t.Fatalf("kvm2's namespace %q is not the kvm one with /kvm2", metadataURI)
	}

	env := newTestEnv(t, withType(provider.TypeKVM))
	req := testRequest("proxy-k1k1k1k1k1k1k1k1")
	if _, err := env.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	d, ok := env.fake.Domain(req.Name)
	if !ok {
		t.Fatalf("kvm Create left no domain %s", req.Name)
	}
	if _, has := d.Metadata[metadataURI]; has {
		t.Errorf("kvm domain carries a kvm2 mark: %v", d.Metadata)
	}
	m, err := ident.ParseMark(want, d.Metadata[want])
	if err != nil || m.UID != req.UID {
		t.Fatalf("kvm domain's mark in %s: %q (%v), want uid %s", want, d.Metadata[want], err, req.UID)
	}
}

func TestNewOfTypeReadsTheBlockOfItsType(t *testing.T) {
	cfg := testHostConfig("h1")
	cases := []struct {
		name, typ string
		pc        provider.ProviderConfig
		wantErr   string
	}{
		{"kvm reads kvm:", provider.TypeKVM, provider.ProviderConfig{Name: "old", KVM: &cfg}, ""},
		{"kvm ignores kvm2:", provider.TypeKVM, provider.ProviderConfig{Name: "old", KVM2: &cfg}, "provider old: the kvm block is missing"},
		{"kvm2 ignores kvm:", provider.TypeKVM2, provider.ProviderConfig{Name: "new", KVM: &cfg}, "provider new: the kvm2 block is missing"},
		{"kvm without hosts", provider.TypeKVM, provider.ProviderConfig{Name: "old", KVM: &provider.KVMConfig{}}, "provider old: kvm.hosts lists no host"},
		{"another type", "gce", provider.ProviderConfig{Name: "x", KVM: &cfg}, `provider x: type "gce" is not built on the kvm2 code`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.pc.Type = tc.typ
			p, err := NewOfType(tc.pc, tc.typ, discardLog())
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				p.Close()
				return
			}
			if err == nil || err.Error() != tc.wantErr {
				t.Fatalf("got %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestMessagesNameTheProviderType: what a user reads on a Proxy's status names the block
// of the entry the Proxy uses, kvm. or kvm2., never the other one.
func TestMessagesNameTheProviderType(t *testing.T) {
	for _, typ := range []string{provider.TypeKVM, provider.TypeKVM2} {
		t.Run(typ, func(t *testing.T) {
			env := newTestEnv(t, withType(typ), withHosts("h1", "h2"))
			create := func(mut func(*provider.CreateRequest)) error {
				req := testRequest("proxy-m1m1m1m1m1m1m1m1")
				req.Placement.Zone = "h1"
				mut(&req)
				_, err := env.p.Create(t.Context(), req)
				return err
			}
			checks := []struct {
				what string
				err  error
				want string
			}{
				{"unknown zone", create(func(r *provider.CreateRequest) { r.Placement.Zone = "x" }),
					`placement.zone "x" is not in ` + typ + `.hosts`},
				{"no zone with two hosts", create(func(r *provider.CreateRequest) { r.Placement.Zone = "" }),
					`placement.zone is required when ` + typ + `.hosts lists more than one host`},
				{"unknown machine type", create(func(r *provider.CreateRequest) { r.Placement.MachineType = "huge" }),
					`placement.machineType "huge" is not in ` + typ + `.machineTypes`},
				{"unknown image", create(func(r *provider.CreateRequest) { r.Placement.Image = "arch" }),
					`placement.image "arch" is neither a key in ` + typ + `.images nor an http(s) URL`},
				{"get on a host not configured", func() error { _, err := env.p.Get(t.Context(), ident.ProviderID("h9", "proxy-x")); return err }(),
					`providerID "hosts/h9/domains/proxy-x" names host "h9", which is not in ` + typ + `.hosts`},
			}
			for _, c := range checks {
				wantClass(t, c.err, provider.ErrPermanent, nil)
				if c.err.Error() != c.want {
					t.Errorf("%s: got %q, want %q", c.what, c.err, c.want)
				}
			}
			if _, err := env.p.hosts.pooled(t.Context(), "h9"); err == nil || err.Error() != `host "h9" is not in `+typ+`.hosts` {
				t.Errorf("pooled on an unknown host: %v", err)
			}

			env.p.Close()
			err := create(func(*provider.CreateRequest) {})
			wantClass(t, err, provider.ErrTransient, nil)
			if want := typ + " provider " + typ + "-test is shut down"; !strings.Contains(err.Error(), want) {
				t.Errorf("create after close: %q, want it to say %q", err, want)
			}
		})
	}
}

// TestKVMTypeLoggerName: every line of a kvm provider, its hosts' connection and libvirt
// call lines included, comes from the logger named kvm and carries its provider name.
func TestKVMTypeLoggerName(t *testing.T) {
	env := newTestEnv(t)
	kvm, logs := env.besideLogged(t, provider.TypeKVM, "old")
	if _, err := kvm.Create(t.Context(), testRequest("proxy-g1g1g1g1g1g1g1g1")); err != nil {
		t.Fatal(err)
	}
	if st := kvm.Check(t.Context()); len(st) != 1 || !st[0].Ready {
		t.Fatalf("check: %+v", st)
	}
	lines := logs.all()
	var sawCall, sawCheck, sawWarning bool
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if rec["logger"] != provider.TypeKVM || rec["provider"] != "old" {
			t.Fatalf("line with logger %v, provider %v, want kvm, old: %s", rec["logger"], rec["provider"], l)
		}
		msg, _ := rec["msg"].(string)
		sawCall = sawCall || msg == "libvirt call"
		sawCheck = sawCheck || msg == "kvm2 host checked"
		sawWarning = sawWarning || strings.HasPrefix(msg, "WARNING:")
	}
	if !sawCall || !sawCheck || !sawWarning {
		t.Fatalf("want a libvirt call line, a host checked line and a missing-credentials warning among %d lines: %v/%v/%v",
			len(lines), sawCall, sawCheck, sawWarning)
	}
}

// TestKVMAndKVM2OnOneHost: two entries, one of each type, naming the same hypervisor.
// Each lists only its own domains, and neither adopts, starts or deletes the other's.
func TestKVMAndKVM2OnOneHost(t *testing.T) {
	env := newTestEnv(t)
	kvm2p, f := env.p, env.fake
	kvm := env.beside(t, provider.TypeKVM, "old")

	oldInst, err := kvm.Create(t.Context(), testRequest("proxy-o1o1o1o1o1o1o1o1"))
	if err != nil {
		t.Fatal(err)
	}
	newInst, err := kvm2p.Create(t.Context(), testRequest("proxy-n1n1n1n1n1n1n1n1"))
	if err != nil {
		t.Fatal(err)
	}
	wantListed(t, "kvm", kvm, oldInst.Name)
	wantListed(t, "kvm2", kvm2p, newInst.Name)

	// Get of the other type's instance: not ours, so NotFound, as for any unmarked domain.
	_, err = kvm2p.Get(t.Context(), oldInst.ProviderID)
	wantClass(t, err, provider.ErrNotFound, nil)
	_, err = kvm.Get(t.Context(), newInst.ProviderID)
	wantClass(t, err, provider.ErrNotFound, nil)

	// Create of a name the other type holds: a permanent error naming the missing mark,
	// and the domain is left as it was.
	f.ResetCalls()
	_, err = kvm2p.Create(t.Context(), testRequest(oldInst.Name))
	wantClass(t, err, provider.ErrPermanent, nil)
	if want := "carries no kvm2 mark"; !strings.Contains(err.Error(), want) {
		t.Errorf("kvm2 create over a kvm domain: %q, want it to say %q", err, want)
	}
	_, err = kvm.Create(t.Context(), testRequest(newInst.Name))
	wantClass(t, err, provider.ErrPermanent, nil)
	if want := "carries no kvm mark"; !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "kvm2") {
		t.Errorf("kvm create over a kvm2 domain: %q, want it to say %q", err, want)
	}
	untouched(t, f)

	// Delete of the other type's instance leaves the domain and its disks alone.
	if err := kvm2p.Delete(t.Context(), oldInst.ProviderID); err != nil {
		t.Fatal(err)
	}
	if err := kvm.Delete(t.Context(), newInst.ProviderID); err != nil {
		t.Fatal(err)
	}
	untouched(t, f)
	for _, name := range []string{oldInst.Name, newInst.Name} {
		if stateOf(f, name) != libvirt.DomainRunning {
			t.Errorf("domain %s is %v after the other type's Delete, want running", name, stateOf(f, name))
		}
		for _, vol := range []string{overlayVolName(name), seedVolName(name)} {
			if _, ok := f.Volume(libvirtfake.DefaultPool, vol); !ok {
				t.Errorf("volume %s went with the other type's Delete", vol)
			}
		}
	}
	wantListed(t, "kvm", kvm, oldInst.Name)
	wantListed(t, "kvm2", kvm2p, newInst.Name)
}

// untouched fails if anything changed a domain or volume since f's calls were reset.
func untouched(t *testing.T, f interface{ Calls(string) int }) {
	t.Helper()
	for _, m := range []string{"DomainDefineXMLFlags", "DomainCreate", "DomainDestroyFlags", "DomainUndefineFlags",
		"StorageVolCreateXML", "StorageVolUpload", "StorageVolDelete"} {
		if n := f.Calls(m); n != 0 {
			t.Errorf("the other type's domain: %s called %d times", m, n)
		}
	}
}

// wantListed fails unless p's ListByTag returns exactly names.
func wantListed(t *testing.T, who string, p *Provider, names ...string) {
	t.Helper()
	list, err := p.ListByTag(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, in := range list {
		got = append(got, in.Name)
	}
	if diff := cmp.Diff(names, got); diff != "" {
		t.Fatalf("%s lists other domains (-want +got):\n%s", who, diff)
	}
}

// TestMigrationFromKVM walks the documented order: delete the Proxy on the kvm entry,
// switch the entry to kvm2, restart (a new provider object), recreate under the same
// deterministic name. A kvm domain left behind by a skipped first step stays invisible to
// kvm2's listing, so orphan GC never deletes it, and blocks the recreate permanently.
func TestMigrationFromKVM(t *testing.T) {
	env := newTestEnv(t)
	f := env.fake
	kvm := env.beside(t, provider.TypeKVM, "home")
	migrated, leftBehind := testRequest("proxy-mig0mig0mig0mig0"), testRequest("proxy-left0left0left0le")
	old, err := kvm.Create(t.Context(), migrated)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kvm.Create(t.Context(), leftBehind); err != nil {
		t.Fatal(err)
	}

	// 1. Delete the Proxy on the kvm entry (only the first; the second is forgotten).
	if err := kvm.Delete(t.Context(), old.ProviderID); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Domain(migrated.Name); ok {
		t.Fatalf("domain %s is still there after kvm's Delete", migrated.Name)
	}
	// 2. and 3. The entry becomes type kvm2 under the same name; the manager restarts.
	if err := kvm.Close(); err != nil {
		t.Fatal(err)
	}
	restarted := env.beside(t, provider.TypeKVM2, "home")
	wantListed(t, "kvm2 after the restart", restarted)

	// The Proxy is recreated: same deterministic name, now a kvm2 domain.
	inst, err := restarted.Create(t.Context(), migrated)
	if err != nil {
		t.Fatalf("recreating %s under kvm2: %v", migrated.Name, err)
	}
	if inst.ProviderID != old.ProviderID {
		t.Errorf("providerID %s, want the same deterministic %s", inst.ProviderID, old.ProviderID)
	}
	d, _ := f.Domain(migrated.Name)
	if _, ok := d.Metadata[metadataURI]; !ok || d.Metadata[MetadataURI(provider.TypeKVM)] != "" {
		t.Errorf("recreated domain's marks %v, want only kvm2's", d.Metadata)
	}
	if got, err := restarted.Get(t.Context(), inst.ProviderID); err != nil || got.UID != migrated.UID {
		t.Fatalf("get after recreate: %+v, %v", got, err)
	}

	// The forgotten kvm domain: not listed, so GC cannot see it; recreating it fails
	// permanently and leaves it running.
	wantListed(t, "kvm2", restarted, migrated.Name)
	_, err = restarted.Create(t.Context(), leftBehind)
	wantClass(t, err, provider.ErrPermanent, nil)
	if !strings.Contains(err.Error(), "carries no kvm2 mark") {
		t.Errorf("recreate over the left-behind kvm domain: %q", err)
	}
	if stateOf(f, leftBehind.Name) != libvirt.DomainRunning {
		t.Errorf("left-behind kvm domain is %v, want running", stateOf(f, leftBehind.Name))
	}
}

// TestContractKVMType runs the provider suite against the kvm type over in-memory libvirt.
func TestContractKVMType(t *testing.T) {
	providertest.RunContract(t, func(t *testing.T) providertest.ContractEnv {
		env := newTestEnv(t, withType(provider.TypeKVM))
		return env.contract()
	})
}

// TestKVMTypeSpans: wrapped as the manager wraps it, a kvm entry's operation spans carry
// provider.type=kvm and its name, and its libvirt RPC spans are their children.
func TestKVMTypeSpans(t *testing.T) {
	const host = "h-kvm-spans"
	env := newTestEnv(t, withType(provider.TypeKVM), withHosts(host))
	p := provider.Observe("old-spans", provider.TypeKVM, env.p)
	req := testRequest("proxy-s1s1s1s1s1s1s1s1")
	if _, err := p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	var op sdktrace.ReadOnlySpan
	for _, s := range testSpans.Ended() {
		attrs := attribute.NewSet(s.Attributes()...)
		if v, _ := attrs.Value(provider.AttrProvider); s.Name() == "provider.create" && v.AsString() == "old-spans" {
			op = s
			if typ, _ := attrs.Value(provider.AttrType); typ.AsString() != provider.TypeKVM {
				t.Errorf("provider.create span has provider.type %q, want kvm", typ.AsString())
			}
		}
	}
	if op == nil {
		t.Fatal("no provider.create span for old-spans")
	}
	var children int
	for _, s := range spansFor(host) {
		if s.Parent().SpanID() == op.SpanContext().SpanID() {
			children++
		}
	}
	if children == 0 {
		t.Fatalf("none of the %d libvirt spans on %s is a child of the provider.create span", len(spansFor(host)), host)
	}
}

// TestKVMAndKVM2ShareOneImageFetch: a kvm and a kvm2 entry naming the same host use the
// same base volume in its pool. Creates on both while the image is not cached yet fetch
// it once, and neither takes the other's half-written base for a stale one.
func TestKVMAndKVM2ShareOneImageFetch(t *testing.T) {
	e := newTestEnv(t, withImageServer(nil), withTestHost("img"))
	kvm := e.beside(t, provider.TypeKVM, "old")

	e.srv.setMode(serveGated)
	errs := make(chan error, 2)
	for _, p := range []*Provider{e.p, kvm} {
		go func() {
			req := testRequest("proxy-" + p.typ + "-img")
			req.Placement.Zone = e.host
			_, err := createSettled(t.Context(), p, req)
			errs <- err
		}()
	}
	e.wantOneSharedFetch(t, errs, "a kvm and a kvm2 Create")
}
