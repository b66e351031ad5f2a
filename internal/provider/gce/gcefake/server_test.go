package gcefake

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"
)

const (
	project = "fake-project"
	zone    = "europe-west1-b"
	rid     = "3f2a8e1c-5b7d-4c9e-8a1f-0d6b2e4c7a90"
)

// clients are the official REST clients pointed at a fresh fake.
func clients(t *testing.T) (*Server, *compute.InstancesClient, *compute.FirewallsClient) {
	t.Helper()
	s := New(project, zone, "europe-west4-a")
	t.Cleanup(s.Close)
	opts := []option.ClientOption{option.WithEndpoint(s.URL), option.WithoutAuthentication()}
	ic, err := compute.NewInstancesRESTClient(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	fc, err := compute.NewFirewallsRESTClient(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ic.Close(); fc.Close() })
	return s, ic, fc
}

func insert(t *testing.T, ic *compute.InstancesClient, name, requestID string, labels map[string]string) (*compute.Operation, error) {
	t.Helper()
	req := &computepb.InsertInstanceRequest{Project: project, Zone: zone, InstanceResource: &computepb.Instance{
		Name: proto.String(name), Labels: labels,
		NetworkInterfaces: []*computepb.NetworkInterface{{AccessConfigs: []*computepb.AccessConfig{{Type: proto.String("ONE_TO_ONE_NAT")}}}},
	}}
	if requestID != "" {
		req.RequestId = proto.String(requestID)
	}
	return ic.Insert(t.Context(), req)
}

// TestOperationGoesPendingRunningDone: an insert's operation is PENDING, RUNNING after the
// first poll and DONE at the second; the instance runs then, with a TEST-NET-3 NAT IP.
func TestOperationGoesPendingRunningDone(t *testing.T) {
	s, ic, _ := clients(t)
	op, err := insert(t, ic, "vm-1", rid, nil)
	if err != nil {
		t.Fatal(err)
	}
	var seen []computepb.Operation_Status
	seen = append(seen, op.Proto().GetStatus())
	for !op.Done() {
		if err := op.Poll(t.Context()); err != nil {
			t.Fatal(err)
		}
		seen = append(seen, op.Proto().GetStatus())
	}
	want := []computepb.Operation_Status{computepb.Operation_PENDING, computepb.Operation_RUNNING, computepb.Operation_DONE}
	if len(seen) != 3 || seen[0] != want[0] || seen[1] != want[1] || seen[2] != want[2] {
		t.Errorf("statuses %v, want %v", seen, want)
	}
	inst, err := ic.Get(t.Context(), &computepb.GetInstanceRequest{Project: project, Zone: zone, Instance: "vm-1"})
	if err != nil {
		t.Fatal(err)
	}
	if inst.GetStatus() != "RUNNING" || !strings.HasPrefix(inst.GetNetworkInterfaces()[0].GetAccessConfigs()[0].GetNatIP(), "203.0.113.") {
		t.Errorf("instance %v", inst)
	}
	s.SetNATAddress("127.0.0.1")
	if _, err := insert(t, ic, "vm-2", "", nil); err != nil {
		t.Fatal(err)
	}
	if ip := s.Instance(zone, "vm-2").GetNetworkInterfaces()[0].GetAccessConfigs()[0].GetNatIP(); ip != "127.0.0.1" {
		t.Errorf("NAT IP %s after SetNATAddress", ip)
	}
}

