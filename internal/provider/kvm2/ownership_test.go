package kvm2

import (
	"errors"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
)

// The ownership rules beyond the type's namespace: the install a mark names, and the spec
// hash it records. Every test runs for both types built on this code.
var bothTypes = []string{provider.TypeKVM2, provider.TypeKVM}

// installEnv is two providers of type typ on env's one host, as two installs of the
// operator (two clusters) sharing a hypervisor would be.
func installEnv(t *testing.T, typ string) (env *testEnv, a, b *Provider, logsA *logSink) {
	t.Helper()
	env = newTestEnv(t)
	a, logsA = env.besideLogged(t, typ, "home", WithInstallID("install-a"))
	b = env.beside(t, typ, "home", WithInstallID("install-b"))
	return env, a, b, logsA
}

func markOf(t *testing.T, f *libvirtfake.Fake, typ, name string) ident.Mark {
	t.Helper()
	d, ok := f.Domain(name)
	if !ok {
		t.Fatalf("no domain %s", name)
	}
	m, err := ident.ParseMark(MetadataURI(typ), d.Metadata[MetadataURI(typ)])
	if err != nil {
		t.Fatalf("mark of %s: %v", name, err)
	}
	return m
}

// TestTwoInstallsOnOneHost: each install lists, gets, adopts, starts and deletes only the
// domains its own marks name; a Create meeting the other's domain fails permanently
// naming the other install, and leaves the domain as it was.
func TestTwoInstallsOnOneHost(t *testing.T) {
	for _, typ := range bothTypes {
		t.Run(typ, func(t *testing.T) {
			env, a, b, logsA := installEnv(t, typ)
			f := env.fake
			instA, err := a.Create(t.Context(), testRequest("proxy-ia1ia1ia1ia1ia1i"))
			if err != nil {
				t.Fatal(err)
			}
			instB, err := b.Create(t.Context(), testRequest("proxy-ib1ib1ib1ib1ib1i"))
			if err != nil {
				t.Fatal(err)
			}
			if m := markOf(t, f, typ, instA.Name); m.Install != "install-a" || m.UID != instA.UID {
				t.Fatalf("install a's mark: %+v", m)
			}
			wantListed(t, "install a", a, instA.Name)
			wantListed(t, "install b", b, instB.Name)
			if len(logsA.find(`"kvm2 list skips domain"`, `"name":"`+instB.Name+`"`, `"install":"install-b"`)) == 0 {
				t.Error("no skip line naming the other install")
			}

			// Get of the other install's domain: not ours, NotFound naming the install.
			_, err = a.Get(t.Context(), instB.ProviderID)
			wantClass(t, err, provider.ErrNotFound, nil)
			if want := "domain " + instB.Name + " on host h1 belongs to install install-b, not to this one"; err.Error() != want {
				t.Fatalf("get: %q, want %q", err, want)
			}

			// Create of its name, even with its own UID and spec, shut off: permanent,
			// naming the other install, and neither started nor rebuilt.
			must(0, f.SetDomainState(instB.Name, libvirt.DomainShutoff))
			f.ResetCalls()
			_, err = a.Create(t.Context(), testRequest(instB.Name))
			wantClass(t, err, provider.ErrPermanent, nil)
			if want := "domain " + instB.Name + " on host h1 belongs to install install-b, not to this one"; err.Error() != want {
				t.Fatalf("create: %q, want %q", err, want)
			}
			if errors.Is(err, provider.ErrOwnedByOther) {
				t.Error("another install's domain is marked as clearing by itself; this install's GC never removes it")
			}
			// Delete of it: success, domain and volumes left alone.
			if err := a.Delete(t.Context(), instB.ProviderID); err != nil {
				t.Fatal(err)
			}
			untouched(t, f)
			if s := stateOf(f, instB.Name); s != libvirt.DomainShutoff {
				t.Fatalf("the other install's domain is %v, want it left shut off", s)
			}
			for _, vol := range []string{overlayVolName(instB.Name), seedVolName(instB.Name)} {
				if _, ok := f.Volume(libvirtfake.DefaultPool, vol); !ok {
					t.Errorf("volume %s went with the other install's Delete", vol)
				}
			}
			if len(logsA.find(`"kvm2 delete leaves domain alone: it belongs to another install"`, `"install":"install-b"`)) != 1 {
				t.Error("no line for the delete that left the other install's domain alone")
			}
			wantListed(t, "install b", b, instB.Name)

			// Its owner still adopts and starts it.
			if _, err := b.Create(t.Context(), testRequest(instB.Name)); err != nil {
				t.Fatal(err)
			}
			if s := stateOf(f, instB.Name); s != libvirt.DomainRunning {
				t.Fatalf("install b's own adoption left it %v", s)
			}
		})
	}
}

