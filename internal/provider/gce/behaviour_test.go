package gce

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/gcefake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
)

// TestOwnership: an instance of another install or not made by this provider entry is
// never adopted, listed or deleted; one of another Proxy UID is ErrOwnedByOther.
func TestOwnership(t *testing.T) {
	e := newEnv(t)
	put := func(name string, labels map[string]string) {
		e.fake.PutInstance(testZone, &computepb.Instance{Name: proto.String(name), Labels: labels})
	}
	put("proxy-00000000000000b1", map[string]string{LabelProvider: "gcp-test", LabelInstall: "install-b", LabelUID: "u1"})
	put("proxy-00000000000000b2", nil)
	put("proxy-00000000000000b3", map[string]string{LabelProvider: "gcp-test", LabelInstall: testInstall, LabelUID: "someone"})

	_, err := e.p.Create(t.Context(), request("proxy-00000000000000b1", "u1"))
	if provider.Class(err) != provider.ErrPermanent || errors.Is(err, provider.ErrOwnedByOther) || !strings.Contains(err.Error(), `install "install-b"`) {
		t.Errorf("create over another install's instance: %v", err)
	}
	_, err = e.p.Create(t.Context(), request("proxy-00000000000000b2", "u2"))
	if provider.Class(err) != provider.ErrPermanent || !strings.Contains(err.Error(), "not made by gce provider gcp-test") {
		t.Errorf("create over an unlabelled instance: %v", err)
	}
	_, err = e.p.Create(t.Context(), request("proxy-00000000000000b3", "u3"))
	if !errors.Is(err, provider.ErrOwnedByOther) || provider.Class(err) != provider.ErrPermanent {
		t.Errorf("create over another UID's instance: %v", err)
	}
	for _, n := range []string{"proxy-00000000000000b1", "proxy-00000000000000b2"} {
		id := ident.ProviderID(testProject, testZone, n)
		if _, err := e.p.Get(t.Context(), id); provider.Class(err) != provider.ErrNotFound {
			t.Errorf("get %s: %v, want not found", n, err)
		}
		if err := e.p.Delete(t.Context(), id); err != nil {
			t.Errorf("delete %s: %v", n, err)
		}
		if e.fake.Instance(testZone, n) == nil {
			t.Errorf("delete removed %s, which is not this install's", n)
		}
	}
	list, err := e.p.ListByTag(t.Context())
	if err != nil || len(list) != 1 || list[0].Name != "proxy-00000000000000b3" {
		t.Errorf("list: %+v, %v; want only b3", list, err)
	}
	if e.fake.CallCount(gcefake.InstancesInsert) != 0 {
		t.Error("an insert was sent")
	}
}

