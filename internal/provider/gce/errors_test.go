package gce

import (
	"errors"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/gcefake"
)

// TestCreateErrorMapping: one row per failure GCE reports, injected into the fake on the
// call named, and the class and message Create returns. Operation errors are read from
// the operation's own error list, with or without an httpErrorStatusCode (the client's
// Wait would return nil for the second kind).
func TestCreateErrorMapping(t *testing.T) {
	cases := []struct {
		name, method string
		f            gcefake.Failure
		class        error
		msg          string
	}{
		{"operation QUOTA_EXCEEDED without HTTP status", gcefake.InstancesInsert,
			gcefake.Failure{OpCode: "QUOTA_EXCEEDED", Message: "Quota 'CPUS' exceeded.  Limit: 24.0 in region europe-west1."},
			provider.ErrQuotaExceeded, "operation operation-1 failed: QUOTA_EXCEEDED: Quota 'CPUS' exceeded."},
		{"operation QUOTA_EXCEEDED with HTTP 403", gcefake.InstancesInsert,
			gcefake.Failure{OpCode: "QUOTA_EXCEEDED", OpHTTPStatus: 403}, provider.ErrQuotaExceeded, "QUOTA_EXCEEDED"},
		{"operation ZONE_RESOURCE_POOL_EXHAUSTED", gcefake.InstancesInsert,
			gcefake.Failure{OpCode: "ZONE_RESOURCE_POOL_EXHAUSTED"}, provider.ErrQuotaExceeded, "ZONE_RESOURCE_POOL_EXHAUSTED"},
		{"operation ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS with HTTP 503", gcefake.InstancesInsert,
			gcefake.Failure{OpCode: "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", OpHTTPStatus: 503}, provider.ErrQuotaExceeded, "RESOURCE_POOL_EXHAUSTED"},
		{"operation INVALID_FIELD_VALUE with HTTP 400", gcefake.InstancesInsert,
			gcefake.Failure{OpCode: "INVALID_FIELD_VALUE", OpHTTPStatus: 400}, provider.ErrPermanent, "INVALID_FIELD_VALUE"},
		{"operation INTERNAL_ERROR with HTTP 500", gcefake.InstancesInsert,
			gcefake.Failure{OpCode: "INTERNAL_ERROR", OpHTTPStatus: 500}, provider.ErrTransient, "INTERNAL_ERROR"},
		{"operation INTERNAL_ERROR without HTTP status", gcefake.InstancesInsert,
			gcefake.Failure{OpCode: "INTERNAL_ERROR"}, provider.ErrTransient, "INTERNAL_ERROR"},
		{"operation with an unknown code and no HTTP status", gcefake.InstancesInsert,
			gcefake.Failure{OpCode: "IMAGE_NOT_FOUND_SOMEWHERE"}, provider.ErrPermanent, "IMAGE_NOT_FOUND_SOMEWHERE"},
		{"synchronous 403 rateLimitExceeded", gcefake.InstancesInsert,
			gcefake.Failure{Code: 403, Reason: "rateLimitExceeded", Message: "Rate Limit Exceeded"}, provider.ErrTransient, "rateLimitExceeded"},
		{"synchronous 429", gcefake.InstancesInsert,
			gcefake.Failure{Code: 429, Reason: "rateLimitExceeded"}, provider.ErrTransient, "Error 429"},
		{"synchronous 500", gcefake.InstancesInsert, gcefake.Failure{Code: 500, Reason: "backendError"}, provider.ErrTransient, "Error 500"},
		{"synchronous 502", gcefake.InstancesInsert, gcefake.Failure{Code: 502}, provider.ErrTransient, "Error 502"},
		{"synchronous 400 invalid", gcefake.InstancesInsert,
			gcefake.Failure{Code: 400, Reason: "invalid", Message: "Invalid value for field 'resource.machineType'"}, provider.ErrPermanent, "Error 400"},
		{"synchronous 403 forbidden", gcefake.InstancesInsert,
			gcefake.Failure{Code: 403, Reason: "forbidden", Message: "Required 'compute.instances.create' permission"}, provider.ErrPermanent, "compute.instances.create"},
		{"synchronous 403 quotaExceeded", gcefake.InstancesInsert,
			gcefake.Failure{Code: 403, Reason: "quotaExceeded"}, provider.ErrQuotaExceeded, "quotaExceeded"},
		{"synchronous 404 of the insert (an image family that does not exist)", gcefake.InstancesInsert,
			gcefake.Failure{Code: 404, Reason: "notFound", Message: "The resource 'projects/debian-cloud/global/images/family/debian-99' was not found"},
			provider.ErrPermanent, "family/debian-99"},
		{"get 500 before the insert", gcefake.InstancesGet, gcefake.Failure{Code: 500}, provider.ErrTransient, "reading instance"},
		{"get 401", gcefake.InstancesGet, gcefake.Failure{Code: 401, Reason: "authError"}, provider.ErrPermanent, "Error 401"},
		{"operation poll 500", gcefake.ZoneOperationsGet, gcefake.Failure{Code: 500}, provider.ErrTransient, "polling operation operation-1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			e.fake.Fail(c.method, c.f)
			_, err := e.p.Create(t.Context(), request("proxy-00000000000000e1", "uid-1"))
			if err == nil {
				t.Fatal("create succeeded")
			}
			if got := provider.Class(err); got != c.class {
				t.Errorf("class %v, want %v: %v", got, c.class, err)
			}
			if !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), "proxy-00000000000000e1") {
				t.Errorf("error %q does not hold %q and the instance name", err, c.msg)
			}
			if errors.Is(err, provider.ErrOwnedByOther) {
				t.Errorf("marked owned by other: %v", err)
			}
			// Whatever failed, the next Create succeeds: a failed operation's requestId is
			// not replayed.
			inst, err := e.p.Create(t.Context(), request("proxy-00000000000000e1", "uid-1"))
			if err != nil || inst.State != provider.StateRunning {
				t.Fatalf("second create: %+v, %v", inst, err)
			}
		})
	}
}

