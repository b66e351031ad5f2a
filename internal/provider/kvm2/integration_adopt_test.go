//go:build integration

package kvm2

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
)

// defineForeignDomain defines (without starting) a small domain called name, as an admin
// or another tool would, carrying meta in its <metadata> when meta is not empty.
func (e *itRealEnv) defineForeignDomain(t *testing.T, name, meta string) {
	t.Helper()
	doc := "<domain type='" + e.host.domainType + "'><name>" + name + "</name>"
	if meta != "" {
		doc += "<metadata>" + meta + "</metadata>"
	}
	doc += "<memory unit='MiB'>64</memory><vcpu>1</vcpu><os><type arch='x86_64' machine='q35'>hvm</type></os></domain>"
	f := filepath.Join(t.TempDir(), name+".xml")
	if err := os.WriteFile(f, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	itMustVirsh(t, "define", f)
}

func itMark(t *testing.T, typ, uid string) string {
	t.Helper()
	m, err := ident.MarshalMark(MetadataURI(typ), ident.Mark{UID: uid, CreatedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func itDomState(t *testing.T, name string) string {
	t.Helper()
	return strings.TrimSpace(itMustVirsh(t, "domstate", name))
}

// TestKVM2Adoption_realHost: a domain of the requested name is taken over only when it
// carries the kvm2 mark with the same owner, and never started when it is paused.
func TestKVM2Adoption_realHost(t *testing.T) {
	e := itNewRealEnv(t, "adopt")
	t.Cleanup(e.removeImage)
	p := e.newProvider(itEnvOptions{diskSizeGb: 1})

	t.Run("no mark", func(t *testing.T) {
		name := e.names.vm(1)
		e.defineForeignDomain(t, name, "")
		_, err := createSettled(itCtxFor(t), p, e.request(name, "uid-mine"))
		itWantErr(t, err, provider.ErrPermanent,
			"domain "+name+" on host "+integrationHost+" carries no kvm2 mark; it was not created by this provider")
		// Not ours: Delete leaves it alone and it was never started.
		if err := p.Delete(itCtxFor(t), ident.ProviderID(integrationHost, name)); err != nil {
			t.Fatalf("delete of a domain without the mark: %v", err)
		}
		if s := itDomState(t, name); s != "shut off" {
			t.Fatalf("the foreign domain is %q after Create and Delete, want it untouched (shut off)", s)
		}
		itMustVirsh(t, "undefine", name)
	})

	t.Run("another owner", func(t *testing.T) {
		name := e.names.vm(2)
		e.defineForeignDomain(t, name, itMark(t, provider.TypeKVM2, "uid-theirs"))
		_, err := createSettled(itCtxFor(t), p, e.request(name, "uid-mine"))
		itWantErr(t, err, provider.ErrPermanent,
			"domain "+name+" on host "+integrationHost+" belongs to UID uid-theirs, not to UID uid-mine")
		if s := itDomState(t, name); s != "shut off" {
			t.Fatalf("another owner's domain is %q after Create, want it untouched", s)
		}
		itMustVirsh(t, "undefine", name)
	})

	t.Run("paused", func(t *testing.T) {
		req := e.request(e.names.vm(3), "uid-mine")
		inst, err := createSettled(itCtxFor(t), p, req)
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		itMustVirsh(t, "suspend", req.Name)
		_, err = createSettled(itCtxFor(t), p, req)
		itWantErr(t, err, provider.ErrPermanent, "domain "+req.Name+" on host "+integrationHost+
			" is DomainPaused and cannot be started by the operator; resume or destroy it on the host")
		if s := itDomState(t, req.Name); s != "paused" {
			t.Fatalf("the paused domain is %q after Create, want it left paused", s)
		}
		// Resumed by the admin, the next Create adopts it as it is.
		itMustVirsh(t, "resume", req.Name)
		if _, err := createSettled(itCtxFor(t), p, req); err != nil {
			t.Fatalf("create after resume: %v", err)
		}
		if err := p.Delete(itCtxFor(t), inst.ProviderID); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if hasDomain := itHasDomain(req.Name); hasDomain {
			t.Fatalf("domain %s is still there after Delete", req.Name)
		}
	})
}

// itListed finds name in a listing.
func itListed(list []provider.Instance, name string) (provider.Instance, bool) {
	for _, in := range list {
		if in.Name == name {
			return in, true
		}
	}
	return provider.Instance{}, false
}

// TestKVM2ListByTag_realHost: the listing holds the provider's own domains, with their
// owners, and none of the domains that lack its mark.
func TestKVM2ListByTag_realHost(t *testing.T) {
	e := itNewRealEnv(t, "list")
	t.Cleanup(e.removeImage)
	p := e.newProvider(itEnvOptions{diskSizeGb: 1})
	mine := e.request(e.names.vm(1), "uid-list-1")
	inst, err := createSettled(itCtxFor(t), p, mine)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	stopped := e.names.vm(2)
	e.defineForeignDomain(t, stopped, itMark(t, provider.TypeKVM2, "uid-list-2"))
	unmarked, kvmOne := e.names.vm(3), e.names.vm(4)
	e.defineForeignDomain(t, unmarked, "")
	e.defineForeignDomain(t, kvmOne, itMark(t, provider.TypeKVM, "uid-list-4"))

	list, err := p.ListByTag(itCtxFor(t))
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	if got, ok := itListed(list, mine.Name); !ok || got.UID != mine.UID || got.State != provider.StateRunning ||
		got.ProviderID != inst.ProviderID || got.CreatedAt.IsZero() {
		t.Errorf("listing has %+v for %s, want Running with uid %s", got, mine.Name, mine.UID)
	}
	if got, ok := itListed(list, stopped); !ok || got.UID != "uid-list-2" || got.State != provider.StateStopped {
		t.Errorf("listing has %+v (found %v) for the marked shut-off %s, want Stopped with uid uid-list-2", got, ok, stopped)
	}
	for _, name := range []string{unmarked, kvmOne} {
		if got, ok := itListed(list, name); ok {
			t.Errorf("listing holds %+v, which carries no kvm2 mark", got)
		}
	}
	if err := p.Delete(itCtxFor(t), inst.ProviderID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	for _, name := range []string{stopped, unmarked, kvmOne} {
		itMustVirsh(t, "undefine", name)
	}
}

// TestKVM2BesideKVM_realHost: a kvm entry and a kvm2 entry on the same host each see only
// their own domains, and neither takes over the other's.
func TestKVM2BesideKVM_realHost(t *testing.T) {
	e := itNewRealEnv(t, "types")
	t.Cleanup(e.removeImage)
	kvm := e.newProvider(itEnvOptions{typ: provider.TypeKVM, diskSizeGb: 1})
	kvm2 := e.newProvider(itEnvOptions{diskSizeGb: 1})

	old := e.request(e.names.vm(1), "uid-old")
	oldInst, err := createSettled(itCtxFor(t), kvm, old)
	if err != nil {
		t.Fatalf("kvm create: %v", err)
	}
	meta := itMustVirsh(t, "metadata", old.Name, MetadataURI(provider.TypeKVM))
	if !strings.Contains(meta, "<uid>uid-old</uid>") {
		t.Fatalf("the kvm domain's mark in %s: %q", MetadataURI(provider.TypeKVM), meta)
	}
	if _, err := itVirsh("metadata", old.Name, MetadataURI(provider.TypeKVM2)); err == nil {
		t.Fatalf("the kvm domain carries a kvm2 mark")
	}
	cur := e.request(e.names.vm(2), "uid-new")
	curInst, err := createSettled(itCtxFor(t), kvm2, cur)
	if err != nil {
		t.Fatalf("kvm2 create: %v", err)
	}

	checkOwnListings(t, kvm, kvm2, old.Name, cur.Name)

	// The same Proxy recreated under the kvm2 entry gets the same name: refused, not adopted.
	_, err = createSettled(itCtxFor(t), kvm2, old)
	itWantErr(t, err, provider.ErrPermanent, "domain "+old.Name+" on host "+integrationHost+" carries no kvm2 mark")
	_, err = kvm2.Get(itCtxFor(t), oldInst.ProviderID)
	itWantErr(t, err, provider.ErrNotFound, "carries no kvm2 mark")
	if err := kvm2.Delete(itCtxFor(t), oldInst.ProviderID); err != nil {
		t.Fatalf("kvm2 delete of the kvm domain: %v", err)
	}
	if s := itDomState(t, old.Name); s != "running" {
		t.Fatalf("the kvm domain is %q after kvm2's Create and Delete, want it untouched (running)", s)
	}
	for _, v := range []string{old.Name + ".qcow2", old.Name + "-seed.iso"} {
		if !e.hasVolume(v) {
			t.Errorf("kvm2's Delete of a kvm domain removed its volume %s", v)
		}
	}

	// The kvm entry is retired and its domain left behind: kvm2 still never lists it.
	kvm.Close()
	if err := kvm2.Delete(itCtxFor(t), curInst.ProviderID); err != nil {
		t.Fatalf("kvm2 delete: %v", err)
	}
	kvm2List, err := kvm2.ListByTag(itCtxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := itListed(kvm2List, old.Name); ok {
		t.Fatalf("kvm2 lists the kvm domain left behind: %+v", got)
	}
	cleanup := e.newProvider(itEnvOptions{typ: provider.TypeKVM})
	if err := cleanup.Delete(itCtxFor(t), oldInst.ProviderID); err != nil {
		t.Fatalf("kvm delete of its own domain: %v", err)
	}
}

// checkOwnListings lists with both providers: each holds its own domain only.
func checkOwnListings(t *testing.T, kvm, kvm2 *Provider, kvmName, kvm2Name string) {
	t.Helper()
	kvmList, err := kvm.ListByTag(itCtxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	kvm2List, err := kvm2.ListByTag(itCtxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := itListed(kvmList, kvmName); !ok {
		t.Errorf("kvm's listing misses its own %s", kvmName)
	}
	if _, ok := itListed(kvmList, kvm2Name); ok {
		t.Errorf("kvm's listing holds kvm2's %s", kvm2Name)
	}
	if _, ok := itListed(kvm2List, kvm2Name); !ok {
		t.Errorf("kvm2's listing misses its own %s", kvm2Name)
	}
	if _, ok := itListed(kvm2List, kvmName); ok {
		t.Errorf("kvm2's listing holds kvm's %s", kvmName)
	}
}
