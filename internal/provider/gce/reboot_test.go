package gce

import (
	"strings"
	"testing"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/protobuf/proto"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/gcefake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/ident"
)

// TestRebootByStatus: a running instance is reset (instances.reset, its operation waited
// for), a stopped one started; a suspended one is left for a person, one in passing
// states is transient; API failures keep their class.
func TestRebootByStatus(t *testing.T) {
	cases := []struct {
		name    string
		status  string // set on the fake before the reboot; "" leaves it RUNNING
		fail    *gcefake.Failure
		failOn  string
		class   error // nil for success
		message string
		resets  int // instances.reset calls
		starts  int // instances.start calls
		restart int // completed resets and starts
		after   string
	}{
		{name: "running is reset", resets: 1, restart: 1, after: "RUNNING"},
		{name: "terminated is started", status: "TERMINATED", starts: 1, restart: 1, after: "RUNNING"},
		{name: "stopped is started", status: "STOPPED", starts: 1, restart: 1, after: "RUNNING"},
		{name: "suspended is left alone", status: "SUSPENDED", class: provider.ErrPermanent, after: "SUSPENDED",
			message: "is SUSPENDED and is not rebooted by the operator; resume or delete it (gcloud compute instances resume proxy-0000000000000r01 --zone " + testZone + ")"},
		{name: "staging is transient", status: "STAGING", class: provider.ErrTransient, after: "STAGING",
			message: "instance proxy-0000000000000r01 in zone " + testZone + " is STAGING; rebooting it once it settles"},
		{name: "repairing is transient", status: "REPAIRING", class: provider.ErrTransient, after: "REPAIRING", message: "is REPAIRING"},
		{name: "stopping is transient", status: "STOPPING", class: provider.ErrTransient, after: "STOPPING", message: "is STOPPING"},
		{name: "a rate-limited reset is transient", failOn: gcefake.InstancesReset,
			fail: &gcefake.Failure{Code: 429, Reason: "rateLimitExceeded"}, class: provider.ErrTransient, resets: 1, after: "RUNNING",
			message: "resetting instance proxy-0000000000000r01 in zone " + testZone},
		{name: "a reset whose operation fails busy is transient", failOn: gcefake.InstancesReset,
			fail: &gcefake.Failure{OpCode: "RESOURCE_NOT_READY"}, class: provider.ErrTransient, resets: 1, after: "RUNNING",
			message: "RESOURCE_NOT_READY"},
		{name: "a forbidden reset is permanent", failOn: gcefake.InstancesReset,
			fail: &gcefake.Failure{Code: 403, Reason: "forbidden", Message: "Required 'compute.instances.reset' permission"}, class: provider.ErrPermanent,
			resets: 1, after: "RUNNING", message: "compute.instances.reset"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			req := request("proxy-0000000000000r01", "uid-r01")
			inst, err := e.p.Create(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			before := e.fake.Instance(testZone, req.Name)
			if c.status != "" {
				e.fake.SetInstanceStatus(testZone, req.Name, c.status)
			}
			if c.fail != nil {
				e.fake.Fail(c.failOn, *c.fail)
			}
			resets, starts := e.fake.CallCount(gcefake.InstancesReset), e.fake.CallCount(gcefake.InstancesStart)
			err = e.p.Reboot(t.Context(), inst.ProviderID)
			if c.class == nil && err != nil {
				t.Fatalf("reboot: %v", err)
			}
			if c.class != nil {
				if provider.Class(err) != c.class || !strings.Contains(err.Error(), c.message) {
					t.Fatalf("reboot: %v (class %s), want %s mentioning %q", err, provider.ClassName(err), provider.ClassName(provider.WithClass(c.class, err)), c.message)
				}
			}
			if n := e.fake.CallCount(gcefake.InstancesReset) - resets; n != c.resets {
				t.Errorf("%d instances.reset calls, want %d", n, c.resets)
			}
			if n := e.fake.CallCount(gcefake.InstancesStart) - starts; n != c.starts {
				t.Errorf("%d instances.start calls, want %d", n, c.starts)
			}
			if n := e.fake.Restarts(testZone, req.Name); n != c.restart {
				t.Errorf("%d completed resets and starts, want %d", n, c.restart)
			}
			after := e.fake.Instance(testZone, req.Name)
			if after.GetStatus() != c.after || after.GetId() != before.GetId() || after.GetName() != req.Name {
				t.Fatalf("after the reboot the instance is %s (id %d), want %s, id %d", after.GetStatus(), after.GetId(), c.after, before.GetId())
			}
			if c.resets == 1 && c.class == nil {
				got, err := e.p.Get(t.Context(), inst.ProviderID)
				if err != nil || got.IP != inst.IP || got.ProviderID != inst.ProviderID || got.State != provider.StateRunning {
					t.Fatalf("get after the reset: %+v, %v; want it running on %s", got, err, inst.IP)
				}
				logs := e.logs.all()
				if !strings.Contains(logs, `"method"="instances.reset" "zone"="`+testZone+`" "instance"="`+req.Name+`"`) ||
					!strings.Contains(logs, `"msg"="instance rebooted" "provider"="gcp-test" "project"="`+testProject+`" "instance"="`+req.Name+`" "zone"="`+testZone+`" "how"="reset"`) {
					t.Errorf("no gce call line for instances.reset or instance rebooted line in:\n%s", logs)
				}
			}
		})
	}
}