// TestMarkWithoutInstallKeepsOldBehaviour: a mark written before installs had
// identities is every install's, as before: listed, adopted (and started) and deleted.
func TestMarkWithoutInstallKeepsOldBehaviour(t *testing.T) {
	for _, typ := range bothTypes {
		t.Run(typ, func(t *testing.T) {
			env, a, b, _ := installEnv(t, typ)
			f := env.fake
			const name = "proxy-old0old0old0old0"
			req := testRequest(name)
			defineForeign(t, f, name, markFor(t, MetadataURI(typ), req.UID), false)
			wantListed(t, "install a", a, name)
			wantListed(t, "install b", b, name)
			req.SpecHash = "new-spec"
			inst, err := a.Create(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			if s := stateOf(f, name); s != libvirt.DomainRunning || f.Calls("DomainDefineXMLFlags") != 0 {
				t.Fatalf("an old mark was not adopted as it is: state %v, %d defines", s, f.Calls("DomainDefineXMLFlags"))
			}
			if _, err := a.Get(t.Context(), inst.ProviderID); err != nil {
				t.Fatal(err)
			}
			if err := a.Delete(t.Context(), inst.ProviderID); err != nil {
				t.Fatal(err)
			}
			if _, ok := f.Domain(name); ok {
				t.Fatal("a domain with an old mark survived its Delete")
			}
		})
	}
}

// TestCreateReplacesDomainBuiltFromAnotherSpec: an attempt defines the domain, then its
// start fails, so no providerID is recorded; the corrected spec's Create deletes that
// domain and builds the new one (definition, overlay and seed) instead of booting the old.
func TestCreateReplacesDomainBuiltFromAnotherSpec(t *testing.T) {
	for _, typ := range bothTypes {
		t.Run(typ, func(t *testing.T) {
			env := newTestEnv(t, withType(typ))
			f := env.fake
			req := testRequest("proxy-5bec5bec5bec5bec")
			req.SpecHash = "spec-1"
			f.SetStateAfterCreate(req.Name, libvirt.DomainShutoff)
			if _, err := env.p.Create(t.Context(), req); provider.Class(err) != provider.ErrTransient {
				t.Fatalf("first attempt: %v, want the transient failed start", err)
			}
			if m := markOf(t, f, typ, req.Name); m.SpecHash != "spec-1" {
				t.Fatalf("the mark records spec hash %q, want spec-1", m.SpecHash)
			}
			old, _ := f.Domain(req.Name)

			fixed := req
			fixed.SpecHash = "spec-2"
			fixed.CloudInit = []byte("#cloud-config\nhostname: fixed\n")
			f.ResetCalls()
			inst, err := env.p.Create(t.Context(), fixed)
			if err != nil {
				t.Fatal(err)
			}
			d, _ := f.Domain(req.Name)
			// One undefine of the old domain; two defines, the claim and the definition.
			if d.UUID == old.UUID || f.Calls("DomainUndefineFlags") != 1 || f.Calls("DomainDefineXMLFlags") != 2 {
				t.Fatalf("the domain was not replaced: uuid %v (old %v), %d undefines, %d defines",
					d.UUID, old.UUID, f.Calls("DomainUndefineFlags"), f.Calls("DomainDefineXMLFlags"))
			}
			if m := markOf(t, f, typ, req.Name); m.SpecHash != "spec-2" || m.UID != req.UID {
				t.Fatalf("the new mark: %+v", m)
			}
			seed, _ := f.Volume(libvirtfake.DefaultPool, seedVolName(req.Name))
			if got := readISOFile(t, seed.Content, "user-data"); got != string(fixed.CloudInit) {
				t.Fatalf("the seed holds user-data %q, want the fixed spec's", got)
			}
			if inst.State != provider.StateRunning || stateOf(f, req.Name) != libvirt.DomainRunning {
				t.Fatalf("the replacement is %+v, %v", inst, stateOf(f, req.Name))
			}
			if len(env.logs.find(`"kvm2 domain replaced: it was built from another spec"`, `"oldSpecHash":"spec-1"`, `"specHash":"spec-2"`)) != 1 {
				t.Fatalf("no replacement line:\n%s", strings.Join(env.logs.all(), "\n"))
			}
		})
	}
}

// TestCreateAdoptsWhenEitherHashIsUnknown: the same hash, a request without one and a
// mark without one all adopt the domain as it is.
func TestCreateAdoptsWhenEitherHashIsUnknown(t *testing.T) {
	for _, c := range []struct{ name, built, asked string }{
		{"same hash", "spec-1", "spec-1"},
		{"request without hash", "spec-1", ""},
		{"mark without hash", "", "spec-2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := newTestEnv(t)
			f := env.fake
			req := testRequest("proxy-ad0bad0bad0bad0b")
			req.SpecHash = c.built
			if _, err := env.p.Create(t.Context(), req); err != nil {
				t.Fatal(err)
			}
			must(0, f.SetDomainState(req.Name, libvirt.DomainShutoff))
			f.ResetCalls()
			req.SpecHash = c.asked
			if _, err := env.p.Create(t.Context(), req); err != nil {
				t.Fatal(err)
			}
			if f.Calls("DomainUndefineFlags") != 0 || f.Calls("DomainDefineXMLFlags") != 0 || f.Calls("DomainCreate") != 1 {
				t.Fatalf("not adopted as it is: %v", f.CallCounts())
			}
		})
	}
}

