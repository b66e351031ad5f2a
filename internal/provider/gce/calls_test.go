package gce

import (
	"slices"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/gce/gcefake"
)

func methods(f *gcefake.Server) []string {
	var out []string
	for _, c := range f.Calls() {
		out = append(out, c.Method)
	}
	return out
}

// TestCallsPerOperation: the API calls each operation makes, with operations taking two
// polls: a Create is a read, the insert, the polls and a read for the address; a repeat
// Create one read; a Delete a read, the delete and the polls.
func TestCallsPerOperation(t *testing.T) {
	e := newEnv(t)
	req := request("proxy-0000000000000ca1", "u")
	inst, err := e.p.Create(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{gcefake.InstancesGet, gcefake.InstancesInsert, gcefake.ZoneOperationsGet, gcefake.ZoneOperationsGet, gcefake.InstancesGet}
	if got := methods(e.fake); !slices.Equal(got, want) {
		t.Errorf("create: %v, want %v", got, want)
	}
	if _, err := e.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if got := methods(e.fake)[len(want):]; !slices.Equal(got, []string{gcefake.InstancesGet}) {
		t.Errorf("repeat create: %v, want one read", got)
	}
	n := len(e.fake.Calls())
	if err := e.p.Delete(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	wantDel := []string{gcefake.InstancesGet, gcefake.InstancesDelete, gcefake.ZoneOperationsGet, gcefake.ZoneOperationsGet}
	if got := methods(e.fake)[n:]; !slices.Equal(got, wantDel) {
		t.Errorf("delete: %v, want %v", got, wantDel)
	}
}

// BenchmarkCreateDelete: one Create and one Delete through the official client over the
// in-process API, operations done at once.
func BenchmarkCreateDelete(b *testing.B) {
	e := newEnvB(b)
	e.fake.SetOperationPolls(0)
	req := request("proxy-0000000000000be1", "u")
	for b.Loop() {
		inst, err := e.p.Create(b.Context(), req)
		if err != nil {
			b.Fatal(err)
		}
		if err := e.p.Delete(b.Context(), inst.ProviderID); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(e.fake.Calls()))/float64(b.N), "calls/op")
}
