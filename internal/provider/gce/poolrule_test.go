package gce

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/gcefake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
)

var testPool = provider.PoolRef{Namespace: "crawl", Name: "eu", UID: "pool-uid-1"}

// child is a CreateRequest of a child of testPool.
func child(name, uid string) provider.CreateRequest {
	req := request(name, uid)
	req.Pool = testPool
	return req
}

// poolRules are the names of the shared rules the fake holds.
func poolRules(t *testing.T, e *env) []string {
	t.Helper()
	return slices.DeleteFunc(e.fake.FirewallNames(), func(n string) bool { return !isPoolRule(n) })
}

// TestPoolChildrenShareOneRule: the children of one pool with the same sources and port
// are admitted by one rule, named after them and targeting the tag each carries; it
// stays while a child is left and goes with the last one; a standalone Proxy keeps one
// rule of its own.
func TestPoolChildrenShareOneRule(t *testing.T) {
	e := newEnv(t, withFirewall)
	names := []string{"proxy-00000000000000a1", "proxy-00000000000000a2", "proxy-00000000000000a3"}
	var ids []string
	for _, n := range names {
		inst, err := e.p.Create(t.Context(), child(n, "uid-"+n))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, inst.ProviderID)
	}
	alone, err := e.p.Create(t.Context(), request("proxy-00000000000000b1", "uid-b1"))
	if err != nil {
		t.Fatal(err)
	}
	rules := poolRules(t, e)
	if len(rules) != 1 || e.fake.Firewalls() != 2 {
		t.Fatalf("%d rules (shared %v) for three children and one standalone Proxy, want the shared one and the standalone's", e.fake.Firewalls(), rules)
	}
	shared := e.fake.Firewall(rules[0])
	if !slices.Equal(shared.GetTargetTags(), []string{rules[0]}) || !slices.Equal(shared.GetSourceRanges(), []string{"192.0.2.0/24"}) ||
		shared.GetAllowed()[0].GetPorts()[0] != "3128" || !strings.Contains(shared.GetDescription(), "pool=crawl/eu uid=pool-uid-1") {
		t.Errorf("shared rule %v", shared)
	}
	for _, n := range names {
		inst := e.fake.Instance(testZone, n)
		if !slices.Equal(inst.GetTags().GetItems(), []string{"egress-proxy", rules[0]}) || inst.GetLabels()[LabelPoolRule] != rules[0] {
			t.Errorf("child %s: tags %v, labels %v; want the shared rule's tag and label", n, inst.GetTags().GetItems(), inst.GetLabels())
		}
		if e.fake.Firewall(n) != nil {
			t.Errorf("child %s has a rule of its own", n)
		}
	}
	if e.fake.Firewall(alone.Name) == nil {
		t.Error("the standalone Proxy has no rule of its own")
	}
	for i, id := range ids {
		if err := e.p.Delete(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		if last := i == len(ids)-1; (e.fake.Firewall(rules[0]) == nil) != last {
			t.Fatalf("after deleting child %d of %d the shared rule is there: %v", i+1, len(ids), e.fake.Firewall(rules[0]) != nil)
		}
	}
	if e.fake.Firewall(alone.Name) == nil {
		t.Error("deleting the pool took the standalone Proxy's rule")
	}
}

