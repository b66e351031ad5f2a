package gce

import (
	"slices"
	"strings"
	"testing"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/gcefake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
)

// withDualFirewall makes the provider manage rules, admitting 192.0.2.0/24 and
// 2001:db8:ff::/48 by default.
func withDualFirewall(c *provider.GCEConfig) {
	c.Firewall = &provider.GCEFirewall{SourceRanges: []string{"192.0.2.0/24", "2001:db8:ff::/48"}}
}

// sortedRanges are fw's source ranges, sorted; nil for a missing rule.
func sortedRanges(fw *computepb.Firewall) []string {
	if fw == nil {
		return nil
	}
	return slices.Sorted(slices.Values(fw.GetSourceRanges()))
}

// checkRules fails unless the fake holds exactly the rules of want (name: sorted ranges),
// each admitting TCP 3128 to tag from this install, for the Proxy uid.
func checkRules(t *testing.T, e *env, tag, uid string, want map[string][]string) {
	t.Helper()
	var names []string
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	if got := e.fake.FirewallNames(); !slices.Equal(got, names) {
		t.Errorf("rules %v, want %v", got, names)
	}
	for n, ranges := range want {
		fw := e.fake.Firewall(n)
		if fw == nil {
			continue
		}
		if got := sortedRanges(fw); !slices.Equal(got, ranges) {
			t.Errorf("rule %s admits %v, want %v", n, got, ranges)
		}
		f := firewallFields(fw.GetDescription())
		if !slices.Equal(fw.GetTargetTags(), []string{tag}) || f["install"] != testInstall || f["uid"] != uid ||
			fw.GetDirection() != "INGRESS" || len(fw.GetAllowed()) != 1 || !slices.Equal(fw.GetAllowed()[0].GetPorts(), []string{"3128"}) ||
			!strings.HasSuffix(fw.GetNetwork(), "global/networks/proxies") {
			t.Errorf("rule %s: %v; want TCP 3128 to tag %s on network proxies, marked as this install's for %s", n, fw, tag, uid)
		}
	}
}