// TestInstanceResourceAndFirewall: spot scheduling, network tier, labels in GCE's
// charset, user-data in the user-data key, and the firewall rule admitting the port
// from the request's sources (the config's when it names none), deleted with the
// instance.
func TestInstanceResourceAndFirewall(t *testing.T) {
	e := newEnv(t, func(c *provider.GCEConfig) {
		c.Spot, c.NetworkTier = true, "STANDARD"
		c.Firewall = &provider.GCEFirewall{SourceRanges: []string{"192.0.2.0/24"}}
	})
	req := request("proxy-00000000000000c1", "UID.With.Upper")
	req.SourceRanges = []string{"198.51.100.0/24"}
	inst, err := e.p.Create(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if inst.UID != "UID.With.Upper" || !strings.HasPrefix(inst.IP, "203.0.113.") || inst.ProviderID != "gce://"+testProject+"/"+testZone+"/proxy-00000000000000c1" {
		t.Errorf("instance %+v", inst)
	}
	got := e.fake.Instance(testZone, req.Name)
	if s := got.GetScheduling(); s.GetProvisioningModel() != "SPOT" || s.GetInstanceTerminationAction() != "DELETE" {
		t.Errorf("scheduling %v", s)
	}
	if tier := got.GetNetworkInterfaces()[0].GetAccessConfigs()[0].GetNetworkTier(); tier != "STANDARD" {
		t.Errorf("network tier %s", tier)
	}
	if got.GetLabels()[LabelUID] != "uid_with_upper" || metadataValue(got, MetadataUserData) != testUserData {
		t.Errorf("labels %v, user-data %q", got.GetLabels(), metadataValue(got, MetadataUserData))
	}
	if !slices.Equal(got.GetTags().GetItems(), []string{"egress-proxy", req.Name}) {
		t.Errorf("tags %v", got.GetTags().GetItems())
	}
	fw := e.fake.Firewall(req.Name)
	if fw == nil || !slices.Equal(fw.SourceRanges, req.SourceRanges) || !slices.Equal(fw.TargetTags, []string{req.Name}) ||
		fw.Allowed[0].GetIPProtocol() != "tcp" || !slices.Equal(fw.Allowed[0].Ports, []string{"3128"}) {
		t.Fatalf("firewall %v", fw)
	}
	// Preempted: the Spot VM is deleted by GCE; Get says not found, Create makes it anew.
	if !e.fake.Preempt(testZone, req.Name) {
		t.Fatal("nothing to preempt")
	}
	if _, err := e.p.Get(t.Context(), inst.ProviderID); provider.Class(err) != provider.ErrNotFound {
		t.Errorf("get after preemption: %v", err)
	}
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatalf("create after preemption: %v", err)
	}
	if err := e.p.Delete(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	if e.fake.Instances() != 0 || e.fake.Firewall(req.Name) != nil {
		t.Errorf("left %d instances, firewall %v", e.fake.Instances(), e.fake.Firewall(req.Name))
	}
	// Without sources in the request the config's are used.
	req2 := request("proxy-00000000000000c2", "u2")
	if _, err := e.p.Create(t.Context(), req2); err != nil {
		t.Fatal(err)
	}
	if fw := e.fake.Firewall(req2.Name); fw == nil || !slices.Equal(fw.SourceRanges, []string{"192.0.2.0/24"}) {
		t.Errorf("firewall without request sources: %v", fw)
	}
}

// TestStoppedInstanceIsStarted: adopting a TERMINATED instance starts it.
func TestStoppedInstanceIsStarted(t *testing.T) {
	e := newEnv(t)
	req := request("proxy-00000000000000c3", "u3")
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	e.fake.Preempt(testZone, req.Name) // not Spot: TERMINATED
	inst, err := e.p.Create(t.Context(), req)
	if err != nil || inst.State != provider.StateRunning || inst.IP == "" {
		t.Fatalf("create of a stopped instance: %+v, %v", inst, err)
	}
	if e.fake.CallCount(gcefake.InstancesStart) != 1 {
		t.Errorf("%d starts, want 1", e.fake.CallCount(gcefake.InstancesStart))
	}
}

// TestNoExternalIP: the address is the internal one.
func TestNoExternalIP(t *testing.T) {
	no := false
	e := newEnv(t, func(c *provider.GCEConfig) { c.ExternalIP = &no })
	inst, err := e.p.Create(t.Context(), request("proxy-00000000000000c4", "u4"))
	if err != nil || !strings.HasPrefix(inst.IP, "198.51.100.") {
		t.Fatalf("instance %+v, %v", inst, err)
	}
	if n := len(e.fake.Instance(testZone, inst.Name).GetNetworkInterfaces()[0].GetAccessConfigs()); n != 0 {
		t.Errorf("%d access configs, want none", n)
	}
}

// TestCheck: one status per zone with quota headroom; a zone down, a region out of CPUs
// and a refused call each say so.
func TestCheck(t *testing.T) {
	e := newEnv(t)
	st := e.p.Check(t.Context())
	if len(st) != 2 || !st[0].Ready || st[0].Reason != "Reachable" || st[0].Details["cpus"] != "0/24" || st[1].Target != testZone2 {
		t.Fatalf("check: %+v", st)
	}
	e.fake.SetZoneStatus(testZone, "DOWN")
	e.fake.SetQuota("europe-west4", "CPUS", 8, 8)
	st = e.p.Check(t.Context())
	if st[0].Ready || st[0].Reason != "ZoneDown" || st[1].Ready || st[1].Reason != "QuotaExhausted" {
		t.Errorf("check: %+v", st)
	}
	e.fake.Fail(gcefake.ZonesGet, gcefake.Failure{Code: 403, Reason: "forbidden"})
	e.fake.Fail(gcefake.ZonesGet, gcefake.Failure{Code: 401})
	st = e.p.Check(t.Context())
	if st[0].Reason != "Forbidden" || st[1].Reason != "Unauthorized" {
		t.Errorf("check: %+v", st)
	}
}

// TestOneSpanAndLinePerCall: every API call has its gce.<method> client span under the
// caller's span, and a V(1) line.
func TestOneSpanAndLinePerCall(t *testing.T) {
	e := newEnv(t)
	name := "proxy-00000000000000d1"
	if _, err := e.p.Create(t.Context(), request(name, "u")); err != nil {
		t.Fatal(err)
	}
	var spans []string
	for _, s := range testSpans.Ended() {
		for _, a := range s.Attributes() {
			if a.Key == "gce.instance" && a.Value.AsString() == name {
				spans = append(spans, s.Name())
			}
		}
	}
	calls := 0
	for _, c := range e.fake.Calls() {
		if strings.Contains(c.Path, name) || c.Method == gcefake.InstancesInsert || c.Method == gcefake.ZoneOperationsGet {
			calls++
		}
	}
	if len(spans) != calls || !slices.Contains(spans, "gce.instances.insert") || !slices.Contains(spans, "gce.zoneOperations.get") {
		t.Errorf("spans %v for %d calls", spans, calls)
	}
	if n := strings.Count(e.logs.all(), `"msg"="gce call"`); n != calls {
		t.Errorf("%d call lines for %d calls", n, calls)
	}
}

// TestFirewallTagOnly: with manageRules false the instances carry the target tag and no
// rule is read, written or deleted.
func TestFirewallTagOnly(t *testing.T) {
	no := false
	e := newEnv(t, func(c *provider.GCEConfig) {
		c.Firewall = &provider.GCEFirewall{TargetTag: "my-proxies", ManageRules: &no}
	})
	inst, err := e.p.Create(t.Context(), request("proxy-00000000000000c5", "u5"))
	if err != nil {
		t.Fatal(err)
	}
	if tags := e.fake.Instance(testZone, inst.Name).GetTags().GetItems(); !slices.Contains(tags, "my-proxies") {
		t.Errorf("tags %v", tags)
	}
	if err := e.p.Delete(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{gcefake.FirewallsGet, gcefake.FirewallsInsert, gcefake.FirewallsDelete} {
		if n := e.fake.CallCount(m); n != 0 {
			t.Errorf("%d calls of %s", n, m)
		}
	}
}

// TestFirewallWithoutSourcesIsPermanent: a managed rule needs sources from somewhere.
func TestFirewallWithoutSourcesIsPermanent(t *testing.T) {
	e := newEnv(t, func(c *provider.GCEConfig) { c.Firewall = &provider.GCEFirewall{} })
	_, err := e.p.Create(t.Context(), request("proxy-00000000000000c6", "u6"))
	if provider.Class(err) != provider.ErrPermanent || !strings.Contains(err.Error(), "gce.firewall.sourceRanges") {
		t.Errorf("create: %v", err)
	}
	if e.fake.Instances() != 0 {
		t.Error("an instance was made without its firewall rule")
	}
}

// TestListByTagReadsEveryPageOrNothing: the aggregated list is followed over its pages,
// and a page that fails fails the whole listing, with nothing returned.
func TestListByTagReadsEveryPageOrNothing(t *testing.T) {
	e := newEnv(t)
	for i, z := range []string{testZone, testZone2, testZone} {
		req := request("proxy-0000000000000"+string(rune('a'+i))+"00", "u")
		req.Placement.Zone = z
		if _, err := e.p.Create(t.Context(), req); err != nil {
			t.Fatal(err)
		}
	}
	e.fake.SetPageSize(1)
	list, err := e.p.ListByTag(t.Context())
	if err != nil || len(list) != 3 {
		t.Fatalf("list over pages of one: %d instances, %v", len(list), err)
	}
	if n := e.fake.CallCount(gcefake.InstancesAggregatedList); n != 3 {
		t.Errorf("%d pages read, want 3", n)
	}
	// The first page is answered, the second fails.
	e.fake.Fail(gcefake.InstancesAggregatedList, gcefake.Failure{})
	e.fake.Fail(gcefake.InstancesAggregatedList, gcefake.Failure{Code: 500})
	list, err = e.p.ListByTag(t.Context())
	if provider.Class(err) != provider.ErrTransient || list != nil {
		t.Errorf("list with its second page failing: %d instances, %v; want nothing and transient", len(list), err)
	}
}

// TestRecreateAfterRestartAndPreemption: a manager restarted after a Spot VM was
// preempted derives the first requestId again, which GCE answers with the old, finished
// insert; Create sees no instance come of it and inserts with a fresh ID.
func TestRecreateAfterRestartAndPreemption(t *testing.T) {
	e := newEnv(t, func(c *provider.GCEConfig) { c.Spot = true })
	req := request("proxy-00000000000000c7", "u7")
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	e.fake.Preempt(testZone, req.Name)
	restarted, err := New(provider.ProviderConfig{Name: "gcp-test", Type: provider.TypeGCE, GCE: &e.p.cfg}, e.logs.logger(1),
		WithInstallID(testInstall), WithPollInterval(time.Millisecond, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restarted.Close() })
	inst, err := restarted.Create(t.Context(), req)
	if err != nil || inst.State != provider.StateRunning {
		t.Fatalf("create after restart and preemption: %+v, %v", inst, err)
	}
	var ids []string
	for _, c := range e.fake.Calls() {
		if c.Method == gcefake.InstancesInsert {
			ids = append(ids, c.RequestID)
		}
	}
	if len(ids) != 3 || ids[1] != ids[0] || ids[2] == ids[0] {
		t.Errorf("insert requestIds %q: want the first replayed once, then a fresh one", ids)
	}
}

// TestReplacedInstanceGetsItsNewSources: an instance replaced for a changed spec (new
// allowed sources) keeps its name, so its firewall rule must be made anew with the new
// ranges, not kept from the old instance; a repeat Create with the same sources leaves
// the rule alone.
func TestReplacedInstanceGetsItsNewSources(t *testing.T) {
	e := newEnv(t, func(c *provider.GCEConfig) { c.Firewall = &provider.GCEFirewall{} })
	req := request("proxy-00000000000000c7", "u7")
	req.SourceRanges = []string{"198.51.100.0/24"}
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatalf("repeat create: %v", err)
	}
	if n := e.fake.CallCount(gcefake.FirewallsInsert); n != 1 {
		t.Errorf("%d firewall inserts for one rule, want 1", n)
	}
	req.SourceRanges, req.SpecHash = []string{"192.0.2.0/24", "10.0.0.0/8"}, "hash-2"
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatalf("create for the new spec: %v", err)
	}
	fw := e.fake.Firewall(req.Name)
	if fw == nil {
		t.Fatal("no firewall rule after the replacement")
	}
	if diff := cmp.Diff([]string{"10.0.0.0/8", "192.0.2.0/24"}, slices.Sorted(slices.Values(fw.SourceRanges))); diff != "" {
		t.Errorf("the replaced instance's rule admits (-want +got):\n%s", diff)
	}
	if n := e.fake.CallCount(gcefake.FirewallsDelete); n != 1 {
		t.Errorf("%d firewall deletes, want 1 (the old rule)", n)
	}
}