// TestRebootRefusals: an instance that is not this provider entry's and install's is
// never reset; a gone one is ErrNotFound; a providerID of another project, or malformed,
// is ErrPermanent.
func TestRebootRefusals(t *testing.T) {
	e := newEnv(t)
	put := func(name string, labels map[string]string) string {
		e.fake.PutInstance(testZone, &computepb.Instance{Name: proto.String(name), Labels: labels})
		return ident.ProviderID(testProject, testZone, name)
	}
	cases := []struct {
		id, name string
		class    error
		message  string
	}{
		{put("proxy-00000000000000b1", map[string]string{LabelProvider: "gcp-test", LabelInstall: "install-b", LabelUID: "u1"}), "proxy-00000000000000b1",
			provider.ErrPermanent, `instance proxy-00000000000000b1 in zone ` + testZone + ` belongs to install "install-b" of the operator, not to this install "install-a", and is not rebooted`},
		{put("proxy-00000000000000b2", map[string]string{LabelProvider: "another-entry", LabelInstall: testInstall}), "proxy-00000000000000b2",
			provider.ErrPermanent, "is not labelled epo-provider=gcp-test: it was not made by gce provider gcp-test and is not rebooted"},
		{put("proxy-00000000000000b3", nil), "proxy-00000000000000b3", provider.ErrPermanent, "is not labelled epo-provider=gcp-test"},
		{ident.ProviderID(testProject, testZone, "proxy-00000000000000b4"), "", provider.ErrNotFound, "reading instance proxy-00000000000000b4 in zone " + testZone},
		{ident.ProviderID("another-project", testZone, "proxy-00000000000000b5"), "", provider.ErrPermanent, `names project "another-project", not gce.project "` + testProject + `"`},
		{"gce://" + testProject + "/proxy-00000000000000b6", "", provider.ErrPermanent, "is not gce://<project>/<zone>/<name>"},
	}
	for _, c := range cases {
		var before *computepb.Instance
		if c.name != "" {
			before = e.fake.Instance(testZone, c.name)
		}
		err := e.p.Reboot(t.Context(), c.id)
		if provider.Class(err) != c.class || !strings.Contains(err.Error(), c.message) {
			t.Errorf("reboot of %s: %v (class %s), want %s mentioning %q", c.id, err, provider.ClassName(err), provider.ClassName(provider.WithClass(c.class, err)), c.message)
		}
		if c.name != "" && !proto.Equal(before, e.fake.Instance(testZone, c.name)) {
			t.Errorf("instance %s changed by a refused reboot", c.name)
		}
	}
	if n := e.fake.CallCount(gcefake.InstancesReset) + e.fake.CallCount(gcefake.InstancesStart); n != 0 {
		t.Errorf("%d reset or start calls for refused reboots, want none", n)
	}
}
