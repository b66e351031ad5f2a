package gce

import (
	"testing"

	"github.com/google/uuid"
)

// TestRequestIDIsUUIDv5: requestIds are name-based UUIDs of version 5 and the RFC 4122
// variant, the same for the same parts and attempt, distinct otherwise, and what the
// provider sends the API on its inserts and deletes.
func TestRequestIDIsUUIDv5(t *testing.T) {
	a := requestID(0, "insert", "p", "z", "n", "uid", "hash")
	for _, id := range []string{a, requestID(1, "insert", "p", "z", "n", "uid", "hash")} {
		u, err := uuid.Parse(id)
		if err != nil || u.Version() != 5 || u.Variant() != uuid.RFC4122 {
			t.Errorf("requestID %s: version %d, variant %v, %v; want version 5 of RFC 4122", id, u.Version(), u.Variant(), err)
		}
	}
	if a != requestID(0, "insert", "p", "z", "n", "uid", "hash") {
		t.Error("requestID is not deterministic")
	}
	for _, other := range []string{requestID(1, "insert", "p", "z", "n", "uid", "hash"), requestID(0, "insert", "p", "z", "n", "uid", "hash2"),
		requestID(0, "insert", "p", "z", "nu", "id", "hash")} {
		if other == a {
			t.Errorf("distinct inputs share requestID %s", a)
		}
	}
	e := newEnv(t)
	inst, err := e.p.Create(t.Context(), request("proxy-00000000000000d1", "uid-d1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.p.Delete(t.Context(), inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	for _, c := range e.fake.Calls() {
		if c.RequestID == "" {
			continue
		}
		if u, err := uuid.Parse(c.RequestID); err != nil || u.Version() != 5 {
			t.Errorf("%s sent requestId %s, not a version 5 UUID", c.Method, c.RequestID)
		}
	}
}
