package hcloudfake

import (
	"bytes"
	"encoding/json"
	"net"
	"testing"

	"github.com/hetznercloud/hcloud-go/v2/hcloud"
	"github.com/hetznercloud/hcloud-go/v2/hcloud/schema"
)

func cidr(t *testing.T, s string) net.IPNet {
	t.Helper()
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return *n
}

func serverRes(id int64) hcloud.FirewallResource {
	return hcloud.FirewallResource{Type: hcloud.FirewallResourceTypeServer, Server: &hcloud.FirewallResourceServer{ID: id}}
}

// TestFirewallLifecycle: create with rules of both families, labels and a server; the
// server shows it pending, then applied; list by label; set_rules; apply twice is
// firewall_already_applied; delete while applied is resource_in_use; remove, then
// delete.
func TestFirewallLifecycle(t *testing.T) {
	_, c := fake(t)
	sv := mustCreate(t, c, "guarded", nil)
	port := "3128"
	res, _, err := c.Firewall.Create(t.Context(), hcloud.FirewallCreateOpts{
		Name: "proxy-fw", Labels: map[string]string{"install": "a", "proxy-uid": "u1"},
		Rules: []hcloud.FirewallRule{{Direction: hcloud.FirewallRuleDirectionIn, Protocol: hcloud.FirewallRuleProtocolTCP, Port: &port,
			SourceIPs: []net.IPNet{cidr(t, "198.51.100.0/24"), cidr(t, "2001:db8:ffff::/48")}}},
		ApplyTo: []hcloud.FirewallResource{serverRes(sv.ID)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Actions) != 2 || res.Actions[0].Command != "set_firewall_rules" || res.Actions[1].Command != "apply_firewall" {
		t.Fatalf("create actions %+v", res.Actions)
	}
	got, _, _ := c.Server.GetByID(t.Context(), sv.ID)
	if len(got.PublicNet.Firewalls) != 1 || got.PublicNet.Firewalls[0].Status != hcloud.FirewallStatusPending {
		t.Errorf("server's firewalls while applying: %+v", got.PublicNet.Firewalls)
	}
	if err := c.Action.WaitFor(t.Context(), res.Actions...); err != nil {
		t.Fatal(err)
	}
	got, _, _ = c.Server.GetByID(t.Context(), sv.ID)
	if len(got.PublicNet.Firewalls) != 1 || got.PublicNet.Firewalls[0].Status != hcloud.FirewallStatusApplied || got.PublicNet.Firewalls[0].Firewall.ID != res.Firewall.ID {
		t.Errorf("server's firewalls after: %+v", got.PublicNet.Firewalls)
	}
	list, err := c.Firewall.AllWithOpts(t.Context(), hcloud.FirewallListOpts{ListOpts: hcloud.ListOpts{LabelSelector: "install=a,proxy-uid"}})
	if err != nil || len(list) != 1 || len(list[0].Rules) != 1 || len(list[0].Rules[0].SourceIPs) != 2 || *list[0].Rules[0].Port != "3128" {
		t.Fatalf("list by label: %+v, %v", list, err)
	}
	if list, _ := c.Firewall.AllWithOpts(t.Context(), hcloud.FirewallListOpts{ListOpts: hcloud.ListOpts{LabelSelector: "install=b"}}); len(list) != 0 {
		t.Errorf("install=b listed %d", len(list))
	}
	fw := res.Firewall
	actions, _, err := c.Firewall.SetRules(t.Context(), fw, hcloud.FirewallSetRulesOpts{Rules: []hcloud.FirewallRule{
		{Direction: hcloud.FirewallRuleDirectionIn, Protocol: hcloud.FirewallRuleProtocolICMP, SourceIPs: []net.IPNet{cidr(t, "0.0.0.0/0"), cidr(t, "::/0")}}}})
	if err != nil || len(actions) != 2 {
		t.Fatalf("set_rules: %+v, %v", actions, err)
	}
	if err := c.Action.WaitFor(t.Context(), actions...); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Firewall.ApplyResources(t.Context(), fw, []hcloud.FirewallResource{serverRes(sv.ID)}); !hcloud.IsError(err, hcloud.ErrorCodeFirewallAlreadyApplied) {
		t.Errorf("apply twice: %v", err)
	}
	if _, _, err := c.Firewall.ApplyResources(t.Context(), fw, []hcloud.FirewallResource{serverRes(999)}); !hcloud.IsError(err, hcloud.ErrorCodeFirewallResourceNotFound) {
		t.Errorf("apply to no server: %v", err)
	}
	if _, err := c.Firewall.Delete(t.Context(), fw); !hcloud.IsError(err, hcloud.ErrorCodeResourceInUse) {
		t.Errorf("delete while applied: %v", err)
	}
	actions, _, err = c.Firewall.RemoveResources(t.Context(), fw, []hcloud.FirewallResource{serverRes(sv.ID)})
	if err != nil || len(actions) != 1 || actions[0].Command != "remove_firewall" {
		t.Fatalf("remove: %+v, %v", actions, err)
	}
	if err := c.Action.WaitFor(t.Context(), actions...); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Firewall.RemoveResources(t.Context(), fw, []hcloud.FirewallResource{serverRes(sv.ID)}); !hcloud.IsError(err, hcloud.ErrorCodeFirewallResourceNotFound) {
		t.Errorf("remove twice: %v", err)
	}
	if _, err := c.Firewall.Delete(t.Context(), fw); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if f, _, err := c.Firewall.GetByID(t.Context(), fw.ID); f != nil || err != nil {
		t.Errorf("after delete: %v, %v", f, err)
	}
}

// TestFirewallByLabelSelector: a firewall applied by label selector covers the servers
// whose labels match, now and later, and shows them under applied_to_resources.
func TestFirewallByLabelSelector(t *testing.T) {
	s, c := fake(t)
	s.SetActionPolls(0)
	a := mustCreate(t, c, "a", map[string]string{"pool": "p1"})
	mustCreate(t, c, "b", map[string]string{"pool": "p2"})
	res, _, err := c.Firewall.Create(t.Context(), hcloud.FirewallCreateOpts{Name: "pool-fw", ApplyTo: []hcloud.FirewallResource{{
		Type: hcloud.FirewallResourceTypeLabelSelector, LabelSelector: &hcloud.FirewallResourceLabelSelector{Selector: "pool=p1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	later := mustCreate(t, c, "c", map[string]string{"pool": "p1"})
	f, _, _ := c.Firewall.GetByID(t.Context(), res.Firewall.ID)
	if len(f.AppliedTo) != 1 || f.AppliedTo[0].Type != hcloud.FirewallResourceTypeLabelSelector || len(f.AppliedTo[0].AppliedToResources) != 2 ||
		f.AppliedTo[0].AppliedToResources[0].Server.ID != a.ID || f.AppliedTo[0].AppliedToResources[1].Server.ID != later.ID {
		t.Errorf("applied_to %+v", f.AppliedTo)
	}
	if _, _, err := c.Firewall.RemoveResources(t.Context(), res.Firewall, []hcloud.FirewallResource{serverRes(a.ID)}); !hcloud.IsError(err, hcloud.ErrorCodeFirewallManagedByLabelSelector) {
		t.Errorf("removing a server the selector covers: %v", err)
	}
	for name, want := range map[string]int{"a": 1, "b": 0, "c": 1} {
		sv, _, _ := c.Server.GetByName(t.Context(), name)
		if len(sv.PublicNet.Firewalls) != want {
			t.Errorf("%s has %d firewalls, want %d", name, len(sv.PublicNet.Firewalls), want)
		}
	}
}

// rawCreate posts a firewall body the typed client cannot express (an address without
// a prefix length), through the official client's request path.
func rawCreate(t *testing.T, c *hcloud.Client, rules []schema.FirewallRuleRequest) error {
	t.Helper()
	body, _ := json.Marshal(schema.FirewallCreateRequest{Name: "raw", Rules: rules})
	req, err := c.NewRequest(t.Context(), "POST", "/firewalls", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Do(req, nil)
	return err
}

// TestFirewallRulesValidated: each malformed rule is invalid_input naming rules[i].field.
func TestFirewallRulesValidated(t *testing.T) {
	p := func(s string) *string { return &s }
	any4 := []string{"0.0.0.0/0"}
	for _, tc := range []struct {
		name  string
		rule  schema.FirewallRuleRequest
		field string
	}{
		{"direction", schema.FirewallRuleRequest{Direction: "sideways", Protocol: "tcp", Port: p("80"), SourceIPs: any4}, "rules[0].direction"},
		{"protocol", schema.FirewallRuleRequest{Direction: "in", Protocol: "sctp", Port: p("80"), SourceIPs: any4}, "rules[0].protocol"},
		{"tcp without port", schema.FirewallRuleRequest{Direction: "in", Protocol: "tcp", SourceIPs: any4}, "rules[0].port"},
		{"port 0", schema.FirewallRuleRequest{Direction: "in", Protocol: "udp", Port: p("0"), SourceIPs: any4}, "rules[0].port"},
		{"port 65536", schema.FirewallRuleRequest{Direction: "in", Protocol: "udp", Port: p("65536"), SourceIPs: any4}, "rules[0].port"},
		{"descending range", schema.FirewallRuleRequest{Direction: "in", Protocol: "tcp", Port: p("90-80"), SourceIPs: any4}, "rules[0].port"},
		{"port on icmp", schema.FirewallRuleRequest{Direction: "in", Protocol: "icmp", Port: p("80"), SourceIPs: any4}, "rules[0].port"},
		{"in without sources", schema.FirewallRuleRequest{Direction: "in", Protocol: "tcp", Port: p("80")}, "rules[0].source_ips"},
		{"in with destinations", schema.FirewallRuleRequest{Direction: "in", Protocol: "tcp", Port: p("80"), SourceIPs: any4, DestinationIPs: any4}, "rules[0].destination_ips"},
		{"out with sources", schema.FirewallRuleRequest{Direction: "out", Protocol: "tcp", Port: p("80"), SourceIPs: any4, DestinationIPs: any4}, "rules[0].source_ips"},
		{"address without prefix", schema.FirewallRuleRequest{Direction: "in", Protocol: "tcp", Port: p("80"), SourceIPs: []string{"198.51.100.7"}}, "rules[0].source_ips"},
		{"not an address", schema.FirewallRuleRequest{Direction: "in", Protocol: "tcp", Port: p("80"), SourceIPs: []string{"::/0", "example.com/32"}}, "rules[0].source_ips"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, c := fake(t)
			err := rawCreate(t, c, []schema.FirewallRuleRequest{tc.rule})
			if !hcloud.IsError(err, hcloud.ErrorCodeInvalidInput) {
				t.Fatalf("got %v", err)
			}
			if f := fieldsOf(t, err); len(f[tc.field]) == 0 {
				t.Errorf("details %v name no %s", f, tc.field)
			}
			if len(s.Firewalls()) != 0 {
				t.Error("a firewall was made")
			}
		})
	}
	t.Run("good ones", func(t *testing.T) {
		_, c := fake(t)
		err := rawCreate(t, c, []schema.FirewallRuleRequest{
			{Direction: "in", Protocol: "tcp", Port: p("1024-5000"), SourceIPs: []string{"10.0.0.0/8", "fd00::/8"}},
			{Direction: "in", Protocol: "udp", Port: p("any"), SourceIPs: []string{"::/0"}},
			{Direction: "out", Protocol: "gre", DestinationIPs: []string{"0.0.0.0/0"}},
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("too many", func(t *testing.T) {
		_, c := fake(t)
		rules := make([]schema.FirewallRuleRequest, MaxFirewallRules+1)
		for i := range rules {
			rules[i] = schema.FirewallRuleRequest{Direction: "in", Protocol: "icmp", SourceIPs: any4}
		}
		if err := rawCreate(t, c, rules); !hcloud.IsError(err, hcloud.ErrorCodeInvalidInput) {
			t.Fatalf("%d rules: %v", len(rules), err)
		}
	})
}

// TestFirewallNamesAndLock: a firewall name is unique; a second rules change while the
// first runs is locked.
func TestFirewallNamesAndLock(t *testing.T) {
	s, c := fake(t)
	s.SetActionPolls(20)
	res, _, err := c.Firewall.Create(t.Context(), hcloud.FirewallCreateOpts{Name: "fw", Rules: []hcloud.FirewallRule{
		{Direction: hcloud.FirewallRuleDirectionIn, Protocol: hcloud.FirewallRuleProtocolICMP, SourceIPs: []net.IPNet{cidr(t, "0.0.0.0/0")}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Firewall.Create(t.Context(), hcloud.FirewallCreateOpts{Name: "fw"}); !hcloud.IsError(err, hcloud.ErrorCodeUniquenessError) {
		t.Errorf("second fw: %v", err)
	}
	if _, _, err := c.Firewall.SetRules(t.Context(), res.Firewall, hcloud.FirewallSetRulesOpts{}); !hcloud.IsError(err, hcloud.ErrorCodeLocked) {
		t.Errorf("set_rules while set_firewall_rules runs: %v", err)
	}
	if err := c.Action.WaitFor(t.Context(), res.Actions...); err != nil {
		t.Fatal(err)
	}
	f, _, err := c.Firewall.Update(t.Context(), res.Firewall, hcloud.FirewallUpdateOpts{Name: "fw2", Labels: map[string]string{"k": "v"}})
	if err != nil || f.Name != "fw2" || f.Labels["k"] != "v" {
		t.Errorf("update: %+v, %v", f, err)
	}
}

// TestCreateWithFirewallAndAddresses: a server created with a firewall has an
// apply_firewall next action and shows the firewall applied; SetIPv4Address and
// SetIPv6Network set the addresses of the servers created after.
func TestCreateWithFirewallAndAddresses(t *testing.T) {
	s, c := fake(t)
	fw, _, err := c.Firewall.Create(t.Context(), hcloud.FirewallCreateOpts{Name: "fw"})
	if err != nil {
		t.Fatal(err)
	}
	s.SetIPv4Address("127.0.0.1")
	s.SetIPv6Network("fd00:1::/64")
	res, _, err := c.Server.Create(t.Context(), hcloud.ServerCreateOpts{Name: "local", ServerType: &hcloud.ServerType{Name: "cx23"},
		Image: &hcloud.Image{Name: "debian-13"}, Firewalls: []*hcloud.ServerCreateFirewall{{Firewall: *fw.Firewall}}})
	if err != nil {
		t.Fatal(err)
	}
	var commands []string
	for _, a := range res.NextActions {
		commands = append(commands, a.Command)
	}
	if len(commands) != 2 || commands[0] != "start_server" || commands[1] != "apply_firewall" {
		t.Errorf("next actions %v", commands)
	}
	if err := c.Action.WaitFor(t.Context(), append([]*hcloud.Action{res.Action}, res.NextActions...)...); err != nil {
		t.Fatal(err)
	}
	sv, _, _ := c.Server.GetByID(t.Context(), res.Server.ID)
	if sv.PublicNet.IPv4.IP.String() != "127.0.0.1" || sv.PublicNet.IPv6.Network.String() != "fd00:1::/64" ||
		len(sv.PublicNet.Firewalls) != 1 || sv.PublicNet.Firewalls[0].Status != hcloud.FirewallStatusApplied {
		t.Errorf("public net %+v, firewalls %+v", sv.PublicNet, sv.PublicNet.Firewalls)
	}
	f, _, _ := c.Firewall.GetByID(t.Context(), fw.Firewall.ID)
	if len(f.AppliedTo) != 1 || f.AppliedTo[0].Server.ID != sv.ID {
		t.Errorf("applied_to %+v", f.AppliedTo)
	}
}
