//go:build integration

package kvm2

import (
	"context"
	"encoding/xml"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
)

// itRebootEvents subscribes, on a connection of its own to the host's libvirtd (the local
// socket: the host is this machine), to the reboot events libvirt emits when QEMU resets
// a guest. The subscription is in place when it returns, so no reset after it is missed.
func itRebootEvents(t *testing.T, socket string) <-chan string {
	t.Helper()
	l := libvirt.NewWithDialer(dialers.NewLocal(dialers.WithSocket(socket)))
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		t.Fatalf("connecting to libvirtd on %s to watch reboot events: %v", socket, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	events, err := l.SubscribeEvents(ctx, libvirt.DomainEventIDReboot, libvirt.OptDomain{})
	if err != nil {
		cancel()
		_ = l.Disconnect()
		t.Fatalf("subscribing to reboot events: %v", err)
	}
	names := make(chan string, 16)
	go func() {
		for ev := range events {
			if m, ok := ev.(*libvirt.DomainEventCallbackRebootMsg); ok {
				select {
				case names <- m.Msg.Dom.Name:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = l.Disconnect()
	})
	return names
}

// itWaitReboot waits (up to a minute, far beyond the instant it takes) for libvirt's
// reboot event of domain name.
func itWaitReboot(t *testing.T, events <-chan string, name string) {
	t.Helper()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		select {
		case got := <-events:
			if got == name {
				return
			}
		case <-deadline.C:
			t.Fatalf("no reboot event from libvirt for domain %s within a minute of Reboot", name)
		}
	}
}

// itDomainMAC is the MAC address of the domain's one interface, from virsh dumpxml.
func itDomainMAC(t *testing.T, name string) string {
	t.Helper()
	var dom struct {
		MACs []struct {
			Address string `xml:"address,attr"`
		} `xml:"devices>interface>mac"`
	}
	if err := xml.Unmarshal([]byte(itMustVirsh(t, "dumpxml", name)), &dom); err != nil {
		t.Fatal(err)
	}
	if len(dom.MACs) != 1 || dom.MACs[0].Address == "" {
		t.Fatalf("domain %s has interfaces %+v, want one with a MAC", name, dom.MACs)
	}
	return dom.MACs[0].Address
}

// TestRebootKVM2_realHost: Reboot of a running domain is a reset in place (libvirt reports
// the guest's reboot; the QEMU process, its domain id, UUID, MAC and disks stay); of a
// shut-off domain a start; of another install's domain a permanent refusal that leaves
// it alone; of a deleted domain ErrNotFound. The domain runs the tiny image, so no guest
// boots: the firmware finding nothing to boot is all a reset needs. It runs for both
// types on this code, kvm2 and kvm.
func TestRebootKVM2_realHost(t *testing.T) {
	e := itNewRealEnv(t, "reboot")
	t.Cleanup(e.removeImage)
	for i, typ := range []string{provider.TypeKVM2, provider.TypeKVM} {
		t.Run(typ, func(t *testing.T) { itRebootOfType(t, e, typ, 2*i+1) })
	}
}

// itRebootOfType runs the reboot cases with a provider of type typ on domains vm(n) and
// vm(n+1).
func itRebootOfType(t *testing.T, e *itRealEnv, typ string, n int) {
	p := e.newProvider(itEnvOptions{typ: typ, diskSizeGb: 1, installID: "install-reboot"})
	req := e.request(e.names.vm(n), "uid-reboot-1")
	inst, err := createSettled(itCtxFor(t), p, req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	domID := strings.TrimSpace(itMustVirsh(t, "domid", req.Name))
	uuid := strings.TrimSpace(itMustVirsh(t, "domuuid", req.Name))
	mac := itDomainMAC(t, req.Name)

	t.Run("running", func(t *testing.T) {
		events := itRebootEvents(t, e.host.socket)
		began := time.Now()
		if err := p.Reboot(itCtxFor(t), inst.ProviderID); err != nil {
			t.Fatalf("reboot: %v", err)
		}
		took := time.Since(began)
		itWaitReboot(t, events, req.Name)
		t.Logf("reboot (reset) of a running domain took %s, its reboot event came %s after the call began", took, time.Since(began))
		if s := itDomState(t, req.Name); s != "running" {
			t.Fatalf("after the reboot virsh domstate says %q, want running", s)
		}
		if id := strings.TrimSpace(itMustVirsh(t, "domid", req.Name)); id != domID {
			t.Errorf("domain id %s after the reboot, was %s: the QEMU process was replaced, want a reset in place", id, domID)
		}
		if u := strings.TrimSpace(itMustVirsh(t, "domuuid", req.Name)); u != uuid {
			t.Errorf("uuid %s after the reboot, was %s", u, uuid)
		}
		if m := itDomainMAC(t, req.Name); m != mac {
			t.Errorf("MAC %s after the reboot, was %s", m, mac)
		}
		e.checkGetRunning(t, p, inst.ProviderID, req.UID)
	})

	t.Run("shut off", func(t *testing.T) {
		itMustVirsh(t, "destroy", req.Name)
		began := time.Now()
		if err := p.Reboot(itCtxFor(t), inst.ProviderID); err != nil {
			t.Fatalf("reboot of the shut-off domain: %v", err)
		}
		t.Logf("reboot (start) of a shut-off domain took %s", time.Since(began))
		if s := itDomState(t, req.Name); s != "running" {
			t.Fatalf("after the reboot of the shut-off domain virsh domstate says %q, want running", s)
		}
		if u := strings.TrimSpace(itMustVirsh(t, "domuuid", req.Name)); u != uuid {
			t.Errorf("the reboot replaced the domain (uuid %s, was %s)", u, uuid)
		}
		if m := itDomainMAC(t, req.Name); m != mac {
			t.Errorf("MAC %s after the start, was %s", m, mac)
		}
	})

	t.Run("another install", func(t *testing.T) {
		name := e.names.vm(n + 1)
		m, err := ident.MarshalMark(MetadataURI(typ), ident.Mark{UID: "uid-theirs", CreatedAt: time.Now(), Install: "install-other"})
		if err != nil {
			t.Fatal(err)
		}
		e.defineForeignDomain(t, name, m)
		t.Cleanup(func() { _, _ = itVirsh("undefine", name) })
		err = p.Reboot(itCtxFor(t), ident.ProviderID(integrationHost, name))
		itWantErr(t, err, provider.ErrPermanent, "domain "+name+" on host "+integrationHost+" belongs to install install-other, not to this one")
		if s := itDomState(t, name); s != "shut off" {
			t.Fatalf("another install's domain is %q after a refused reboot, want it untouched (shut off)", s)
		}
	})

	t.Run("deleted", func(t *testing.T) {
		if err := p.Delete(itCtxFor(t), inst.ProviderID); err != nil {
			t.Fatalf("delete: %v", err)
		}
		err := p.Reboot(itCtxFor(t), inst.ProviderID)
		itWantErr(t, err, provider.ErrNotFound, "domain "+req.Name+" not found on host "+integrationHost)
		if itHasDomain(req.Name) {
			t.Fatalf("a reboot of the deleted domain %s defined it again", req.Name)
		}
	})
}