// TestRetriedInsertKeepsItsRequestID: an insert that failed before any operation began
// is retried with the same requestId (so a lost answer cannot make two instances), and
// one whose operation failed gets a fresh one (GCE would replay the failed operation).
func TestRetriedInsertKeepsItsRequestID(t *testing.T) {
	e := newEnv(t)
	req := request("proxy-00000000000000e2", "uid-2")
	e.fake.Fail(gcefake.InstancesInsert, gcefake.Failure{Code: 503})
	e.fake.Fail(gcefake.InstancesInsert, gcefake.Failure{OpCode: "ZONE_RESOURCE_POOL_EXHAUSTED"})
	for range 2 {
		if _, err := e.p.Create(t.Context(), req); err == nil {
			t.Fatal("create succeeded with a failure injected")
		}
	}
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range e.fake.Calls() {
		if c.Method == gcefake.InstancesInsert {
			ids = append(ids, c.RequestID)
		}
	}
	if len(ids) != 3 || ids[0] != ids[1] || ids[2] == ids[1] {
		t.Errorf("insert requestIds %q: want the first two equal and the third fresh", ids)
	}
	// Another provider (a restarted manager) derives the same first ID.
	if got := requestID(0, "insert", testProject, testZone, req.Name, req.UID, req.SpecHash); got != ids[0] {
		t.Errorf("requestID after a restart %s, want %s", got, ids[0])
	}
}