// TestCreateRemovesItsUIDFromOtherHosts: a Proxy whose placement moved before a
// providerID was recorded left a domain on its old host. The Create on the new host,
// finding nothing there, removes it (domain and volumes) and nothing else: not another
// UID's domain, not another install's.
func TestCreateRemovesItsUIDFromOtherHosts(t *testing.T) {
	for _, typ := range bothTypes {
		t.Run(typ, func(t *testing.T) {
			env := newTestEnv(t, withHosts("h1", "h2"))
			p, logs := env.besideLogged(t, typ, "home", WithInstallID("install-a"))
			other := env.beside(t, typ, "home", WithInstallID("install-b"))
			h1 := env.fakes["h1"]
			req := testRequest("proxy-m0ve0m0ve0m0ve0m")
			req.Placement.Zone = "h1"
			if _, err := p.Create(t.Context(), req); err != nil {
				t.Fatal(err)
			}
			neighbour := testRequest("proxy-ne1ghb0ur0ne1gh")
			neighbour.Placement.Zone = "h1"
			if _, err := p.Create(t.Context(), neighbour); err != nil {
				t.Fatal(err)
			}
			foreign := testRequest("proxy-f0re1gnf0re1gnf")
			foreign.UID = req.UID
			foreign.Placement.Zone = "h1"
			if _, err := other.Create(t.Context(), foreign); err != nil {
				t.Fatal(err)
			}

			moved := req
			moved.Placement.Zone = "h2"
			inst, err := p.Create(t.Context(), moved)
			if err != nil {
				t.Fatal(err)
			}
			if inst.ProviderID != ident.ProviderID("h2", req.Name) || stateOf(env.fakes["h2"], req.Name) != libvirt.DomainRunning {
				t.Fatalf("moved instance %+v", inst)
			}
			if _, ok := h1.Domain(req.Name); ok {
				t.Fatal("the domain on the old host survived the move")
			}
			for _, vol := range []string{overlayVolName(req.Name), seedVolName(req.Name)} {
				if _, ok := h1.Volume(libvirtfake.DefaultPool, vol); ok {
					t.Errorf("volume %s stayed on the old host", vol)
				}
			}
			for _, name := range []string{neighbour.Name, foreign.Name} {
				if stateOf(h1, name) != libvirt.DomainRunning {
					t.Errorf("domain %s on the old host is %v, want it left running", name, stateOf(h1, name))
				}
			}
			if len(logs.find(`"kvm2 domain removed from another host: placement moved it"`, `"otherHost":"h1"`, `"otherName":"`+req.Name+`"`)) != 1 {
				t.Fatalf("no line for the removal:\n%s", strings.Join(logs.all(), "\n"))
			}

			// A repeat Create finds its domain on the target and looks nowhere else.
			h1.ResetCalls()
			if _, err := p.Create(t.Context(), moved); err != nil {
				t.Fatal(err)
			}
			if n := h1.TotalCalls(); n != 0 {
				t.Fatalf("an adopting Create made %d calls to another host", n)
			}
		})
	}
}

