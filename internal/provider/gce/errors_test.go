package gce

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/gcefake"
)

// classNamed is the class ErrorShapes names, as provider.ClassName spells it.
func classNamed(t *testing.T, name string) error {
	t.Helper()
	switch name {
	case "permanent":
		return provider.ErrPermanent
	case "quota":
		return provider.ErrQuotaExceeded
	case "transient":
		return provider.ErrTransient
	}
	t.Fatalf("error shapes name class %q", name)
	return nil
}

// shapeText is what an error of shape s must show: its reason or code, else its message.
func shapeText(s gcefake.Shape) string {
	switch {
	case s.Failure.OpCode != "":
		return s.Failure.OpCode
	case s.Failure.Reason != "":
		return s.Failure.Reason
	}
	return s.Failure.Message
}

// TestCreateErrorMapping: every real error shape of gcefake.ErrorShapes, injected into
// the insert, and the class and message Create returns. Operation errors are read from
// the operation's own error list, with or without an httpErrorStatusCode (the client's
// Wait would return nil for the second kind). An "adopt" shape makes Create read the
// instance again and go on.
func TestCreateErrorMapping(t *testing.T) {
	for _, s := range gcefake.ErrorShapes {
		t.Run(s.Name, func(t *testing.T) {
			e := newEnv(t)
			e.fake.Fail(gcefake.InstancesInsert, s.Failure)
			inst, err := e.p.Create(t.Context(), request("proxy-00000000000000e1", "uid-1"))
			if s.Class == "adopt" {
				if err != nil || inst.State != provider.StateRunning || e.fake.CallCount(gcefake.InstancesInsert) != 2 {
					t.Fatalf("create after %s: %+v, %v, %d inserts; want it read again and built", s.Name, inst, err, e.fake.CallCount(gcefake.InstancesInsert))
				}
				return
			}
			if err == nil {
				t.Fatal("create succeeded")
			}
			if got, want := provider.Class(err), classNamed(t, s.Class); got != want {
				t.Errorf("class %v, want %v: %v", got, want, err)
			}
			if !strings.Contains(err.Error(), shapeText(s)) || !strings.Contains(err.Error(), "proxy-00000000000000e1") {
				t.Errorf("error %q does not hold %q and the instance name", err, shapeText(s))
			}
			if errors.Is(err, provider.ErrOwnedByOther) {
				t.Errorf("marked owned by other: %v", err)
			}
			// Whatever failed, the next Create succeeds: a failed operation's requestId is
			// not replayed.
			inst, err = e.p.Create(t.Context(), request("proxy-00000000000000e1", "uid-1"))
			if err != nil || inst.State != provider.StateRunning {
				t.Fatalf("second create: %+v, %v", inst, err)
			}
		})
	}
}

// TestDeleteErrorMapping: the same shapes on the instance's delete. A transient one
// (the 400 resourceNotReady of an instance still busy) must not be permanent, or the
// Proxy's finalizer would let go of a VM that is still billed.
func TestDeleteErrorMapping(t *testing.T) {
	for _, s := range gcefake.ErrorShapes {
		if s.Class == "adopt" || s.Failure.Code == 404 {
			continue // not answers a delete gets (a 404 there is success)
		}
		t.Run(s.Name, func(t *testing.T) {
			e := newEnv(t)
			inst, err := e.p.Create(t.Context(), request("proxy-00000000000000e5", "uid-5"))
			if err != nil {
				t.Fatal(err)
			}
			e.fake.Fail(gcefake.InstancesDelete, s.Failure)
			err = e.p.Delete(t.Context(), inst.ProviderID)
			if got, want := provider.Class(err), classNamed(t, s.Class); got != want {
				t.Errorf("class %v, want %v: %v", got, want, err)
			}
			if err == nil || !strings.Contains(err.Error(), shapeText(s)) || !strings.Contains(err.Error(), "deleting instance proxy-00000000000000e5") {
				t.Errorf("error %v does not hold %q and the call", err, shapeText(s))
			}
			if err := e.p.Delete(t.Context(), inst.ProviderID); err != nil || e.fake.Instances() != 0 {
				t.Fatalf("delete again: %v, %d instances left", err, e.fake.Instances())
			}
		})
	}
}

// TestOtherShapesErrorMapping: the calls around the insert.
func TestOtherShapesErrorMapping(t *testing.T) {
	cases := []struct {
		name, method string
		f            gcefake.Failure
		class        error
		msg          string
	}{
		{"get 500 before the insert", gcefake.InstancesGet, gcefake.ShapeNamed("sync 500 backendError"), provider.ErrTransient, "reading instance"},
		{"get 401", gcefake.InstancesGet, gcefake.ShapeNamed("sync 401 authError"), provider.ErrPermanent, "Error 401"},
		{"operation poll 500", gcefake.ZoneOperationsGet, gcefake.ShapeNamed("sync 500 backendError"), provider.ErrTransient, "polling operation operation-1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			e.fake.Fail(c.method, c.f)
			_, err := e.p.Create(t.Context(), request("proxy-00000000000000e1", "uid-1"))
			if got := provider.Class(err); got != c.class || !strings.Contains(fmt.Sprint(err), c.msg) {
				t.Errorf("%v (class %v), want class %v holding %q", err, got, c.class, c.msg)
			}
		})
	}
}

// TestErrorMappingTableInDocs: the error mapping table of docs/gce-provider.md is the one
// rendered from gcefake.ErrorShapes.
func TestErrorMappingTableInDocs(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/gce-provider.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := errorMappingTable(); !strings.Contains(string(doc), want) {
		t.Errorf("docs/gce-provider.md does not hold the error mapping table of gcefake.ErrorShapes; it should read:\n%s", want)
	}
}

// errorMappingTable renders ErrorShapes as the docs' markdown table.
func errorMappingTable() string {
	verdict := map[string]string{
		"transient": "ErrTransient",
		"quota":     "ErrQuotaExceeded: retried after `--quota-retry`",
		"permanent": "ErrPermanent",
		"adopt":     "the instance is read again and adopted (or refused, by the ownership rules)",
	}
	var b strings.Builder
	b.WriteString("| what GCE says | class |\n|---|---|\n")
	for _, s := range gcefake.ErrorShapes {
		if s.Says != "" {
			fmt.Fprintf(&b, "| %s | %s |\n", s.Says, verdict[s.Class])
		}
	}
	b.WriteString("| no HTTP answer (network, deadline), credentials not found | ErrTransient |\n")
	return b.String()
}

// TestRetriedInsertKeepsItsRequestID: an insert that failed before any operation began
// is retried with the same requestId (so a lost answer cannot make two instances), and
// one whose operation failed gets a fresh one (GCE would replay the failed operation).
func TestRetriedInsertKeepsItsRequestID(t *testing.T) {
	e := newEnv(t)
	req := request("proxy-00000000000000e2", "uid-2")
	e.fake.Fail(gcefake.InstancesInsert, gcefake.ShapeNamed("sync 503 backendError"))
	e.fake.Fail(gcefake.InstancesInsert, gcefake.ShapeNamed("operation ZONE_RESOURCE_POOL_EXHAUSTED 503"))
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
	e.fake.Fail(gcefake.InstancesDelete, gcefake.ShapeNamed("operation RESOURCE_NOT_READY 400"))
	if err := e.p.Delete(t.Context(), inst.ProviderID); provider.Class(err) != provider.ErrTransient {
		t.Errorf("delete with a RESOURCE_NOT_READY operation: %v, want transient", err)
	}
	e.fake.Fail(gcefake.InstancesDelete, gcefake.ShapeNamed("sync 403 forbidden"))
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
