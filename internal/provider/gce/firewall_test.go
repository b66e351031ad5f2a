package gce

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/gcefake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
)

// withFirewall makes the provider manage rules, admitting 192.0.2.0/24 by default.
func withFirewall(c *provider.GCEConfig) {
	c.Firewall = &provider.GCEFirewall{SourceRanges: []string{"192.0.2.0/24"}}
}

// TestRuleOfFailedInsertIsListedAndDeleted: an insert that fails after its rule was made
// (a permanent refusal, a Spot stock-out) leaves the rule; ListByTag lists it as what is
// left of the Proxy's instance, with the Proxy's UID and the rule's creation time, so the
// deleting Proxy (which has no providerID yet) and orphan GC find it, and Delete of that
// entry removes the rule.
func TestRuleOfFailedInsertIsListedAndDeleted(t *testing.T) {
	for _, shape := range []string{"sync 400 invalid", "operation ZONE_RESOURCE_POOL_EXHAUSTED 503"} {
		t.Run(shape, func(t *testing.T) {
			e := newEnv(t, withFirewall)
			req := request("proxy-00000000000000f1", "uid-f1")
			e.fake.Fail(gcefake.InstancesInsert, gcefake.ShapeNamed(shape))
			if _, err := e.p.Create(t.Context(), req); err == nil {
				t.Fatal("create succeeded with the insert failing")
			}
			if e.fake.Firewall(req.Name) == nil || e.fake.Instances() != 0 {
				t.Fatalf("want the rule made and no instance: rule %v, %d instances", e.fake.Firewall(req.Name), e.fake.Instances())
			}
			list, err := e.p.ListByTag(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != 1 || list[0].Name != req.Name || list[0].UID != req.UID || list[0].State != provider.StateUnknown ||
				list[0].ProviderID != ident.ProviderID(testProject, testZone, req.Name) || time.Since(list[0].CreatedAt) > time.Minute {
				t.Fatalf("list %+v: want the rule left by the failed insert, with its UID, zone and creation time", list)
			}
			if err := e.p.Delete(t.Context(), list[0].ProviderID); err != nil {
				t.Fatal(err)
			}
			if e.fake.Firewall(req.Name) != nil {
				t.Error("the rule is still there after Delete")
			}
			if list, err := e.p.ListByTag(t.Context()); err != nil || len(list) != 0 {
				t.Errorf("list after delete: %+v, %v", list, err)
			}
		})
	}
}

// TestRulesAreListedOnlyWithoutTheirInstance: a rule whose instance stands is not listed
// twice; rules are read over every page, and a failed page fails the whole listing.
func TestRulesAreListedOnlyWithoutTheirInstance(t *testing.T) {
	e := newEnv(t, withFirewall)
	if _, err := e.p.Create(t.Context(), request("proxy-00000000000000f2", "uid-f2")); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"proxy-00000000000000f3", "proxy-00000000000000f4"} {
		e.fake.Fail(gcefake.InstancesInsert, gcefake.ShapeNamed("sync 400 invalid"))
		if _, err := e.p.Create(t.Context(), request(n, "uid-"+n)); err == nil {
			t.Fatal("create succeeded")
		}
	}
	e.fake.SetPageSize(1)
	list, err := e.p.ListByTag(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, in := range list {
		names = append(names, in.Name+"/"+in.State)
	}
	if got := strings.Join(names, ","); got != "proxy-00000000000000f2/Running,proxy-00000000000000f3/Unknown,proxy-00000000000000f4/Unknown" {
		t.Errorf("listed %s", got)
	}
	e.fake.Fail(gcefake.FirewallsList, gcefake.Failure{})
	e.fake.Fail(gcefake.FirewallsList, gcefake.ShapeNamed("sync 500 backendError"))
	if list, err := e.p.ListByTag(t.Context()); err == nil || provider.Class(err) != provider.ErrTransient || list != nil ||
		!strings.Contains(err.Error(), "listing firewall rules of project "+testProject) {
		t.Errorf("list with the second page of rules failing: %+v, %v; want nothing and a transient error", list, err)
	}
}

// TestForeignRuleOfTheNameIsNeverTouched: a rule of the instance's name made by hand, or
// by another install, is never adopted, replaced, listed or deleted: Create fails
// permanently naming it, before any instance is made.
func TestForeignRuleOfTheNameIsNeverTouched(t *testing.T) {
	for _, desc := range []string{"opened by hand", "egress-proxies-operator provider=gcp-test install=install-b zone=europe-west1-b uid=u"} {
		t.Run(desc, func(t *testing.T) {
			e := newEnv(t, withFirewall)
			req := request("proxy-00000000000000f5", "uid-f5")
			e.fake.PutFirewall(&computepb.Firewall{Name: proto.String(req.Name), Description: proto.String(desc),
				SourceRanges: []string{"0.0.0.0/0"}, TargetTags: []string{req.Name}})
			_, err := e.p.Create(t.Context(), req)
			if provider.Class(err) != provider.ErrPermanent || !strings.Contains(err.Error(), "firewall rule proxy-00000000000000f5") ||
				!strings.Contains(err.Error(), "not this install's") || !strings.Contains(err.Error(), desc) {
				t.Errorf("create over a foreign rule: %v", err)
			}
			if e.fake.CallCount(gcefake.InstancesInsert) != 0 || e.fake.CallCount(gcefake.FirewallsInsert) != 0 {
				t.Error("an insert was sent")
			}
			if list, err := e.p.ListByTag(t.Context()); err != nil || len(list) != 0 {
				t.Errorf("list: %+v, %v; want nothing", list, err)
			}
			if err := e.p.Delete(t.Context(), ident.ProviderID(testProject, testZone, req.Name)); err != nil {
				t.Fatal(err)
			}
			if fw := e.fake.Firewall(req.Name); fw == nil || fw.GetDescription() != desc || e.fake.CallCount(gcefake.FirewallsDelete) != 0 {
				t.Errorf("the foreign rule was touched: %v", fw)
			}
		})
	}
}

// TestMixedFamilySourcesAreRefused: one GCE rule holds one address family. A Proxy whose
// allowed sources mix IPv4 and IPv6 fails permanently, naming the field and both ranges,
// before any rule or VM is made.
func TestMixedFamilySourcesAreRefused(t *testing.T) {
	e := newEnv(t, withFirewall)
	req := request("proxy-00000000000000f6", "uid-f6")
	req.SourceRanges = []string{"198.51.100.0/24", "2001:db8::/32"}
	_, err := e.p.Create(t.Context(), req)
	if provider.Class(err) != provider.ErrPermanent || !strings.Contains(fmt.Sprint(err), "spec.proxy.allowedSourceRanges mixes IPv4 (198.51.100.0/24) and IPv6 (2001:db8::/32)") {
		t.Errorf("create with mixed sources: %v", err)
	}
	if e.fake.CallCount(gcefake.FirewallsInsert)+e.fake.CallCount(gcefake.InstancesInsert) != 0 {
		t.Error("an insert was sent")
	}
}