// TestNeverAnsweredHint: the gce provider, also behind the registry's decorator, tells
// the health engine that a guest that never answers may run an image without cloud-init.
func TestNeverAnsweredHint(t *testing.T) {
	e := newEnv(t)
	for _, p := range []provider.Provider{e.p, provider.Observe("gcp-test", provider.TypeGCE, e.p)} {
		if h := provider.NeverAnsweredHint(p); !strings.Contains(h, "cloud-init") || !strings.Contains(h, "ubuntu-os-cloud") || !strings.Contains(h, testProject) {
			t.Errorf("%T: hint %q", p, h)
		}
	}
	if h := provider.NeverAnsweredHint(nil); h != "" {
		t.Errorf("no provider: hint %q", h)
	}
}

// TestStatusesMeanWhatTheySay: every GCE status maps to what it means for a proxy, the
// three rarer ones included: PENDING_STOP and DEPROVISIONING do not serve and are on their
// way out (Terminating, no address), REPAIRING is being brought back (Pending).
func TestStatusesMeanWhatTheySay(t *testing.T) {
	e := newEnv(t)
	inst, err := e.p.Create(t.Context(), request("proxy-00000000000000a1", "uid-a1"))
	if err != nil {
		t.Fatal(err)
	}
	for status, want := range map[string]string{
		"RUNNING": provider.StateRunning, "PROVISIONING": provider.StatePending, "STAGING": provider.StatePending,
		"REPAIRING": provider.StatePending, "STOPPING": provider.StateTerminating, "SUSPENDING": provider.StateTerminating,
		"PENDING_STOP": provider.StateTerminating, "DEPROVISIONING": provider.StateTerminating,
		"TERMINATED": provider.StateStopped, "STOPPED": provider.StateStopped, "SUSPENDED": provider.StateStopped,
	} {
		e.fake.SetInstanceStatus(testZone, "proxy-00000000000000a1", status)
		got, err := e.p.Get(t.Context(), inst.ProviderID)
		if err != nil || got.State != want {
			t.Errorf("status %s: state %q, %v; want %s", status, got.State, err, want)
		}
		if want == provider.StateTerminating && got.IP != "" {
			t.Errorf("status %s: address %q, want none", status, got.IP)
		}
	}
}

