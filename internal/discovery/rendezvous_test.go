package discovery

import (
	"fmt"
	"testing"
)

func pool(n int, skip string) *Snapshot {
	var es []Entry
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("proxy-%02d", i)
		if name == skip {
			continue
		}
		es = append(es, Entry{Name: name, Namespace: "crawl", URL: "http://" + name, Healthy: true})
	}
	return NewSnapshot(es)
}

func assignments(s *Snapshot, keys int) []string {
	out := make([]string, keys)
	for i := range out {
		out[i] = s.pick(fmt.Sprintf("session-%d", i), &filter{}, nil).Name
	}
	return out
}

// With 20 proxies and 10,000 keys, removing one proxy moves exactly the keys it held
// (about 1/20 of them) and nothing else; every other key keeps its proxy.
func TestRendezvousMinimalMovement(t *testing.T) {
	const keys, n = 10000, 20
	before := assignments(pool(n, ""), keys)
	perProxy := map[string]int{}
	for _, p := range before {
		perProxy[p]++
	}
	if len(perProxy) != n {
		t.Fatalf("keys landed on %d of %d proxies", len(perProxy), n)
	}
	for p, c := range perProxy { // expected 500 each, sd ~22: a 30% band is > 6 sd
		if c < 350 || c > 650 {
			t.Errorf("%s holds %d of %d keys; want 350..650 (uniform spread)", p, c, keys)
		}
	}
	const gone = "proxy-07"
	after := assignments(pool(n, gone), keys)
	moved, redistributed := 0, map[string]int{}
	for i := range before {
		if before[i] == after[i] {
			continue
		}
		moved++
		if before[i] != gone {
			t.Fatalf("key %d moved from %s (still healthy) to %s", i, before[i], after[i])
		}
		redistributed[after[i]]++
	}
	if moved != perProxy[gone] {
		t.Fatalf("%d keys moved, but %s held %d", moved, gone, perProxy[gone])
	}
	if moved < keys/n*7/10 || moved > keys/n*13/10 {
		t.Errorf("%d of %d keys moved; want about %d (1/%d)", moved, keys, keys/n, n)
	}
	if len(redistributed) < n-1-2 {
		t.Errorf("the moved keys went to only %d of the %d remaining proxies", len(redistributed), n-1)
	}
	t.Logf("removing 1 of %d proxies moved %d of %d keys (%.2f%%), spread over %d proxies",
		n, moved, keys, 100*float64(moved)/keys, len(redistributed))

	// Adding it back restores the original assignment exactly.
	again := assignments(pool(n, ""), keys)
	for i := range before {
		if before[i] != again[i] {
			t.Fatalf("key %d: %s before, %s after the proxy came back", i, before[i], again[i])
		}
	}
}

func TestRendezvousIndependentOfOrder(t *testing.T) {
	a := NewSnapshot([]Entry{{Name: "x", Namespace: "n", Healthy: true}, {Name: "y", Namespace: "n", Healthy: true}, {Name: "z", Namespace: "m", Healthy: true}})
	b := NewSnapshot([]Entry{{Name: "z", Namespace: "m", Healthy: true}, {Name: "y", Namespace: "n", Healthy: true}, {Name: "x", Namespace: "n", Healthy: true}})
	for i := 0; i < 1000; i++ {
		k := fmt.Sprint(i)
		if pa, pb := a.pick(k, &filter{}, nil), b.pick(k, &filter{}, nil); pa.Name != pb.Name {
			t.Fatalf("key %s: %s vs %s depending on input order", k, pa.Name, pb.Name)
		}
	}
	if NewSnapshot(nil).pick("k", &filter{}, nil) != nil {
		t.Error("empty snapshot picked something")
	}
}
