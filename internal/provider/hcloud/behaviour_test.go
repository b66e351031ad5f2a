package hcloud

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	hc "github.com/hetznercloud/hcloud-go/v2/hcloud"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud/hcloudfake"
)

// TestCreateReportsIPv4AndIPv6: the server's primary IPv4 is the instance's IP and the
// ::1 of its IPv6 /64 its IPv6; the server carries the ownership labels and the user-data
// byte for byte.
func TestCreateReportsIPv4AndIPv6(t *testing.T) {
	e := newEnv(t)
	inst, err := e.p.Create(t.Context(), request("proxy-00000000000000a1", "uid-a1"))
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := e.fake.ServerByName("proxy-00000000000000a1")
	v4, err4 := netip.ParseAddr(inst.IP)
	v6, err6 := netip.ParseAddr(inst.IPv6)
	if err4 != nil || !v4.Is4() || inst.IP != srv.PublicNet.IPv4.IP || err6 != nil || !v6.Is6() {
		t.Fatalf("instance %+v of server %+v: want its IPv4 and an IPv6", inst, srv.PublicNet)
	}
	if network := netip.MustParsePrefix(srv.PublicNet.IPv6.IP); !network.Contains(v6) || v6 != network.Addr().Next() {
		t.Errorf("IPv6 %s is not the ::1 of the server's %s", v6, network)
	}
	want := map[string]string{LabelProvider: testName, LabelInstall: testInstall, LabelUID: "uid-a1", LabelSpecHash: "hash-1"}
	for k, v := range want {
		if srv.Labels[k] != v {
			t.Errorf("label %s=%q, want %q (labels %v)", k, srv.Labels[k], v, srv.Labels)
		}
	}
	if got := e.fake.UserData(srv.ID); got != testUserData {
		t.Errorf("user_data %q, want the request's cloud-init", got)
	}
}

// TestCreateWithoutIPv6: with ipv6 false the server has no IPv6 and the instance none;
// sources mixing the families are refused before any call, naming the field.
func TestCreateWithoutIPv6(t *testing.T) {
	e := newEnv(t, withoutIPv6, withFirewall)
	inst, err := e.p.Create(t.Context(), request("proxy-00000000000000a2", "uid-a2"))
	if err != nil || inst.IP == "" || inst.IPv6 != "" {
		t.Fatalf("create without IPv6: %+v, %v", inst, err)
	}
	req := request("proxy-00000000000000a3", "uid-a3")
	req.SourceRanges = []string{"198.51.100.0/24", "2001:db8:1::/48"}
	calls := len(e.fake.Calls())
	_, err = e.p.Create(t.Context(), req)
	if provider.Class(err) != provider.ErrPermanent || !strings.Contains(err.Error(), "spec.proxy.allowedSourceRanges mixes IPv4 (198.51.100.0/24) and IPv6 (2001:db8:1::/48)") {
		t.Errorf("mixed sources without IPv6: %v", err)
	}
	for _, c := range e.fake.Calls()[calls:] {
		if c.Route == hcloudfake.FirewallsCreate || c.Route == hcloudfake.ServersCreate {
			t.Errorf("%s called for a refused request", c.Route)
		}
	}
}

// TestUserDataLimit: user-data of 32 KiB is sent; one byte more is permanent, naming the
// size and the limit, and nothing is created.
func TestUserDataLimit(t *testing.T) {
	e := newEnv(t)
	req := request("proxy-00000000000000a4", "uid-a4")
	req.CloudInit = []byte("#cloud-config\n" + strings.Repeat("#", provider.HCloudUserDataLimit-len("#cloud-config\n")))
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatalf("create with 32 KiB of user-data: %v", err)
	}
	req = request("proxy-00000000000000a5", "uid-a5")
	req.CloudInit = append(req.CloudInit[:0:0], make([]byte, provider.HCloudUserDataLimit+1)...)
	_, err := e.p.Create(t.Context(), req)
	if provider.Class(err) != provider.ErrPermanent || !strings.Contains(err.Error(), "is 32769 bytes, over Hetzner Cloud's limit of 32768 bytes (32 KiB)") {
		t.Errorf("create with 32 KiB + 1: %v", err)
	}
	if e.serverID(req.Name) != 0 {
		t.Error("a server was made for user-data over the limit")
	}
}