// TestCreateOverStoppingOrRepairingInstance: a Create meeting its VM PENDING_STOP or
// DEPROVISIONING fails transiently at once, naming the status; one meeting it REPAIRING
// waits until GCE has it running again.
func TestCreateOverStoppingOrRepairingInstance(t *testing.T) {
	e := newEnv(t)
	req := request("proxy-00000000000000a2", "uid-a2")
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	e.p.runningWait = 5 * time.Second
	for _, status := range []string{"PENDING_STOP", "DEPROVISIONING"} {
		e.fake.SetInstanceStatus(testZone, req.Name, status)
		if _, err := e.p.Create(t.Context(), req); provider.Class(err) != provider.ErrTransient || !strings.Contains(fmt.Sprint(err), status) {
			t.Errorf("create over a %s instance: %v, want transient naming it", status, err)
		}
	}
	e.fake.SetInstanceStatus(testZone, req.Name, "REPAIRING")
	gets := e.fake.CallCount(gcefake.InstancesGet)
	done := make(chan error, 1)
	go func() {
		inst, err := e.p.Create(t.Context(), req)
		if err == nil && inst.State != provider.StateRunning {
			err = fmt.Errorf("state %s", inst.State)
		}
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for e.fake.CallCount(gcefake.InstancesGet) < gets+3 {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for Create to poll the REPAIRING instance; %d reads", e.fake.CallCount(gcefake.InstancesGet)-gets)
		}
		time.Sleep(time.Millisecond)
	}
	e.fake.SetInstanceStatus(testZone, req.Name, "RUNNING")
	if err := <-done; err != nil {
		t.Errorf("create over a REPAIRING instance: %v, want it waited for until RUNNING", err)
	}
}