// TestInsertConflictAdopts: an insert answered 409 alreadyExists (the instance was made
// between the Get and the Insert) reads the instance again and adopts it.
func TestInsertConflictAdopts(t *testing.T) {
	e := newEnv(t)
	req := request("proxy-00000000000000e3", "uid-3")
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	e.fake.Fail(gcefake.InstancesGet, gcefake.Failure{Code: 404, Reason: "notFound"})
	inst, err := e.p.Create(t.Context(), req)
	if err != nil || inst.UID != "uid-3" || inst.State != provider.StateRunning {
		t.Fatalf("create after a conflict: %+v, %v", inst, err)
	}
	if n := e.fake.CallCount(gcefake.InstancesInsert); n != 2 {
		t.Errorf("%d inserts, want 2 (the second answered 409)", n)
	}
	if e.fake.Instances() != 1 {
		t.Errorf("%d instances, want 1", e.fake.Instances())
	}
}

// TestOtherCallsErrorMapping: Get, Delete and ListByTag classes.
func TestOtherCallsErrorMapping(t *testing.T) {
	e := newEnv(t)
	inst, err := e.p.Create(t.Context(), request("proxy-00000000000000e4", "uid-4"))
	if err != nil {
		t.Fatal(err)
	}
	e.fake.Fail(gcefake.InstancesGet, gcefake.Failure{Code: 503})
	e.fake.Fail(gcefake.InstancesGet, gcefake.Failure{Code: 500})
	if _, err := e.p.Get(t.Context(), inst.ProviderID); provider.Class(err) != provider.ErrTransient {
		t.Errorf("get with 503 then 500: %v, want transient", err)
	}
	e.fake.Fail(gcefake.InstancesDelete, gcefake.Failure{OpCode: "RESOURCE_NOT_READY"})
	if err := e.p.Delete(t.Context(), inst.ProviderID); provider.Class(err) != provider.ErrTransient {
		t.Errorf("delete with a RESOURCE_NOT_READY operation: %v, want transient", err)
	}
	e.fake.Fail(gcefake.InstancesDelete, gcefake.Failure{Code: 403, Reason: "forbidden"})
	if err := e.p.Delete(t.Context(), inst.ProviderID); provider.Class(err) != provider.ErrPermanent {
		t.Errorf("delete answered 403: %v, want permanent", err)
	}
	e.fake.Fail(gcefake.InstancesAggregatedList, gcefake.Failure{Code: 500})
	if list, err := e.p.ListByTag(t.Context()); provider.Class(err) != provider.ErrTransient || list != nil {
		t.Errorf("list answered 500: %v, %v; want transient and nothing", list, err)
	}
	if err := e.p.Delete(t.Context(), inst.ProviderID); err != nil {
		t.Fatalf("delete after the failures: %v", err)
	}
	if _, err := e.p.Get(t.Context(), inst.ProviderID); provider.Class(err) != provider.ErrNotFound {
		t.Errorf("get after delete: %v, want not found", err)
	}
	// A providerID of another project (the config moved): the instance may still be
	// there, so Delete says left behind, with the command that removes it.
	err = e.p.Delete(t.Context(), "gce://old-project/"+testZone+"/proxy-00000000000000e4")
	if provider.Class(err) != provider.ErrPermanent || !errors.Is(err, provider.ErrLeftBehind) ||
		!strings.Contains(err.Error(), "gcloud compute instances delete proxy-00000000000000e4 --zone "+testZone+" --project old-project") {
		t.Errorf("delete in another project: %v", err)
	}
	for _, id := range []string{"gce:/x", "aws://a/b/c"} {
		if err := e.p.Delete(t.Context(), id); provider.Class(err) != provider.ErrPermanent || errors.Is(err, provider.ErrLeftBehind) {
			t.Errorf("delete %s: %v, want permanent, not left behind", id, err)
		}
	}
	for _, id := range []string{"gce://other-project/" + testZone + "/x", "gce:/x", "aws://a/b/c"} {
		if _, err := e.p.Get(t.Context(), id); provider.Class(err) != provider.ErrPermanent {
			t.Errorf("get %s: %v, want permanent", id, err)
		}
	}
}