// TestDualStackRulesPerFamily: on a dual-stack provider the allowed sources are split by
// family, since GCE holds one family per rule: the IPv4 ranges go to the rule of the VM's
// name and the IPv6 ones to <name>-v6, both on the VM's tag with the same description;
// sources of one family make one rule; the config's ranges are split the same way; Delete
// removes both.
func TestDualStackRulesPerFamily(t *testing.T) {
	for _, c := range []struct {
		name    string
		sources []string
		want    map[string][]string
	}{
		{"both families", []string{"198.51.100.0/24", "2001:db8:1::/48", "192.0.2.0/24"}, map[string][]string{
			"proxy-00000000000000e1":    {"192.0.2.0/24", "198.51.100.0/24"},
			"proxy-00000000000000e1-v6": {"2001:db8:1::/48"}}},
		{"IPv4 only", []string{"198.51.100.0/24"}, map[string][]string{
			"proxy-00000000000000e1": {"198.51.100.0/24"}}},
		{"IPv6 only", []string{"2001:db8:1::/48", "::/0"}, map[string][]string{
			"proxy-00000000000000e1-v6": {"2001:db8:1::/48", "::/0"}}},
		{"the config's", nil, map[string][]string{
			"proxy-00000000000000e1":    {"192.0.2.0/24"},
			"proxy-00000000000000e1-v6": {"2001:db8:ff::/48"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newDualEnv(t, true, withDualFirewall)
			req := request("proxy-00000000000000e1", "uid-e1")
			req.SourceRanges = c.sources
			inst, err := e.p.Create(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			if inst.IPv6 == "" {
				t.Errorf("instance %+v has no IPv6 address", inst)
			}
			if tags := e.fake.Instance(testZone, req.Name).GetTags().GetItems(); !slices.Contains(tags, req.Name) {
				t.Errorf("instance tags %v lack %s, the tag both rules target", tags, req.Name)
			}
			checkRules(t, e, req.Name, req.UID, c.want)
			if err := e.p.Delete(t.Context(), inst.ProviderID); err != nil {
				t.Fatal(err)
			}
			if n := e.fake.FirewallNames(); len(n) != 0 {
				t.Errorf("rules %v left after Delete", n)
			}
		})
	}
}

// TestIPv4OnlyProviderKeepsOneRule: without stackType IPV4_IPV6 a Proxy gets the one rule
// of its name, and allowed sources mixing families are still refused (permanently,
// naming the field and pointing at stackType), since its VM has no IPv6 address.
func TestIPv4OnlyProviderKeepsOneRule(t *testing.T) {
	e := newEnv(t, withFirewall)
	req := request("proxy-00000000000000e2", "uid-e2")
	req.SourceRanges = []string{"198.51.100.0/24"}
	inst, err := e.p.Create(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.fake.FirewallNames(); !slices.Equal(got, []string{req.Name}) {
		t.Errorf("rules %v, want only %s", got, req.Name)
	}
	if err := e.p.Delete(t.Context(), inst.ProviderID); err != nil || e.fake.Firewalls() != 0 {
		t.Errorf("delete: %v, %d rules left", err, e.fake.Firewalls())
	}
	req.SourceRanges = []string{"198.51.100.0/24", "2001:db8::/32"}
	_, err = e.p.Create(t.Context(), req)
	if provider.Class(err) != provider.ErrPermanent || !strings.Contains(err.Error(), "firewall rule "+req.Name+": spec.proxy.allowedSourceRanges mixes IPv4") ||
		!strings.Contains(err.Error(), "set gce.stackType IPV4_IPV6") {
		t.Errorf("mixed sources on an IPv4-only provider: %v", err)
	}
}

// TestDualStackRangeChangeTouchesItsFamily: a VM replaced for new allowed sources keeps
// the rule of the family whose ranges did not change (the same rule, never deleted) and
// gets the other made anew; a family whose ranges are gone loses its rule, and one that
// comes back gets it again.
func TestDualStackRangeChangeTouchesItsFamily(t *testing.T) {
	e := newDualEnv(t, true, withDualFirewall)
	req := request("proxy-00000000000000e3", "uid-e3")
	v4, v6 := req.Name, req.Name+ipv6RuleSuffix
	create := func(hash string, sources ...string) {
		t.Helper()
		req.SpecHash, req.SourceRanges = hash, sources
		if _, err := e.p.Create(t.Context(), req); err != nil {
			t.Fatalf("create for %v: %v", sources, err)
		}
	}
	create("hash-1", "198.51.100.0/24", "2001:db8:1::/48")
	made := e.fake.Firewall(v4).GetCreationTimestamp()

	create("hash-2", "198.51.100.0/24", "2001:db8:2::/48")
	checkRules(t, e, req.Name, req.UID, map[string][]string{v4: {"198.51.100.0/24"}, v6: {"2001:db8:2::/48"}})
	if e.fake.Firewall(v4).GetCreationTimestamp() != made {
		t.Error("the IPv4 rule was made anew although its ranges did not change")
	}
	if got := deletedRules(e); !slices.Equal(got, []string{v6}) {
		t.Errorf("rules deleted %v, want only the IPv6 one", got)
	}

	create("hash-3", "198.51.100.0/24")
	checkRules(t, e, req.Name, req.UID, map[string][]string{v4: {"198.51.100.0/24"}})

	create("hash-4", "192.0.2.0/24", "2001:db8:3::/48")
	checkRules(t, e, req.Name, req.UID, map[string][]string{v4: {"192.0.2.0/24"}, v6: {"2001:db8:3::/48"}})
}

// deletedRules names the rules the provider sent a delete for, in order.
func deletedRules(e *env) []string {
	var out []string
	for _, c := range e.fake.Calls() {
		if c.Method == gcefake.FirewallsDelete {
			out = append(out, c.Path[strings.LastIndex(c.Path, "/")+1:])
		}
	}
	return out
}

// TestDualStackLeftoverRulesListedOnce: an insert refused after both rules were made
// leaves them; ListByTag lists them as one entry of the VM's name and UID (not one per
// rule, and never under the -v6 name), and Delete of that entry removes both.
func TestDualStackLeftoverRulesListedOnce(t *testing.T) {
	e := newDualEnv(t, true, withDualFirewall)
	req := request("proxy-00000000000000e4", "uid-e4")
	e.fake.Fail(gcefake.InstancesInsert, gcefake.ShapeNamed("sync 400 invalid"))
	if _, err := e.p.Create(t.Context(), req); err == nil {
		t.Fatal("create succeeded with the insert failing")
	}
	if e.fake.Firewalls() != 2 {
		t.Fatalf("rules %v, want both families' made before the insert", e.fake.FirewallNames())
	}
	list, err := e.p.ListByTag(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != req.Name || list[0].UID != req.UID || list[0].State != provider.StateUnknown ||
		list[0].ProviderID != ident.ProviderID(testProject, testZone, req.Name) {
		t.Fatalf("list %+v: want one entry for the rules left by the failed insert", list)
	}
	if err := e.p.Delete(t.Context(), list[0].ProviderID); err != nil {
		t.Fatal(err)
	}
	if n := e.fake.FirewallNames(); len(n) != 0 {
		t.Errorf("rules %v left after Delete", n)
	}

	// An IPv6 rule alone (its IPv4 one deleted by hand) is listed under the VM's name too.
	e.fake.Fail(gcefake.InstancesInsert, gcefake.ShapeNamed("sync 400 invalid"))
	if _, err := e.p.Create(t.Context(), req); err == nil {
		t.Fatal("create succeeded with the insert failing")
	}
	e.fake.DeleteFirewall(req.Name)
	if list, err := e.p.ListByTag(t.Context()); err != nil || len(list) != 1 || list[0].Name != req.Name {
		t.Fatalf("list %+v, %v: want the IPv6 rule listed under %s", list, err, req.Name)
	}
}

// TestDualStackRulesOfAnIPv4OnlyPast: rules made while the provider was dual-stack are
// still removed by Delete and collected from the listing after the config went back to
// IPv4 only.
func TestDualStackRulesOfAnIPv4OnlyPast(t *testing.T) {
	e := newEnv(t, withFirewall)
	desc := e.p.firewallDescription(testZone, "uid-e5")
	for _, n := range []string{"proxy-00000000000000e5", "proxy-00000000000000e5-v6", "proxy-00000000000000e6-v6"} {
		e.fake.PutFirewall(&computepb.Firewall{Name: proto.String(n), Description: proto.String(desc), TargetTags: []string{n}})
	}
	list, err := e.p.ListByTag(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, in := range list {
		names = append(names, in.Name)
	}
	if !slices.Equal(names, []string{"proxy-00000000000000e5", "proxy-00000000000000e6"}) {
		t.Fatalf("listed %v, want one entry per VM name", names)
	}
	for _, in := range list {
		if err := e.p.Delete(t.Context(), in.ProviderID); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.fake.FirewallNames(); len(n) != 0 {
		t.Errorf("rules %v left", n)
	}
}

// TestDualStackForeignIPv6RuleIsRefused: a rule of the IPv6 rule's name that is not this
// install's is never touched; Create fails permanently naming it, before any VM is made.
func TestDualStackForeignIPv6RuleIsRefused(t *testing.T) {
	e := newDualEnv(t, true, withDualFirewall)
	req := request("proxy-00000000000000e7", "uid-e7")
	e.fake.PutFirewall(&computepb.Firewall{Name: proto.String(req.Name + ipv6RuleSuffix), Description: proto.String("opened by hand"),
		SourceRanges: []string{"::/0"}})
	_, err := e.p.Create(t.Context(), req)
	if provider.Class(err) != provider.ErrPermanent || !strings.Contains(err.Error(), "firewall rule "+req.Name+"-v6 exists") ||
		!strings.Contains(err.Error(), "not this install's") {
		t.Errorf("create over a foreign IPv6 rule: %v", err)
	}
	if e.fake.Instances() != 0 {
		t.Error("an instance was made")
	}
	if fw := e.fake.Firewall(req.Name + ipv6RuleSuffix); fw.GetDescription() != "opened by hand" {
		t.Errorf("the foreign rule was touched: %v", fw)
	}
}

// TestDualStackPoolChildrenShareTwoRules: a dual-stack pool's children share one rule per
// family, both targeting the shared rule's tag, which go with the last child and, left
// over, are listed as one entry and collected together.
func TestDualStackPoolChildrenShareTwoRules(t *testing.T) {
	e := newDualEnv(t, true, withDualFirewall)
	var ids []string
	for _, n := range []string{"proxy-00000000000000e8", "proxy-00000000000000e9"} {
		req := child(n, "uid-"+n)
		req.SourceRanges = []string{"198.51.100.0/24", "2001:db8:1::/48"}
		inst, err := e.p.Create(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, inst.ProviderID)
	}
	names := e.fake.FirewallNames()
	if len(names) != 2 || !isPoolRule(names[0]) || names[1] != names[0]+ipv6RuleSuffix {
		t.Fatalf("rules %v, want a shared rule and its -v6 one", names)
	}
	shared := names[0]
	for n, want := range map[string][]string{shared: {"198.51.100.0/24"}, shared + ipv6RuleSuffix: {"2001:db8:1::/48"}} {
		fw := e.fake.Firewall(n)
		if !slices.Equal(sortedRanges(fw), want) || !slices.Equal(fw.GetTargetTags(), []string{shared}) ||
			!strings.Contains(fw.GetDescription(), "pool=crawl/eu uid=pool-uid-1") {
			t.Errorf("rule %s: %v; want %v to tag %s, marked as the pool's", n, fw, want, shared)
		}
	}
	if err := e.p.Delete(t.Context(), ids[0]); err != nil || e.fake.Firewalls() != 2 {
		t.Fatalf("after the first child's delete (%v): rules %v, want both kept", err, e.fake.FirewallNames())
	}
	if err := e.p.Delete(t.Context(), ids[1]); err != nil || e.fake.Firewalls() != 0 {
		t.Fatalf("after the last child's delete (%v): rules %v, want none", err, e.fake.FirewallNames())
	}

	req := child("proxy-00000000000000ea", "uid-ea")
	req.SourceRanges = []string{"198.51.100.0/24", "2001:db8:1::/48"}
	e.fake.Fail(gcefake.InstancesInsert, gcefake.ShapeNamed("sync 400 invalid"))
	if _, err := e.p.Create(t.Context(), req); err == nil {
		t.Fatal("create succeeded with the insert failing")
	}
	list, err := e.p.ListByTag(t.Context())
	if err != nil || len(list) != 1 || list[0].Name != shared {
		t.Fatalf("list %+v, %v: want the shared rules as one entry %s", list, err, shared)
	}
	if err := e.p.Delete(t.Context(), list[0].ProviderID); err != nil || e.fake.Firewalls() != 0 {
		t.Errorf("collecting the shared rules: %v, rules %v left", err, e.fake.FirewallNames())
	}
}