// TestPoolRuleKeyedBySourcesAndPort: children asking other sources (a template change
// rolling) get a rule of their own, so no child admits what its spec does not; each
// rule goes with its last child. Other pools never share.
func TestPoolRuleKeyedBySourcesAndPort(t *testing.T) {
	e := newEnv(t, withFirewall)
	old, err := e.p.Create(t.Context(), child("proxy-00000000000000c1", "uid-c1"))
	if err != nil {
		t.Fatal(err)
	}
	newer := child("proxy-00000000000000c2", "uid-c2")
	newer.SourceRanges = []string{"198.51.100.0/24"}
	nu, err := e.p.Create(t.Context(), newer)
	if err != nil {
		t.Fatal(err)
	}
	other := child("proxy-00000000000000c3", "uid-c3")
	other.Pool = provider.PoolRef{Namespace: "crawl", Name: "us", UID: "pool-uid-2"}
	if _, err := e.p.Create(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	if rules := poolRules(t, e); len(rules) != 3 {
		t.Fatalf("shared rules %v, want one per pool and sources", rules)
	}
	oldRule := e.fake.Instance(testZone, old.Name).GetLabels()[LabelPoolRule]
	newRule := e.fake.Instance(testZone, nu.Name).GetLabels()[LabelPoolRule]
	if got := e.fake.Firewall(newRule).GetSourceRanges(); !slices.Equal(got, []string{"198.51.100.0/24"}) {
		t.Errorf("the new children's rule admits %v", got)
	}
	if err := e.p.Delete(t.Context(), old.ProviderID); err != nil {
		t.Fatal(err)
	}
	if e.fake.Firewall(oldRule) != nil || e.fake.Firewall(newRule) == nil {
		t.Errorf("after the old child went: old rule there %v, new rule there %v", e.fake.Firewall(oldRule) != nil, e.fake.Firewall(newRule) != nil)
	}
}

// TestPoolRuleAdoptedAndPutRight: a shared rule of this install found at Create (made by
// an earlier manager) is adopted; one edited by hand is patched back in place, never
// deleted under the children it admits; one of that name that is not this install's is
// a permanent error naming it, and is left as it was.
func TestPoolRuleAdoptedAndPutRight(t *testing.T) {
	e := newEnv(t, withFirewall)
	if _, err := e.p.Create(t.Context(), child("proxy-00000000000000d1", "uid-d1")); err != nil {
		t.Fatal(err)
	}
	name := poolRules(t, e)[0]
	fw := e.fake.Firewall(name)
	fw.SourceRanges = []string{"0.0.0.0/0"}
	e.fake.PutFirewall(fw)
	inserts := e.fake.CallCount(gcefake.FirewallsInsert)
	if _, err := e.p.Create(t.Context(), child("proxy-00000000000000d2", "uid-d2")); err != nil {
		t.Fatal(err)
	}
	if got := e.fake.Firewall(name).GetSourceRanges(); !slices.Equal(got, []string{"192.0.2.0/24"}) {
		t.Errorf("the edited rule admits %v after a Create, want it put right", got)
	}
	if e.fake.CallCount(gcefake.FirewallsPatch) != 1 || e.fake.CallCount(gcefake.FirewallsDelete) != 0 || e.fake.CallCount(gcefake.FirewallsInsert) != inserts {
		t.Errorf("patch %d, delete %d, inserts %d more: want it patched in place", e.fake.CallCount(gcefake.FirewallsPatch),
			e.fake.CallCount(gcefake.FirewallsDelete), e.fake.CallCount(gcefake.FirewallsInsert)-inserts)
	}

	// Another install's rule of the very name.
	e2 := newEnv(t, withFirewall)
	req := child("proxy-00000000000000d3", "uid-d3")
	theirs := &computepb.Firewall{Name: proto.String(e2.p.poolRule(req, []string{"192.0.2.0/24"})),
		Description:  proto.String("egress-proxies-operator provider=gcp-test install=install-b pool=crawl/eu uid=pool-uid-1"),
		SourceRanges: []string{"0.0.0.0/0"}, TargetTags: []string{"x"}}
	e2.fake.PutFirewall(theirs)
	_, err := e2.p.Create(t.Context(), req)
	if !errors.Is(err, provider.ErrPermanent) || !strings.Contains(err.Error(), theirs.GetName()) || !strings.Contains(err.Error(), "install=install-b") {
		t.Fatalf("create over another install's rule: %v, want permanent naming the rule and its description", err)
	}
	if e2.fake.Instances() != 0 || !slices.Equal(e2.fake.Firewall(theirs.GetName()).GetSourceRanges(), []string{"0.0.0.0/0"}) {
		t.Error("an instance was made, or the other install's rule was touched")
	}
}

// TestPoolRuleErrors: each failure of the shared rule's calls is classed as the API's
// answer says, and no instance is made without its rule.
func TestPoolRuleErrors(t *testing.T) {
	for _, tc := range []struct {
		method string
		shape  string
		class  error
	}{
		{gcefake.FirewallsGet, "sync 403 forbidden", provider.ErrPermanent},
		{gcefake.FirewallsGet, "sync 401 authError", provider.ErrPermanent},
		{gcefake.FirewallsInsert, "sync 403 quotaExceeded", provider.ErrQuotaExceeded},
		{gcefake.FirewallsInsert, "sync 429 rateLimitExceeded", provider.ErrTransient},
		{gcefake.FirewallsInsert, "operation QUOTA_EXCEEDED 403", provider.ErrQuotaExceeded},
	} {
		t.Run(tc.method+" "+tc.shape, func(t *testing.T) {
			e := newEnv(t, withFirewall)
			e.fake.Fail(tc.method, gcefake.ShapeNamed(tc.shape))
			_, err := e.p.Create(t.Context(), child("proxy-00000000000000e1", "uid-e1"))
			if !errors.Is(err, tc.class) {
				t.Fatalf("create: %v, want %v", err, tc.class)
			}
			if e.fake.Instances() != 0 {
				t.Error("an instance was made without its rule")
			}
		})
	}
	// Mixed families are refused before any call, naming where they came from.
	e := newEnv(t, withFirewall)
	req := child("proxy-00000000000000e2", "uid-e2")
	req.SourceRanges = []string{"192.0.2.0/24", "2001:db8::/32"}
	if _, err := e.p.Create(t.Context(), req); !errors.Is(err, provider.ErrPermanent) || !strings.Contains(err.Error(), "spec.proxy.allowedSourceRanges") {
		t.Fatalf("mixed ranges: %v", err)
	}
	// A failed count keeps the rule and fails the Delete.
	if _, err := e.p.Create(t.Context(), child("proxy-00000000000000e3", "uid-e3")); err != nil {
		t.Fatal(err)
	}
	id := ident.ProviderID(testProject, testZone, "proxy-00000000000000e3")
	e.fake.Fail(gcefake.InstancesAggregatedList, gcefake.ShapeNamed("sync 503 backendError"))
	if err := e.p.Delete(t.Context(), id); !errors.Is(err, provider.ErrTransient) {
		t.Fatalf("delete with the count failing: %v, want transient", err)
	}
	if len(poolRules(t, e)) != 1 {
		t.Fatal("the shared rule went though its count failed")
	}
	// The instance is gone, so the repeat succeeds; the rule, which nothing names any
	// more, is listed as left over for orphan GC.
	if err := e.p.Delete(t.Context(), id); err != nil {
		t.Fatalf("repeat delete: %v", err)
	}
	list, err := e.p.ListByTag(t.Context())
	if err != nil || len(list) != 1 || !isPoolRule(list[0].Name) || list[0].UID != testPool.UID {
		t.Fatalf("list after the failed count: %+v, %v; want the shared rule left over", list, err)
	}
	if err := e.p.Delete(t.Context(), list[0].ProviderID); err != nil || len(poolRules(t, e)) != 0 {
		t.Fatalf("GC's delete of the left-over rule: %v, rules %v", err, poolRules(t, e))
	}
}

// TestPoolRuleLeftOverIsCollected: a shared rule no instance carries (every child's
// insert failed) is listed as left over with the pool's UID and creation time, so orphan
// GC deletes it after the grace period; its Delete leaves it, transient, when a child
// was inserted meanwhile.
func TestPoolRuleLeftOverIsCollected(t *testing.T) {
	e := newEnv(t, withFirewall)
	e.fake.Fail(gcefake.InstancesInsert, gcefake.ShapeNamed("sync 400 invalid"))
	if _, err := e.p.Create(t.Context(), child("proxy-00000000000000f7", "uid-f7")); err == nil {
		t.Fatal("create succeeded with the insert failing")
	}
	list, err := e.p.ListByTag(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || !isPoolRule(list[0].Name) || list[0].UID != testPool.UID || list[0].State != provider.StateUnknown || time.Since(list[0].CreatedAt) > time.Minute {
		t.Fatalf("list %+v: want the shared rule left over, with the pool's UID", list)
	}
	// A child inserted before GC's Delete of the rule keeps it.
	if _, err := e.p.Create(t.Context(), child("proxy-00000000000000f8", "uid-f8")); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Delete(t.Context(), list[0].ProviderID); !errors.Is(err, provider.ErrTransient) || !strings.Contains(err.Error(), "proxy-00000000000000f8") {
		t.Fatalf("delete of a rule in use: %v, want transient naming its instance", err)
	}
	if list, err := e.p.ListByTag(t.Context()); err != nil || len(list) != 1 || list[0].Name != "proxy-00000000000000f8" {
		t.Fatalf("list with the child: %+v, %v; want the child only", list, err)
	}
	if err := e.p.Delete(t.Context(), ident.ProviderID(testProject, testZone, "proxy-00000000000000f8")); err != nil {
		t.Fatal(err)
	}
	if len(poolRules(t, e)) != 0 {
		t.Error("the shared rule outlived its last child")
	}
}

// pausedInserts holds every instances.insert request until release is closed or a
// second has passed, after telling reached.
type pausedInserts struct {
	reached chan struct{}
	release chan struct{}
}

func (p *pausedInserts) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/instances") {
		p.reached <- struct{}{}
		select {
		case <-p.release:
		case <-time.After(time.Second):
		}
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestPoolRuleNotDeletedUnderAnInsert: the last child's Delete, counting while a
// sibling's Create has checked the shared rule and is inserting, waits for the insert
// and keeps the rule; it never leaves the sibling's instance without its rule.
func TestPoolRuleNotDeletedUnderAnInsert(t *testing.T) {
	e := newEnv(t, withFirewall)
	first, err := e.p.Create(t.Context(), child("proxy-00000000000000a1", "uid-a1"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(e.fake.URL)
	withFirewall(cfg)
	rt := &pausedInserts{reached: make(chan struct{}, 1), release: make(chan struct{})}
	p, err := New(provider.ProviderConfig{Name: "gcp-test", Type: provider.TypeGCE, GCE: cfg}, e.logs.logger(1),
		WithInstallID(testInstall), WithPollInterval(time.Millisecond, 5*time.Millisecond), WithBaseTransport(rt))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	created := make(chan error, 1)
	go func() { _, err := p.Create(t.Context(), child("proxy-00000000000000a2", "uid-a2")); created <- err }()
	select {
	case <-rt.reached:
	case <-time.After(30 * time.Second):
		t.Fatal("waited 30s for the sibling's insert")
	}
	deleted := make(chan error, 1)
	go func() { deleted <- p.Delete(t.Context(), first.ProviderID) }()
	select {
	case err := <-deleted:
		// Without the lock the Delete counts no sibling and deletes the rule meanwhile.
		close(rt.release)
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Second):
		// Waiting on the insert, as it must: the insert goes on at its second.
		if err := <-deleted; err != nil {
			t.Fatal(err)
		}
	}
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	rule := e.fake.Instance(testZone, "proxy-00000000000000a2").GetLabels()[LabelPoolRule]
	if rule == "" || e.fake.Firewall(rule) == nil {
		t.Fatalf("the sibling runs without its shared rule %q", rule)
	}
}