// TestCreateElsewhereFailures: another host that cannot be listed is skipped with a
// line, and the Create goes on; a removal that fails on a host that answers fails the
// Create (transient) before anything is built, so the retry looks again.
func TestCreateElsewhereFailures(t *testing.T) {
	env := newTestEnv(t, withHosts("h1", "h2"))
	h1, h2 := env.fakes["h1"], env.fakes["h2"]
	req := testRequest("proxy-e1se0e1se0e1se0e")
	req.Placement.Zone = "h1"
	if _, err := env.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	moved := req
	moved.Placement.Zone = "h2"

	h1.FailNext("DomainUndefineFlags", libvirtfake.Errorf(libvirt.ErrInternalError, "undefine broke"))
	_, err := env.p.Create(t.Context(), moved)
	wantClass(t, err, provider.ErrTransient, nil)
	want := "removing domain " + req.Name + " of UID " + req.UID + " from host h1, which placement no longer selects: undefining domain"
	if !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("got %q, want it to start %q", err, want)
	}
	if _, ok := h2.Domain(req.Name); ok {
		t.Fatal("the new domain was built although the old one could not be removed")
	}

	h1.FailNext("ConnectListAllDomains", libvirtfake.Errorf(libvirt.ErrInternalError, "list broke"))
	if _, err := env.p.Create(t.Context(), moved); err != nil {
		t.Fatal(err)
	}
	if stateOf(h2, req.Name) != libvirt.DomainRunning {
		t.Fatal("no domain on the new host")
	}
	if len(env.logs.find(`"kvm2 create could not look for domains of this UID on another host; any stays there"`, `"otherHost":"h1"`, "list broke")) != 1 {
		t.Fatalf("no line for the host that could not be listed:\n%s", strings.Join(env.logs.all(), "\n"))
	}
}

// TestCreateOfAnotherUIDIsMarkedOwnedByOther: the "belongs to UID" error carries
// provider.ErrOwnedByOther beside its class, so the reconciler knows orphan GC may clear
// it; its message is unchanged.
func TestCreateOfAnotherUIDIsMarkedOwnedByOther(t *testing.T) {
	env := newTestEnv(t)
	req := testRequest("proxy-0b0b0b0b0b0b0b0b")
	if _, err := env.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	other := req
	other.UID = "uid-recreated"
	_, err := env.p.Create(t.Context(), other)
	wantClass(t, err, provider.ErrPermanent, provider.ErrOwnedByOther)
	if want := "domain " + req.Name + " on host h1 belongs to UID " + req.UID + ", not to UID uid-recreated"; err.Error() != want {
		t.Fatalf("got %q, want %q", err, want)
	}
}

// TestCreateElsewhereCheckCost: the look at the other hosts is one listing plus one mark
// read per domain there, and only for a Create that finds nothing on its target.
func TestCreateElsewhereCheckCost(t *testing.T) {
	env := newTestEnv(t, withHosts("h1", "h2"))
	h1 := env.fakes["h1"]
	neighbour := testRequest("proxy-c0571c0571c0571c")
	neighbour.Placement.Zone = "h1"
	if _, err := env.p.Create(t.Context(), neighbour); err != nil {
		t.Fatal(err)
	}
	req := testRequest("proxy-c0572c0572c0572c")
	req.Placement.Zone = "h2"
	h1.ResetCalls()
	if _, err := env.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if got := h1.CallCounts(); h1.TotalCalls() != 2 || got["ConnectListAllDomains"] != 1 || got["DomainGetMetadata"] != 1 {
		t.Fatalf("a fresh Create on h2 made %v on h1, want one listing and one mark read", got)
	}
}