// TestTokenFileReadOnEveryCall: a missing, empty or garbled token file is transient and
// names the field and the path, never the token; a token rotated in the file is used by
// the next call, without a new provider.
func TestTokenFileReadOnEveryCall(t *testing.T) {
	e := newEnv(t)
	id := ProviderID("proxy-00000000000000a6")
	for _, c := range []struct {
		name    string
		content *string
		want    string
	}{
		{"missing", nil, "hcloud.tokenFile " + e.tokenFile + ": no such file or directory"},
		{"empty", new(string), "hcloud.tokenFile " + e.tokenFile + " is empty"},
		{"two lines", ptr("secret-one\nsecret-two\n"), "hcloud.tokenFile " + e.tokenFile + " does not hold one API token"},
	} {
		os.Remove(e.tokenFile)
		if c.content != nil {
			if err := os.WriteFile(e.tokenFile, []byte(*c.content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		_, err := e.p.Get(t.Context(), id)
		if provider.Class(err) != provider.ErrTransient || !strings.Contains(fmt.Sprint(err), c.want) || strings.Contains(fmt.Sprint(err), "secret-") {
			t.Errorf("%s token file: %v, want transient holding %q", c.name, err, c.want)
		}
		if st := e.p.Check(t.Context()); st[0].Reason != reasonTokenUnavailable || !strings.Contains(st[0].Message, c.want) {
			t.Errorf("%s token file: check %+v", c.name, st[0])
		}
	}
	const rotated = "rotated-token-0123456789"
	e.fake.SetTokens(map[string]bool{rotated: true})
	if err := os.WriteFile(e.tokenFile, []byte(hcloudfake.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Get(t.Context(), id); provider.Class(err) != provider.ErrPermanent || !strings.Contains(err.Error(), "unauthorized") {
		t.Errorf("revoked token: %v, want permanent unauthorized", err)
	}
	if err := os.WriteFile(e.tokenFile, []byte(rotated+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Get(t.Context(), id); provider.Class(err) != provider.ErrNotFound {
		t.Errorf("rotated token: %v, want the call through (not found)", err)
	}
}

func ptr[T any](v T) *T { return &v }

// hcFirewallOpts is a firewall of name with labels and no rules, made as someone else would.
func hcFirewallOpts(name string, labels map[string]string) hc.FirewallCreateOpts {
	return hc.FirewallCreateOpts{Name: name, Labels: labels}
}

// TestFirewallPerProxy: with a firewall block each Proxy gets a firewall named after its
// server, labelled like it, admitting the port from the request's sources (else the
// config's), applied at create and deleted with the server; one left without its server
// is listed and collected; one of that name that is not this install's is refused.
func TestFirewallPerProxy(t *testing.T) {
	e := newEnv(t, withFirewall)
	req := request("proxy-00000000000000b1", "uid-b1")
	req.SourceRanges = []string{"198.51.100.0/24", "2001:db8:1::/48"}
	inst, err := e.p.Create(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	var fw *struct {
		rules  []string
		labels map[string]string
	}
	for _, f := range e.fake.Firewalls() {
		if f.Name == req.Name {
			fw = &struct {
				rules  []string
				labels map[string]string
			}{labels: f.Labels}
			for _, r := range f.Rules {
				fw.rules = append(fw.rules, r.Direction+" "+r.Protocol+" "+deref(r.Port)+" "+strings.Join(r.SourceIPs, ","))
			}
			if len(f.AppliedTo) != 1 || f.AppliedTo[0].Server == nil || f.AppliedTo[0].Server.ID != e.serverID(req.Name) {
				t.Errorf("firewall applied to %+v, want the server", f.AppliedTo)
			}
		}
	}
	if fw == nil {
		t.Fatal("no firewall of the server's name")
	}
	if want := []string{"in tcp 3128 198.51.100.0/24,2001:db8:1::/48"}; !slices.Equal(fw.rules, want) {
		t.Errorf("rules %q, want %q", fw.rules, want)
	}
	if fw.labels[LabelServer] != req.Name || fw.labels[LabelUID] != "uid-b1" || fw.labels[LabelInstall] != testInstall {
		t.Errorf("firewall labels %v", fw.labels)
	}
	if err := e.p.Delete(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	if n := len(e.fake.Firewalls()); n != 0 {
		t.Errorf("%d firewalls left after the delete", n)
	}

	// A create whose server is refused leaves its firewall: listed, then collected.
	e.fake.Fail(hcloudfake.ServersCreate, hcloudfake.Failure{Code: "invalid_input"})
	if _, err := e.p.Create(t.Context(), request("proxy-00000000000000b2", "uid-b2")); provider.Class(err) != provider.ErrPermanent {
		t.Fatalf("create answered invalid_input: %v", err)
	}
	list, err := e.p.ListByTag(t.Context())
	if err != nil || len(list) != 1 || list[0].Name != "proxy-00000000000000b2" || list[0].State != provider.StateUnknown || list[0].UID != "uid-b2" {
		t.Fatalf("list with a firewall left: %+v, %v", list, err)
	}
	if err := e.p.Delete(t.Context(), list[0].ProviderID); err != nil || len(e.fake.Firewalls()) != 0 {
		t.Fatalf("delete of the firewall left: %v, %d firewalls", err, len(e.fake.Firewalls()))
	}

	// A firewall of the name that is not this install's is refused, and left alone.
	c, err := e.p.client()
	if err != nil {
		t.Fatal(err)
	}
	other := request("proxy-00000000000000b3", "uid-b3")
	if _, _, err := c.Firewall.Create(t.Context(), hcFirewallOpts(other.Name, map[string]string{LabelProvider: testName, LabelInstall: "install-other"})); err != nil {
		t.Fatal(err)
	}
	_, err = e.p.Create(t.Context(), other)
	if provider.Class(err) != provider.ErrPermanent || !strings.Contains(err.Error(), "firewall proxy-00000000000000b3 exists but is not this install's") {
		t.Errorf("create over another install's firewall: %v", err)
	}
	if err := e.p.Delete(t.Context(), ProviderID(other.Name)); err != nil || len(e.fake.Firewalls()) != 1 {
		t.Errorf("delete next to another install's firewall: %v, %d firewalls (want it left)", err, len(e.fake.Firewalls()))
	}
}

// TestCheck: one status per location, ready with the token valid and a server type
// available; a server type sold out everywhere it is listed, an unknown location or
// server type, a refused token and a limit reached each say so, naming the field.
func TestCheck(t *testing.T) {
	e := newEnv(t)
	st := e.p.Check(t.Context())
	if len(st) != 2 || !st[0].Ready || st[0].Reason != reasonReachable || st[0].Details["servers"] != "0" || st[0].Details["rateLimit"] == "" {
		t.Fatalf("check: %+v", st)
	}
	for _, typ := range []string{"cx23", "cax11"} {
		if err := e.fake.SetAvailable(typ, "nbg1", false); err != nil {
			t.Fatal(err)
		}
	}
	st = e.p.Check(t.Context())
	if !st[0].Ready || st[1].Ready || st[1].Reason != reasonUnavailable || !strings.Contains(st[1].Details["serverType.cx23"], "not available in nbg1") {
		t.Errorf("check with nbg1 sold out: %+v", st)
	}

	bad := newEnv(t, func(c *provider.HCloudConfig) {
		c.Locations = []string{"fsn1", "xyz1"}
		c.Limits = &provider.HCloudLimits{Servers: 1}
	})
	st = bad.p.Check(t.Context())
	if st[1].Reason != reasonLocationUnknown || !strings.Contains(st[1].Message, `hcloud.locations[1] "xyz1" is not a location the API knows`) {
		t.Errorf("unknown location: %+v", st[1])
	}
	if _, err := bad.p.Create(t.Context(), request("proxy-00000000000000c1", "uid-c1")); err != nil {
		t.Fatal(err)
	}
	if st = bad.p.Check(t.Context()); st[0].Ready || st[0].Reason != reasonQuotaExhausted || st[0].Details["servers"] != "1/1" {
		t.Errorf("at the servers limit: %+v", st[0])
	}

	types := newEnv(t, func(c *provider.HCloudConfig) { c.ServerTypes = []string{"cx23", "cx99"} })
	if st = types.p.Check(t.Context()); st[0].Reason != reasonServerTypeUnknown || !strings.Contains(st[0].Message, `hcloud.serverTypes[1] "cx99"`) {
		t.Errorf("unknown server type: %+v", st[0])
	}

	e.fake.SetTokens(map[string]bool{"another": true})
	if st = e.p.Check(t.Context()); st[0].Ready || st[0].Reason != reasonUnauthorized || !strings.Contains(st[0].Message, "hcloud.tokenFile") {
		t.Errorf("refused token: %+v", st[0])
	}
}

// TestCallsPerOperation: the requests each call makes, actions finishing at their second
// poll (the fake's default): what the docs' Limits section counts against the API's
// hourly rate limit.
func TestCallsPerOperation(t *testing.T) {
	for _, c := range []struct {
		name                                  string
		opts                                  []envOption
		create, repeat, delete, check, listed int
	}{
		{"without firewall", nil, 6, 1, 5, 5, 2},
		{"with firewall", []envOption{withFirewall}, 10, 1, 6, 5, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.opts...)
			count := func(fn func()) int {
				before := len(e.fake.Calls())
				fn()
				return len(e.fake.Calls()) - before
			}
			var inst provider.Instance
			var err error
			got := []int{
				count(func() { inst, err = e.p.Create(t.Context(), request("proxy-00000000000000f1", "uid-f1")) }),
				count(func() { _, _ = e.p.Create(t.Context(), request("proxy-00000000000000f1", "uid-f1")) }),
				count(func() { _ = e.p.Delete(t.Context(), inst.ProviderID) }),
				count(func() { e.p.Check(t.Context()) }),
				count(func() { _, _ = e.p.ListByTag(t.Context()) }),
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := []int{c.create, c.repeat, c.delete, c.check, c.listed}; !slices.Equal(got, want) {
				t.Errorf("requests of create, repeat create, delete, check, list: %v, want %v", got, want)
			}
		})
	}
}

// TestUnknownCatalogueEntriesAtCreate: a server type or location in the catalogue that
// the API does not know fails the Proxy at create, permanently, naming the API's field
// and the Proxy's and config's fields it stands for.
func TestUnknownCatalogueEntriesAtCreate(t *testing.T) {
	e := newEnv(t, func(c *provider.HCloudConfig) {
		c.ServerTypes = append(c.ServerTypes, "cx99")
		c.Locations = append(c.Locations, "xyz1")
	})
	req := request("proxy-00000000000000a7", "uid-a7")
	req.Placement.MachineType = "cx99"
	_, err := e.p.Create(t.Context(), req)
	if provider.Class(err) != provider.ErrPermanent || !strings.Contains(fmt.Sprint(err), "field server_type (placement.machineType (hcloud.serverTypes))") {
		t.Errorf("create with an unknown server type: %v", err)
	}
	req = request("proxy-00000000000000a8", "uid-a8")
	req.Placement.Zone = "xyz1"
	_, err = e.p.Create(t.Context(), req)
	if provider.Class(err) != provider.ErrPermanent || !strings.Contains(fmt.Sprint(err), "field location (placement.zone (hcloud.locations))") {
		t.Errorf("create in an unknown location: %v", err)
	}
}

// TestAdoptPutsTheFirewallBack: a repeat Create of a server whose firewall was deleted
// behind the provider's back makes the firewall again and applies it; one whose firewall
// is there costs no firewall call.
func TestAdoptPutsTheFirewallBack(t *testing.T) {
	e := newEnv(t, withFirewall)
	req := request("proxy-00000000000000b4", "uid-b4")
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	before := len(e.fake.Calls())
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	for _, c := range e.fake.Calls()[before:] {
		if strings.Contains(c.Route, "/firewalls") {
			t.Errorf("a repeat Create of a server with its firewall called %s", c.Route)
		}
	}
	fws := e.fake.Firewalls()
	if len(fws) != 1 {
		t.Fatalf("%d firewalls, want 1", len(fws))
	}
	e.fake.RemoveFirewall(fws[0].ID)
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatalf("repeat create after the firewall was deleted: %v", err)
	}
	srv, _ := e.fake.ServerByName(req.Name)
	fws = e.fake.Firewalls()
	if len(fws) != 1 || fws[0].Name != req.Name || len(srv.PublicNet.Firewalls) != 1 || srv.PublicNet.Firewalls[0].ID != fws[0].ID {
		t.Errorf("after the repeat create: firewalls %+v, server's %+v; want the firewall made again and applied", fws, srv.PublicNet.Firewalls)
	}
}
