package kvm2

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

func TestProviderOverSSH(t *testing.T) {
	e := newTestEnv(t, withSSH(), withHosts("ssh1"), withProviderOptions(WithInstallID("install-a")), withLogVerbosity(1))
	p, f, logs := e.p, e.fake, e.logs
	ctx := t.Context()
	req := testRequest("proxy-5e5e5e5e5e5e5e5e")
	req.Placement.Zone = "ssh1"

	inst, err := p.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if inst.ProviderID != "hosts/ssh1/domains/"+req.Name {
		t.Fatalf("providerID %q", inst.ProviderID)
	}
	seed, ok := f.Volume(libvirtfake.DefaultPool, req.Name+"-seed.iso")
	if !ok || readISOFile(t, seed.Content, "user-data") != testUserData {
		t.Fatal("the seed did not arrive intact over the stream")
	}
	must(0, f.SetInterfaceAddresses(req.Name, libvirt.DomainInterfaceAddressesSrcAgent,
		[]libvirt.DomainInterface{libvirtfake.Interface("eth0", "52:54:00:00:00:02", "192.168.1.90/24")}, nil))
	got, err := p.Get(ctx, inst.ProviderID)
	if err != nil || got.IP != "192.168.1.90" || got.UID != req.UID || got.State != provider.StateRunning {
		t.Fatalf("get: %+v %v", got, err)
	}
	list, err := p.ListByTag(ctx)
	if err != nil || len(list) != 1 || list[0].UID != req.UID {
		t.Fatalf("list: %+v %v", list, err)
	}
	if st := p.Check(ctx); len(st) != 1 || !st[0].Ready {
		t.Fatalf("check: %+v", st)
	}

	// libvirt's error codes survive the wire: the adoption guard and NotFound.
	other := req
	other.UID = "uid-someone-else"
	if _, err := p.Create(ctx, other); provider.Class(err) != provider.ErrPermanent || !strings.Contains(err.Error(), "belongs to UID "+req.UID) ||
		!errors.Is(err, provider.ErrOwnedByOther) {
		t.Fatalf("create by another uid: %v", err)
	}
	// Another install's domain on the same host: not listed, not adopted, not deleted.
	const theirs = "proxy-7e7e7e7e7e7e7e7e"
	defineForeign(t, f, theirs, must(ident.MarshalMark(metadataURI, ident.Mark{UID: "uid-theirs", CreatedAt: time.Now(), Install: "install-b"})), true)
	list, err = p.ListByTag(ctx)
	if err != nil || len(list) != 1 || list[0].Name != req.Name {
		t.Fatalf("list beside another install's domain: %+v %v", list, err)
	}
	theirReq := testRequest(theirs)
	theirReq.UID = "uid-theirs"
	if _, err := p.Create(ctx, theirReq); provider.Class(err) != provider.ErrPermanent ||
		err.Error() != "domain "+theirs+" on host ssh1 belongs to install install-b, not to this one" {
		t.Fatalf("create over another install's domain: %v", err)
	}
	if err := p.Delete(ctx, ident.ProviderID("ssh1", theirs)); err != nil || stateOf(f, theirs) != libvirt.DomainRunning {
		t.Fatalf("delete of another install's domain: %v, state %v", err, stateOf(f, theirs))
	}
	if err := p.Delete(ctx, inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx, inst.ProviderID); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	if _, ok := f.Domain(req.Name); ok {
		t.Fatal("domain survived the delete")
	}
	// One pooled connection served all of it; the health check used its own.
	if len(logs.find(`"libvirt host connected"`)) < 1 {
		t.Fatal("no libvirt host connected line")
	}
}

// TestContractOverSSH runs the provider contract suite against the production transport.
func TestContractOverSSH(t *testing.T) {
	providertest.RunContract(t, func(t *testing.T) providertest.ContractEnv {
		e := newTestEnv(t, withSSH(), withHosts("ssh1"), withProviderOptions(WithInstallID("install-a")))
		ce := e.contract()
		ce.MalformedID = "hosts/ssh1"
		return ce
	})
}