// TestSubnetwork: the instance goes on the configured network and subnetwork, which the
// fake checks exist and lie in the zone's region; a config whose zones are not all in
// the subnetwork's region is refused when the provider is built, naming the zone.
func TestSubnetwork(t *testing.T) {
	e := newEnv(t, func(c *provider.GCEConfig) {
		c.Zones = []string{testZone}
		c.Network, c.Subnetwork = "global/networks/proxies", "regions/europe-west1/subnetworks/proxies-ew1"
	})
	e.fake.AddNetwork("proxies")
	e.fake.AddSubnetwork("europe-west1", "proxies-ew1", "proxies")
	if _, err := e.p.Create(t.Context(), request("proxy-00000000000000a3", "uid-a3")); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(e.fake.URL)
	cfg.Subnetwork = "regions/europe-west1/subnetworks/proxies-ew1"
	_, err := New(provider.ProviderConfig{Name: "gcp-test", Type: provider.TypeGCE, GCE: cfg}, logr.Discard())
	if err == nil || !strings.Contains(err.Error(), `zone "europe-west4-a" is in region europe-west4, but subnetwork`) {
		t.Errorf("zones of two regions on one subnetwork: %v", err)
	}
}

// TestSpotPreemptionIsReported: a Spot VM GCE preempted is ErrNotFound marked
// ErrPreempted, its message naming the zone and the time, read from the system operation
// compute.instances.preempted; a Spot VM deleted (no preemption) is plain ErrNotFound,
// and without Spot no operation list is read at all.
func TestSpotPreemptionIsReported(t *testing.T) {
	e := newEnv(t, func(c *provider.GCEConfig) { c.Spot = true })
	inst, err := e.p.Create(t.Context(), request("proxy-00000000000000a4", "uid-a4"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.p.Create(t.Context(), request("proxy-00000000000000a5", "uid-a5"))
	if err != nil {
		t.Fatal(err)
	}
	e.fake.Preempt(testZone, "proxy-00000000000000a4")
	_, err = e.p.Get(t.Context(), inst.ProviderID)
	if provider.Class(err) != provider.ErrNotFound || !errors.Is(err, provider.ErrPreempted) ||
		!strings.Contains(fmt.Sprint(err), "spot VM proxy-00000000000000a4 in zone "+testZone+" was preempted by GCE at ") {
		t.Errorf("get of a preempted Spot VM: %v", err)
	}
	if err := e.p.Delete(t.Context(), other.ProviderID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Get(t.Context(), other.ProviderID); provider.Class(err) != provider.ErrNotFound || errors.Is(err, provider.ErrPreempted) {
		t.Errorf("get of a deleted Spot VM: %v, want not found, not preempted", err)
	}
	e.fake.Fail(gcefake.ZoneOperationsList, gcefake.ShapeNamed("sync 500 backendError"))
	if _, err := e.p.Get(t.Context(), inst.ProviderID); provider.Class(err) != provider.ErrNotFound || errors.Is(err, provider.ErrPreempted) {
		t.Errorf("get with the operation list failing: %v, want plain not found", err)
	}

	onDemand := newEnv(t)
	gone, err := onDemand.p.Create(t.Context(), request("proxy-00000000000000a6", "uid-a6"))
	if err != nil {
		t.Fatal(err)
	}
	onDemand.fake.Preempt(testZone, "proxy-00000000000000a6")
	if _, err := onDemand.p.Get(t.Context(), gone.ProviderID); err != nil || onDemand.fake.CallCount(gcefake.ZoneOperationsList) != 0 {
		t.Errorf("on-demand VM: %v, %d operation lists; want it Stopped, found, no list", err, onDemand.fake.CallCount(gcefake.ZoneOperationsList))
	}
}

// TestCheckComparesMachineTypesWithQuotas: Check reads each catalogue machine type's size
// and compares it with every CPU quota it draws on: CPUS (one spare CPU is not room for a
// 2-vCPU e2-small), the family's own (N2D_CPUS), and for Spot PREEMPTIBLE_CPUS when the
// region grants one. A zone is ready while one type fits, and names those that do not.
func TestCheckComparesMachineTypesWithQuotas(t *testing.T) {
	e := newEnv(t, func(c *provider.GCEConfig) {
		c.MachineTypes = map[string]string{"small": "e2-small", "big": "n2d-standard-4"}
	})
	e.fake.SetQuota("europe-west1", "CPUS", 24, 23)
	st := e.p.Check(t.Context())
	if st[0].Ready || st[0].Reason != "QuotaExhausted" || !strings.Contains(st[0].Message, "small (e2-small) needs 2 CPUS, 1 left") ||
		st[0].Details["machineType.big"] != "n2d-standard-4 4 vCPUs" {
		t.Errorf("one CPU left: %+v", st[0])
	}
	e.fake.SetQuota("europe-west1", "CPUS", 24, 0)
	e.fake.SetQuota("europe-west1", "N2D_CPUS", 8, 6)
	st = e.p.Check(t.Context())
	if !st[0].Ready || !strings.Contains(st[0].Message, "not fitting the quota left: big (n2d-standard-4) needs 4 N2D_CPUS, 2 left") || st[0].Details["N2D_CPUS"] != "6/8" {
		t.Errorf("family quota short for one type: %+v", st[0])
	}
	e.fake.SetQuota("europe-west1", "N2D_CPUS", 8, 8)
	e.fake.SetQuota("europe-west1", "CPUS", 24, 23)
	if st = e.p.Check(t.Context()); st[0].Ready || !strings.Contains(st[0].Message, "no machine type fits") {
		t.Errorf("neither type fits: %+v", st[0])
	}

	spot := newEnv(t, func(c *provider.GCEConfig) { c.Spot = true })
	spot.fake.SetQuota("europe-west1", "PREEMPTIBLE_CPUS", 0, 0)
	if st = spot.p.Check(t.Context()); !st[0].Ready {
		t.Errorf("Spot without a preemptible quota (CPUS applies): %+v", st[0])
	}
	spot.fake.SetQuota("europe-west1", "PREEMPTIBLE_CPUS", 8, 7)
	if st = spot.p.Check(t.Context()); st[0].Ready || !strings.Contains(st[0].Message, "needs 2 PREEMPTIBLE_CPUS, 1 left") {
		t.Errorf("Spot with the preemptible quota short: %+v", st[0])
	}

	missing := newEnv(t, func(c *provider.GCEConfig) { c.MachineTypes = map[string]string{"odd": "z9-mega-1"} })
	if st = missing.p.Check(t.Context()); st[0].Ready || st[0].Reason != "NotFound" || !strings.Contains(st[0].Message, "machine type z9-mega-1 (gce.machineTypes.odd)") {
		t.Errorf("machine type the zone lacks: %+v", st[0])
	}
}

// TestCheckReportsFirewallQuota: with managed rules, Check reads the project's FIREWALLS
// quota once a round: its used/limit in every zone's details, and no zone ready when no
// rule is left, since each VM needs one. Without managed rules it is not read.
func TestCheckReportsFirewallQuota(t *testing.T) {
	e := newEnv(t, withFirewall)
	if _, err := e.p.Create(t.Context(), request("proxy-00000000000000a7", "uid-a7")); err != nil {
		t.Fatal(err)
	}
	st := e.p.Check(t.Context())
	if !st[0].Ready || st[0].Details["firewalls"] != "1/200" || st[1].Details["firewalls"] != "1/200" ||
		!strings.Contains(st[0].Message, "1/200 firewall rules") || e.fake.CallCount(gcefake.ProjectsGet) != 1 {
		t.Errorf("check: %+v, %d project reads", st, e.fake.CallCount(gcefake.ProjectsGet))
	}
	e.fake.SetProjectQuota("FIREWALLS", 100, 100)
	st = e.p.Check(t.Context())
	if st[0].Ready || st[0].Reason != "QuotaExhausted" || !strings.Contains(st[0].Message, "no firewall-rule quota left (100/100)") || st[1].Ready {
		t.Errorf("firewall quota used up: %+v", st)
	}
	plain := newEnv(t)
	if plain.p.Check(t.Context()); plain.fake.CallCount(gcefake.ProjectsGet) != 0 {
		t.Error("the project was read without managed rules")
	}
}
