package kvm2

import (
	"errors"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
)

func createOne(t *testing.T, env *testEnv, name string) provider.Instance {
	t.Helper()
	inst, err := env.p.Create(t.Context(), testRequest(name))
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

func TestGetAddressSources(t *testing.T) {
	agentErr := libvirtfake.Errorf(libvirt.ErrAgentUnresponsive, "QEMU guest agent is not connected")
	agentBroken := libvirtfake.Errorf(libvirt.ErrAgentCommandFailed, "guest-network-get-interfaces failed")
	arpErr := libvirtfake.Errorf(libvirt.ErrInternalError, "arp table unreadable")
	lo := libvirtfake.Interface("lo", "00:00:00:00:00:00", "127.0.0.1/8", "::1/128")
	eth := libvirtfake.Interface("eth0", "52:54:00:12:34:56", "fe80::5054:ff:fe12:3456/64", "192.168.1.73/24")
	cases := []struct {
		name     string
		agent    []libvirt.DomainInterface
		agentErr error
		arp      []libvirt.DomainInterface
		arpErr   error
		wantIP   string
		wantErr  bool
	}{
		{"agent answers, loopback skipped", []libvirt.DomainInterface{lo, eth}, nil, nil, nil, "192.168.1.73", false},
		{"agent down, arp answers", nil, agentErr, []libvirt.DomainInterface{libvirtfake.Interface("vnet0", "52:54:00:12:34:56", "192.168.1.74/0")}, nil, "192.168.1.74", false},
		{"agent only loopback, arp answers", []libvirt.DomainInterface{lo}, nil, []libvirt.DomainInterface{libvirtfake.Interface("vnet0", "", "10.0.0.9/0")}, nil, "10.0.0.9", false},
		{"booting: agent down, arp empty", nil, agentErr, nil, nil, "", false},
		{"booting on a host whose arp table is unreadable", nil, agentErr, nil, arpErr, "", false},
		{"every source fails", nil, agentBroken, nil, arpErr, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := newTestEnv(t)
			inst := createOne(t, env, "proxy-a1a1a1a1a1a1a1a1")
			f := env.fake
			if c.agent != nil || c.agentErr != nil {
				must(0, f.SetInterfaceAddresses(inst.Name, libvirt.DomainInterfaceAddressesSrcAgent, c.agent, c.agentErr))
			}
			must(0, f.SetInterfaceAddresses(inst.Name, libvirt.DomainInterfaceAddressesSrcArp, c.arp, c.arpErr))
			got, err := env.p.Get(t.Context(), inst.ProviderID)
			if c.wantErr {
				if provider.Class(err) != provider.ErrTransient || !strings.Contains(err.Error(), "no address source answered for domain proxy-a1a1a1a1a1a1a1a1 on host h1") {
					t.Fatalf("got %v (class %s), want transient", err, provider.ClassName(err))
				}
				if n := len(env.logs.find(`"no addresses from source"`)); n != 2 {
					t.Fatalf("%d no addresses from source lines, want one per source", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.IP != c.wantIP || got.State != provider.StateRunning || got.UID != "uid-"+inst.Name || got.ProviderID != inst.ProviderID || !got.CreatedAt.Equal(inst.CreatedAt) {
				t.Fatalf("got %+v, want ip %q", got, c.wantIP)
			}
			if len(env.logs.find(`"kvm2 domain fetched"`, `"ip":"`+c.wantIP+`"`, `"uid":"uid-`+inst.Name+`"`, `"state":"Running"`)) != 1 {
				t.Fatal("no kvm2 domain fetched line with state, ip and uid")
			}
		})
	}
}

func TestGetStates(t *testing.T) {
	env := newTestEnv(t)
	inst := createOne(t, env, "proxy-a2a2a2a2a2a2a2a2")
	for _, c := range []struct {
		state libvirt.DomainState
		want  string
	}{
		{libvirt.DomainShutoff, provider.StateStopped},
		{libvirt.DomainPaused, provider.StateStopped},
		{libvirt.DomainRunning, provider.StateRunning},
	} {
		must(0, env.fake.SetDomainState(inst.Name, c.state))
		env.fake.ResetCalls()
		got, err := env.p.Get(t.Context(), inst.ProviderID)
		if err != nil || got.State != c.want {
			t.Fatalf("%v: got %+v %v, want state %s", c.state, got, err, c.want)
		}
		if c.want != provider.StateRunning && env.fake.Calls("DomainInterfaceAddresses") != 0 {
			t.Fatalf("%v: asked for addresses of a domain that is not running", c.state)
		}
		if c.state == libvirt.DomainShutoff && env.fake.Calls("DomainGetState") != 0 {
			t.Fatal("asked for the state of an inactive domain; its id -1 already says shut off")
		}
	}
}

func TestGetErrors(t *testing.T) {
	env := newTestEnv(t)
	createOne(t, env, "proxy-a3a3a3a3a3a3a3a3")
	defineForeign(t, env.fake, "proxy-unmarked", "", true)
	cases := []struct {
		id    string
		class error
		want  string
	}{
		{"hosts/h1/domains/proxy-missing", provider.ErrNotFound, "domain proxy-missing not found on host h1"},
		{"hosts/h1/domains/proxy-unmarked", provider.ErrNotFound, "domain proxy-unmarked on host h1 carries no kvm2 mark"},
		{"hosts/gone/domains/proxy-a3a3a3a3a3a3a3a3", provider.ErrPermanent, `providerID "hosts/gone/domains/proxy-a3a3a3a3a3a3a3a3" names host "gone", which is not in kvm2.hosts`},
		{"proxy-a3a3a3a3a3a3a3a3", provider.ErrPermanent, `malformed providerID "proxy-a3a3a3a3a3a3a3a3"`},
	}
	for _, c := range cases {
		_, err := env.p.Get(t.Context(), c.id)
		if provider.Class(err) != c.class || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("get %s: got %v (class %s), want %s %q", c.id, err, provider.ClassName(err), provider.ClassName(c.class), c.want)
		}
	}
	if len(env.logs.find(`"kvm2 domain not found"`, `"name":"proxy-missing"`)) != 1 {
		t.Error("no kvm2 domain not found line")
	}
	// A transport failure is transient and keeps libvirt's code.
	env.fake.FailNext("DomainGetState", libvirtfake.Errorf(libvirt.ErrInternalError, "boom"))
	_, err := env.p.Get(t.Context(), "hosts/h1/domains/proxy-a3a3a3a3a3a3a3a3")
	if provider.Class(err) != provider.ErrTransient {
		t.Fatalf("got %v", err)
	}
	// A mark that does not parse is permanent.
	defineForeign(t, env.fake, "proxy-corrupt", `<instance xmlns="`+metadataURI+`"><managed>no</managed></instance>`, true)
	_, err = env.p.Get(t.Context(), "hosts/h1/domains/proxy-corrupt")
	if provider.Class(err) != provider.ErrPermanent || !strings.Contains(err.Error(), "corrupt kvm2 metadata") {
		t.Fatalf("corrupt mark: %v", err)
	}
	// The domain vanishing between lookup and the next call is NotFound too.
	env.fake.FailNext("DomainGetMetadata", libvirtfake.Errorf(libvirt.ErrNoDomain, "gone"))
	_, err = env.p.Get(t.Context(), "hosts/h1/domains/proxy-a3a3a3a3a3a3a3a3")
	if !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("vanished mid-get: %v", err)
	}
}
