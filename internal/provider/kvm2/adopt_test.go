package kvm2

import (
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

func TestCreateIsIdempotentAndAdoptsOwnDomain(t *testing.T) {
	env := newTestEnv(t)
	f := env.fake
	req := testRequest("proxy-eeeeeeeeeeeeeeee")
	first, err := env.p.Create(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	f.ResetCalls()
	second, err := env.p.Create(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if second.ProviderID != first.ProviderID || !second.CreatedAt.Equal(first.CreatedAt) {
		t.Fatalf("second create %+v, first %+v", second, first)
	}
	for _, m := range []string{"DomainDefineXMLFlags", "StorageVolCreateXML", "StorageVolUpload", "DomainCreate"} {
		if n := f.Calls(m); n != 0 {
			t.Errorf("repeat create of a running domain called %s %d times", m, n)
		}
	}
	if len(env.logs.find(`"kvm2 domain already defined"`, req.Name)) != 1 {
		t.Errorf("no kvm2 domain already defined line")
	}
	// Shut off on the host: the repeat Create starts it again.
	if err := f.SetDomainState(req.Name, libvirt.DomainShutoff); err != nil {
		t.Fatal(err)
	}
	if _, err := env.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if s := stateOf(f, req.Name); s != libvirt.DomainRunning {
		t.Fatalf("state after adopting a shut-off domain: %v", s)
	}
	// Crashed and kept: destroyed, then started.
	if err := f.SetDomainState(req.Name, libvirt.DomainCrashed); err != nil {
		t.Fatal(err)
	}
	if _, err := env.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if s := stateOf(f, req.Name); s != libvirt.DomainRunning {
		t.Fatalf("state after adopting a crashed domain: %v", s)
	}
}

func TestCreateAdoptionGuard(t *testing.T) {
	const name = "proxy-ffffffffffffffff"
	cases := []struct {
		name  string
		meta  func(t *testing.T) string
		want  string // "" when adopted
		class error
	}{
		{"no mark", func(*testing.T) string { return "" },
			"domain proxy-ffffffffffffffff on host h1 carries no kvm2 mark; it was not created by this provider", provider.ErrPermanent},
		{"the kvm provider's mark", func(t *testing.T) string { return markFor(t, MetadataURI("kvm"), "uid-"+name) },
			"domain proxy-ffffffffffffffff on host h1 carries no kvm2 mark; it was not created by this provider", provider.ErrPermanent},
		{"another uid", func(t *testing.T) string { return markFor(t, metadataURI, "uid-other") },
			"domain proxy-ffffffffffffffff on host h1 belongs to UID uid-other, not to UID uid-proxy-ffffffffffffffff", provider.ErrPermanent},
		{"corrupt mark", func(*testing.T) string {
			return `<instance xmlns="` + metadataURI + `"><managed>maybe</managed></instance>`
		},
			"domain proxy-ffffffffffffffff on host h1 has corrupt kvm2 metadata", provider.ErrPermanent},
		{"own uid", func(t *testing.T) string { return markFor(t, metadataURI, "uid-"+name) }, "", nil},
		{"empty uid", func(t *testing.T) string { return markFor(t, metadataURI, "") }, "", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := newTestEnv(t)
			defineForeign(t, env.fake, name, c.meta(t), true)
			inst, err := env.p.Create(t.Context(), testRequest(name))
			if c.want == "" {
				if err != nil || inst.UID != "uid-"+name {
					t.Fatalf("adoption: %+v %v", inst, err)
				}
				return
			}
			if provider.Class(err) != c.class || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("got %v (class %s), want %s %q", err, provider.ClassName(err), provider.ClassName(c.class), c.want)
			}
			if n := env.fake.Calls("DomainCreate") + env.fake.Calls("DomainDestroyFlags") + env.fake.Calls("StorageVolCreateXML"); n != 0 {
				t.Fatalf("a refused domain was touched (%d calls)", n)
			}
		})
	}
}

// A domain libvirt is still starting (paused, reason starting up) is what a Create cut off
// during DomainCreate leaves: the retry waits for it instead of failing the Proxy.
func TestCreateWaitsForDomainStartingUp(t *testing.T) {
	env := newTestEnv(t)
	req := testRequest("proxy-1111111111111111")
	if _, err := env.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if err := env.fake.SetDomainStateReason(req.Name, libvirt.DomainPaused, int32(libvirt.DomainPausedStartingUp)); err != nil {
		t.Fatal(err)
	}
	_, err := env.p.Create(t.Context(), req)
	want := "domain proxy-1111111111111111 on host h1 is starting up; waiting for it to settle"
	if provider.Class(err) != provider.ErrTransient || err.Error() != want {
		t.Fatalf("got %v (%s), want transient %q", err, provider.ClassName(err), want)
	}
	if s := stateOf(env.fake, req.Name); s != libvirt.DomainPaused {
		t.Fatalf("the operator changed the starting domain's state to %v", s)
	}
}

func TestCreateRefusesPausedDomain(t *testing.T) {
	for _, st := range []libvirt.DomainState{libvirt.DomainPaused, libvirt.DomainPmsuspended} {
		t.Run(st.String(), func(t *testing.T) {
			env := newTestEnv(t)
			req := testRequest("proxy-1111111111111111")
			if _, err := env.p.Create(t.Context(), req); err != nil {
				t.Fatal(err)
			}
			if err := env.fake.SetDomainState(req.Name, st); err != nil {
				t.Fatal(err)
			}
			_, err := env.p.Create(t.Context(), req)
			want := "domain proxy-1111111111111111 on host h1 is " + st.String() +
				" and cannot be started by the operator; resume or destroy it on the host"
			if provider.Class(err) != provider.ErrPermanent || err.Error() != want {
				t.Fatalf("got %v, want permanent %q", err, want)
			}
			if s := stateOf(env.fake, req.Name); s != st {
				t.Fatalf("the operator changed the paused domain's state to %v", s)
			}
		})
	}
}