// TestRequestIDIsDeduplicated: a repeated requestId returns the first operation and makes
// nothing new; an invalid one is refused like GCE does; a name taken is 409 alreadyExists.
func TestRequestIDIsDeduplicated(t *testing.T) {
	s, ic, _ := clients(t)
	op1, err := insert(t, ic, "vm-1", rid, nil)
	if err != nil {
		t.Fatal(err)
	}
	op2, err := insert(t, ic, "vm-1", rid, nil)
	if err != nil || op2.Name() != op1.Name() {
		t.Fatalf("replay: %v, %v; want operation %s", op2, err, op1.Name())
	}
	if s.Instances() != 1 {
		t.Errorf("%d instances", s.Instances())
	}
	_, err = insert(t, ic, "vm-1", "", nil)
	if ae := apiErr(t, err); ae.Code != 409 || ae.Errors[0].Reason != "alreadyExists" {
		t.Errorf("a second insert without requestId: %v", err)
	}
	for _, bad := range []string{"not-a-uuid", "00000000-0000-0000-0000-000000000000"} {
		if _, err := insert(t, ic, "vm-2", bad, nil); apiErr(t, err).Code != 400 {
			t.Errorf("requestId %s: %v", bad, err)
		}
	}
}

func apiErr(t *testing.T, err error) *googleapi.Error {
	t.Helper()
	var ae *googleapi.Error
	if !errors.As(err, &ae) {
		t.Fatalf("not a googleapi.Error: %v", err)
	}
	return ae
}

// TestAggregatedListFiltersByLabel: the filter the provider sends selects by label; a
// filter the fake cannot read is refused rather than ignored.
func TestAggregatedListFiltersByLabel(t *testing.T) {
	s, ic, _ := clients(t)
	s.SetOperationPolls(0)
	for name, l := range map[string]map[string]string{
		"a": {"owner": "x", "install": "one"}, "b": {"owner": "x", "install": "two"}, "c": {"owner": "y"},
	} {
		if _, err := insert(t, ic, name, "", l); err != nil {
			t.Fatal(err)
		}
	}
	list := func(filter string) ([]string, error) {
		it := ic.AggregatedList(t.Context(), &computepb.AggregatedListInstancesRequest{Project: project, Filter: proto.String(filter)})
		var names []string
		for {
			pair, err := it.Next()
			if errors.Is(err, iterator.Done) {
				return names, nil
			}
			if err != nil {
				return nil, err
			}
			for _, i := range pair.Value.GetInstances() {
				names = append(names, i.GetName())
			}
		}
	}
	for filter, want := range map[string]string{
		`(labels.owner = "x") AND (labels.install = "one")`: "a",
		`(labels.owner = "x") (labels.install != "one")`:    "b",
		`labels.owner = "y"`:                                "c",
		``:                                                  "a,b,c",
	} {
		got, err := list(filter)
		if err != nil || strings.Join(got, ",") != want {
			t.Errorf("filter %q: %v, %v; want %s", filter, got, err, want)
		}
	}
	if _, err := list(`name = "a" OR labels.x = "y"`); apiErr(t, err).Code != 400 {
		t.Errorf("an unreadable filter: %v", err)
	}
}

// TestInjectedFailures: synchronous errors carry their status and reason; an operation
// error with httpErrorStatusCode makes Poll fail, and one without leaves Poll (and the
// client's Wait) returning nil, the error only in the operation's list.
func TestInjectedFailures(t *testing.T) {
	s, ic, _ := clients(t)
	s.Fail(InstancesInsert, Failure{Code: 403, Reason: "rateLimitExceeded"})
	_, err := insert(t, ic, "vm-1", "", nil)
	if ae := apiErr(t, err); ae.Code != 403 || ae.Errors[0].Reason != "rateLimitExceeded" {
		t.Errorf("rate limited: %v", err)
	}
	s.Fail(InstancesInsert, Failure{OpCode: "QUOTA_EXCEEDED", OpHTTPStatus: 403})
	op, err := insert(t, ic, "vm-1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(t.Context()); err == nil || op.Proto().GetError().GetErrors()[0].GetCode() != "QUOTA_EXCEEDED" {
		t.Errorf("wait on an operation failing with HTTP 403: %v, %v", err, op.Proto().GetError())
	}
	s.SetOperationPolls(1)
	s.Fail(InstancesInsert, Failure{OpCode: "ZONE_RESOURCE_POOL_EXHAUSTED", OpWithoutHTTPStatus: true})
	op, err = insert(t, ic, "vm-1", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(t.Context()); err != nil || op.Proto().GetError().GetErrors()[0].GetCode() != "ZONE_RESOURCE_POOL_EXHAUSTED" {
		t.Errorf("wait on an operation failing without status: %v (the client returns nil), %v", err, op.Proto().GetError())
	}
	if s.Instances() != 0 {
		t.Errorf("failed inserts left %d instances", s.Instances())
	}
}

// TestFailedOperationCarriesHTTPStatus: an injected operation failure naming no status
// carries the one real GCE gives its code, as real failed operations do (503 for a
// stock-out, 400 for RESOURCE_NOT_READY), so the client's Wait reports it.
func TestFailedOperationCarriesHTTPStatus(t *testing.T) {
	s, ic, _ := clients(t)
	s.SetOperationPolls(1)
	for code, want := range map[string]int32{"ZONE_RESOURCE_POOL_EXHAUSTED": 503, "RESOURCE_NOT_READY": 400, "QUOTA_EXCEEDED": 403, "INTERNAL_ERROR": 500} {
		s.Fail(InstancesInsert, Failure{OpCode: code})
		op, err := insert(t, ic, "vm-1", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		err = op.Wait(t.Context())
		if got := op.Proto().GetHttpErrorStatusCode(); got != want || err == nil || !strings.Contains(err.Error(), code) {
			t.Errorf("%s: httpErrorStatusCode %d, want %d; Wait: %v", code, got, want, err)
		}
	}
	for _, sh := range ErrorShapes {
		if f := sh.Failure; (f.Code == 0) == (f.OpCode == "") {
			t.Errorf("shape %s is neither a synchronous nor an operation error: %+v", sh.Name, f)
		}
	}
	if s.Instances() != 0 {
		t.Errorf("failed inserts left %d instances", s.Instances())
	}
	if _, err := insert(t, ic, "vm-1", "", nil); err != nil {
		t.Errorf("an insert after the injected failures: %v", err)
	}
}

// TestPreemptAndStart: a Spot VM with termination action DELETE is gone when preempted;
// another is TERMINATED without its NAT IP, and start brings it back.
func TestPreemptAndStart(t *testing.T) {
	s, ic, _ := clients(t)
	s.SetOperationPolls(0)
	s.PutInstance(zone, &computepb.Instance{Name: proto.String("spot"),
		Scheduling: &computepb.Scheduling{ProvisioningModel: proto.String("SPOT"), InstanceTerminationAction: proto.String("DELETE")}})
	if _, err := insert(t, ic, "std", "", nil); err != nil {
		t.Fatal(err)
	}
	if !s.Preempt(zone, "spot") || !s.Preempt(zone, "std") || s.Preempt(zone, "none") {
		t.Fatal("preempt reports wrongly")
	}
	if s.Instance(zone, "spot") != nil {
		t.Error("the Spot VM survived")
	}
	if i := s.Instance(zone, "std"); i.GetStatus() != "TERMINATED" || i.GetNetworkInterfaces()[0].GetAccessConfigs()[0].NatIP != nil {
		t.Errorf("preempted standard VM %v", i)
	}
	if _, err := ic.Start(t.Context(), &computepb.StartInstanceRequest{Project: project, Zone: zone, Instance: "std"}); err != nil {
		t.Fatal(err)
	}
	if i := s.Instance(zone, "std"); i.GetStatus() != "RUNNING" || i.GetNetworkInterfaces()[0].GetAccessConfigs()[0].GetNatIP() == "" {
		t.Errorf("started VM %v", i)
	}
}

// TestReset: instances.reset of a RUNNING instance keeps it RUNNING with its addresses and
// counts once its operation is done; a stopped one is 400 resourceNotReady, a missing one
// 404; an injected operation failure resets nothing.
func TestReset(t *testing.T) {
	s, ic, _ := clients(t)
	s.SetOperationPolls(0)
	if _, err := insert(t, ic, "vm", "", nil); err != nil {
		t.Fatal(err)
	}
	before := s.Instance(zone, "vm")
	op, err := ic.Reset(t.Context(), &computepb.ResetInstanceRequest{Project: project, Zone: zone, Instance: "vm"})
	if err != nil {
		t.Fatal(err)
	}
	if !op.Done() || op.Proto().GetOperationType() != "reset" {
		t.Fatalf("reset operation %v", op.Proto())
	}
	after := s.Instance(zone, "vm")
	if after.GetStatus() != "RUNNING" || after.GetId() != before.GetId() ||
		after.GetNetworkInterfaces()[0].GetAccessConfigs()[0].GetNatIP() != before.GetNetworkInterfaces()[0].GetAccessConfigs()[0].GetNatIP() {
		t.Errorf("after a reset %v, before %v", after, before)
	}
	if n := s.Restarts(zone, "vm"); n != 1 {
		t.Errorf("Restarts = %d after one reset, want 1", n)
	}
	s.Fail(InstancesReset, Failure{OpCode: "INTERNAL_ERROR"})
	if op, err := ic.Reset(t.Context(), &computepb.ResetInstanceRequest{Project: project, Zone: zone, Instance: "vm"}); err != nil || op.Proto().GetError() == nil {
		t.Errorf("reset with an injected operation failure: %v, %v", op, err)
	}
	if n := s.Restarts(zone, "vm"); n != 1 {
		t.Errorf("Restarts = %d after a failed reset, want still 1", n)
	}
	s.SetInstanceStatus(zone, "vm", "TERMINATED")
	_, err = ic.Reset(t.Context(), &computepb.ResetInstanceRequest{Project: project, Zone: zone, Instance: "vm"})
	if ae := apiErr(t, err); ae.Code != 400 || len(ae.Errors) != 1 || ae.Errors[0].Reason != "resourceNotReady" ||
		!strings.Contains(ae.Message, "instances/vm' is not ready") {
		t.Errorf("reset of a stopped instance: %v, want 400 resourceNotReady", err)
	}
	_, err = ic.Reset(t.Context(), &computepb.ResetInstanceRequest{Project: project, Zone: zone, Instance: "none"})
	if ae := apiErr(t, err); ae.Code != 404 {
		t.Errorf("reset of a missing instance: %v, want 404", err)
	}
}

// TestFirewallsZonesRegions: firewall rules go through global operations; zones and
// regions answer with status and quotas.
func TestFirewallsZonesRegions(t *testing.T) {
	s, _, fc := clients(t)
	op, err := fc.Insert(t.Context(), &computepb.InsertFirewallRequest{Project: project, FirewallResource: &computepb.Firewall{
		Name: proto.String("fw-1"), SourceRanges: []string{"192.0.2.0/24"}}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Firewall("fw-1") != nil {
		t.Error("the rule exists before its operation is done")
	}
	if err := op.Wait(t.Context()); err != nil || s.Firewall("fw-1") == nil {
		t.Fatalf("insert: %v, rule %v", err, s.Firewall("fw-1"))
	}
	if _, err := fc.Delete(t.Context(), &computepb.DeleteFirewallRequest{Project: project, Firewall: "fw-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := fc.Get(t.Context(), &computepb.GetFirewallRequest{Project: project, Firewall: "nope"}); apiErr(t, err).Code != 404 {
		t.Errorf("get of a missing rule: %v", err)
	}

	opts := []option.ClientOption{option.WithEndpoint(s.URL), option.WithoutAuthentication()}
	zc, _ := compute.NewZonesRESTClient(t.Context(), opts...)
	rc, _ := compute.NewRegionsRESTClient(t.Context(), opts...)
	defer zc.Close()
	defer rc.Close()
	s.SetZoneStatus(zone, "DOWN")
	z, err := zc.Get(t.Context(), &computepb.GetZoneRequest{Project: project, Zone: zone})
	if err != nil || z.GetStatus() != "DOWN" || !strings.HasSuffix(z.GetRegion(), "/regions/europe-west1") {
		t.Errorf("zone %v, %v", z, err)
	}
	s.SetQuota("europe-west1", "CPUS", 8, 6)
	r, err := rc.Get(t.Context(), &computepb.GetRegionRequest{Project: project, Region: "europe-west1"})
	if err != nil || r.GetQuotas()[0].GetLimit() != 8 || r.GetQuotas()[0].GetUsage() != 6 {
		t.Errorf("region %v, %v", r, err)
	}
	if _, err := zc.Get(t.Context(), &computepb.GetZoneRequest{Project: "other", Zone: zone}); apiErr(t, err).Code != 404 {
		t.Errorf("another project: %v", err)
	}
}

// TestFirewallList: the rules of the project by name, in pages of the page size, each
// with its creation time; a filter (which the fake does not read) is refused loudly.
func TestFirewallList(t *testing.T) {
	s, _, fc := clients(t)
	s.SetOperationPolls(0)
	for _, n := range []string{"rule-b", "rule-a", "rule-c"} {
		op, err := fc.Insert(t.Context(), &computepb.InsertFirewallRequest{Project: project, FirewallResource: &computepb.Firewall{Name: proto.String(n)}})
		if err != nil {
			t.Fatal(err)
		}
		if err := op.Wait(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	s.SetPageSize(2)
	it := fc.List(t.Context(), &computepb.ListFirewallsRequest{Project: project})
	var names []string
	for {
		fw, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if fw.GetCreationTimestamp() == "" {
			t.Errorf("rule %s has no creation time", fw.GetName())
		}
		names = append(names, fw.GetName())
	}
	if strings.Join(names, ",") != "rule-a,rule-b,rule-c" || s.CallCount(FirewallsList) != 2 {
		t.Errorf("listed %v in %d calls, want rule-a,rule-b,rule-c in 2", names, s.CallCount(FirewallsList))
	}
	_, err := fc.List(t.Context(), &computepb.ListFirewallsRequest{Project: project, Filter: proto.String(`name = "x"`)}).Next()
	if ae := apiErr(t, err); ae.Code != 400 {
		t.Errorf("list with a filter: %v", err)
	}
}

// TestRequestIDMustBeAValidUUID: GCE takes a valid UUID as requestId and not the zero
// one; the fake takes the RFC 4122 versions 1 to 5 only and refuses the newer ones (a
// version 8 UUID), which nothing shows the real API accepts.
func TestRequestIDMustBeAValidUUID(t *testing.T) {
	_, ic, _ := clients(t)
	for id, ok := range map[string]bool{
		"3f2a8e1c-5b7d-4c9e-8a1f-0d6b2e4c7a90": true,  // version 4
		"886313e1-3b8a-5372-9b90-0c9aee199e5d": true,  // version 5
		"3f2a8e1c-5b7d-8c9e-8a1f-0d6b2e4c7a90": false, // version 8
		"3f2a8e1c-5b7d-4c9e-ca1f-0d6b2e4c7a90": false, // not the RFC 4122 variant
		"00000000-0000-0000-0000-000000000000": false,
		"not-a-uuid":                           false,
	} {
		_, err := insert(t, ic, "vm-"+strings.ReplaceAll(id[:8], "0", "a"), id, nil)
		if ok && err != nil {
			t.Errorf("requestId %s refused: %v", id, err)
		}
		if !ok && (err == nil || apiErr(t, err).Code != 400 || !strings.Contains(err.Error(), "requestId")) {
			t.Errorf("requestId %s: %v, want a 400 naming requestId", id, err)
		}
	}
}

// TestFirewallRefusesMixedFamilies: like GCE, the fake refuses a rule whose source ranges
// mix IPv4 and IPv6 (in either order, the open ranges 0.0.0.0/0 and ::/0 too), or are not
// CIDRs, with a 400 naming the field and the entry at fault, and stores nothing; it takes
// a rule of either family alone.
func TestFirewallRefusesMixedFamilies(t *testing.T) {
	s, _, fc := clients(t)
	for i, c := range []struct {
		ranges []string
		says   string // "" when the rule is taken
	}{
		{[]string{"192.0.2.0/24", "198.51.100.0/24"}, ""},
		{[]string{"2001:db8::/32", "::/0"}, ""},
		{[]string{"192.0.2.0/24", "2001:db8::/32"}, "'resource.sourceRanges[1]': '2001:db8::/32'. A firewall rule can contain either IPv4 or IPv6 ranges, but not both"},
		{[]string{"2001:db8::/32", "2001:db8:1::/48", "0.0.0.0/0"}, "'resource.sourceRanges[2]': '0.0.0.0/0'. A firewall rule can contain either IPv4 or IPv6 ranges, but not both"},
		{[]string{"0.0.0.0/0", "::/0"}, "'resource.sourceRanges[1]': '::/0'"},
		{[]string{"192.0.2.0/33"}, "'resource.sourceRanges[0]': '192.0.2.0/33'. Must be a valid IPV4 or IPV6 CIDR"},
	} {
		name := fmt.Sprintf("rule-%d", i)
		_, err := fc.Insert(t.Context(), &computepb.InsertFirewallRequest{Project: project, FirewallResource: &computepb.Firewall{
			Name: proto.String(name), SourceRanges: c.ranges}})
		if c.says == "" && err != nil {
			t.Errorf("%v refused: %v", c.ranges, err)
		}
		if c.says != "" && (err == nil || apiErr(t, err).Code != 400 || !strings.Contains(err.Error(), "Invalid value for field "+c.says)) {
			t.Errorf("%v: %v, want a 400 saying %q", c.ranges, err, c.says)
		}
		if c.says != "" && s.Firewall(name) != nil {
			t.Errorf("%v: the refused rule was stored", c.ranges)
		}
	}
}

// TestInsertChecksNetworkAndSubnetwork: like GCE, the fake refuses an instance on a
// network it lacks (404), on a subnetwork it lacks (404), of another region than the
// zone's or of another network than the interface's (400), and takes one on its own
// region's subnetwork.
func TestInsertChecksNetworkAndSubnetwork(t *testing.T) {
	s, ic, _ := clients(t)
	s.AddNetwork("proxies")
	s.AddSubnetwork("europe-west1", "proxies-ew1", "proxies")
	s.AddSubnetwork("europe-west4", "proxies-ew4", "proxies")
	for i, c := range []struct {
		network, subnetwork string
		code                int
		says                string
	}{
		{"global/networks/nowhere", "", 404, "networks/nowhere"},
		{"global/networks/proxies", "regions/europe-west1/subnetworks/none", 404, "subnetworks/none"},
		{"global/networks/proxies", "regions/europe-west4/subnetworks/proxies-ew4", 400, "not in the instance's region europe-west1"},
		{"global/networks/default", "regions/europe-west1/subnetworks/proxies-ew1", 400, "belongs to network proxies"},
		{"global/networks/proxies", "projects/" + project + "/regions/europe-west1/subnetworks/proxies-ew1", 0, ""},
		{"", "", 0, ""},
	} {
		ni := &computepb.NetworkInterface{}
		if c.network != "" {
			ni.Network = proto.String(c.network)
		}
		if c.subnetwork != "" {
			ni.Subnetwork = proto.String(c.subnetwork)
		}
		_, err := ic.Insert(t.Context(), &computepb.InsertInstanceRequest{Project: project, Zone: zone, InstanceResource: &computepb.Instance{
			Name: proto.String(fmt.Sprintf("vm-%d", i)), NetworkInterfaces: []*computepb.NetworkInterface{ni}}})
		if c.code == 0 && err != nil {
			t.Errorf("%s %s refused: %v", c.network, c.subnetwork, err)
		}
		if c.code != 0 && (err == nil || apiErr(t, err).Code != c.code || !strings.Contains(err.Error(), c.says)) {
			t.Errorf("%s %s: %v, want %d saying %q", c.network, c.subnetwork, err, c.code, c.says)
		}
	}
}

// TestMachineTypeSizes: the fake answers a machine type's guestCpus as GCE does (the
// vCPU count of a predefined type, 2 for the shared-core e2 types) and 404 for a type it
// does not know.
func TestMachineTypeSizes(t *testing.T) {
	s := New(project, zone)
	t.Cleanup(s.Close)
	mc, err := compute.NewMachineTypesRESTClient(t.Context(), option.WithEndpoint(s.URL), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mc.Close() })
	for name, want := range map[string]int32{"e2-micro": 2, "e2-small": 2, "n2d-standard-4": 4, "c3-highcpu-22": 22} {
		mt, err := mc.Get(t.Context(), &computepb.GetMachineTypeRequest{Project: project, Zone: zone, MachineType: name})
		if err != nil || mt.GetGuestCpus() != want {
			t.Errorf("%s: %d vCPUs, %v; want %d", name, mt.GetGuestCpus(), err, want)
		}
	}
	_, err = mc.Get(t.Context(), &computepb.GetMachineTypeRequest{Project: project, Zone: zone, MachineType: "z9-mega-1"})
	if ae := apiErr(t, err); ae.Code != 404 {
		t.Errorf("unknown type: %v", err)
	}
}

// TestFirewallPatch: a patch replaces the fields it sets (a list whole) once its
// operation is done; like GCE, the fake refuses one renaming the rule or moving it to
// another network, or mixing address families, and one of a rule it lacks is 404.
func TestFirewallPatch(t *testing.T) {
	s, _, fc := clients(t)
	s.PutFirewall(&computepb.Firewall{Name: proto.String("rule-p"), Network: proto.String("global/networks/default"),
		SourceRanges: []string{"192.0.2.0/24"}, TargetTags: []string{"t"}, Description: proto.String("d")})
	op, err := fc.Patch(t.Context(), &computepb.PatchFirewallRequest{Project: project, Firewall: "rule-p",
		FirewallResource: &computepb.Firewall{SourceRanges: []string{"198.51.100.0/24", "203.0.113.0/24"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	fw := s.Firewall("rule-p")
	if got := fw.GetSourceRanges(); len(got) != 2 || got[0] != "198.51.100.0/24" || fw.GetDescription() != "d" || fw.GetTargetTags()[0] != "t" {
		t.Errorf("after the patch: %v", fw)
	}
	for _, c := range []struct {
		name string
		body *computepb.Firewall
		code int
	}{
		{"rule-p", &computepb.Firewall{Name: proto.String("rule-q")}, 400},
		{"rule-p", &computepb.Firewall{Network: proto.String("global/networks/other")}, 400},
		{"rule-p", &computepb.Firewall{SourceRanges: []string{"192.0.2.0/24", "2001:db8::/32"}}, 400},
		{"rule-missing", &computepb.Firewall{SourceRanges: []string{"192.0.2.0/24"}}, 404},
	} {
		_, err := fc.Patch(t.Context(), &computepb.PatchFirewallRequest{Project: project, Firewall: c.name, FirewallResource: c.body})
		if err == nil || apiErr(t, err).Code != c.code {
			t.Errorf("patch %s with %v: %v, want %d", c.name, c.body, err, c.code)
		}
	}
	if got := s.Firewall("rule-p").GetSourceRanges(); got[0] != "198.51.100.0/24" {
		t.Errorf("a refused patch changed the rule: %v", got)
	}
}
