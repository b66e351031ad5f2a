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

// sharedPool is a snapshot of proxies, each leaving from the address byName gives it
// ("" for unknown), except skip.
func sharedPool(byName map[string]string, skip string) *Snapshot {
	var es []Entry
	for name, ip := range byName {
		if name != skip {
			es = append(es, Entry{Name: name, Namespace: "crawl", URL: "http://" + name, Healthy: true, EgressIP: ip})
		}
	}
	return NewSnapshot(es)
}

// Keys spread over distinct egress addresses, not over VMs: 6 proxies on 3 addresses (1,
// 2 and 3 proxies on them) each take a third of 10,000 keys, within ±5 % of a third,
// where one round over the proxies would give them a sixth, a third and a half.
func TestRendezvousSpreadsOverEgressAddresses(t *testing.T) {
	const keys = 10000
	byName := map[string]string{
		"a1": "198.51.100.1",
		"b1": "198.51.100.2", "b2": "198.51.100.2",
		"c1": "198.51.100.3", "c2": "198.51.100.3", "c3": "198.51.100.3",
	}
	perAddr, perProxy := map[string]int{}, map[string]int{}
	for _, p := range assignments(sharedPool(byName, ""), keys) {
		perAddr[byName[p]]++
		perProxy[p]++
	}
	const third = keys / 3.0
	for _, ip := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"} {
		if n := float64(perAddr[ip]); n < third*0.95 || n > third*1.05 {
			t.Errorf("%s holds %d of %d keys; want a third within ±5 %% (%.0f..%.0f)", ip, perAddr[ip], keys, third*0.95, third*1.05)
		}
	}
	// Within an address, its keys spread over its proxies (each of c1..c3 about a ninth).
	for _, p := range []string{"c1", "c2", "c3"} {
		if n := perProxy[p]; n < keys/9*7/10 || n > keys/9*13/10 {
			t.Errorf("%s holds %d keys; want about %d (a third of its address's)", p, n, keys/9)
		}
	}
	t.Logf("keys per address %v, per proxy %v", perAddr, perProxy)
}

// Removing one of two proxies on one address moves its keys to the other proxy on that
// address and no key to another address; every other key stays. Removing the last proxy
// of an address moves only that address's keys. Bringing the proxy back restores the
// assignment.
func TestRendezvousSharedAddressMinimalMovement(t *testing.T) {
	const keys = 10000
	byName := map[string]string{
		"a1": "198.51.100.1", "a2": "198.51.100.1",
		"b1": "198.51.100.2", "b2": "198.51.100.2", "b3": "198.51.100.2",
		"c1": "198.51.100.3",
		"u1": "", "u2": "", // no known address: each an identity of its own
	}
	before := assignments(sharedPool(byName, ""), keys)
	after := assignments(sharedPool(byName, "a2"), keys)
	moved := 0
	for i := range before {
		if before[i] == after[i] {
			continue
		}
		moved++
		if before[i] != "a2" || after[i] != "a1" {
			t.Fatalf("key %d moved from %s to %s; only a2's keys may move, and only to a1 (same address)", i, before[i], after[i])
		}
	}
	if moved == 0 {
		t.Fatal("removing a2 moved no key: a2 held none")
	}
	again := assignments(sharedPool(byName, ""), keys)
	for i := range before {
		if before[i] != again[i] {
			t.Fatalf("key %d: %s before, %s after a2 came back", i, before[i], again[i])
		}
	}

	after = assignments(sharedPool(byName, "c1"), keys)
	for i := range before {
		if before[i] != after[i] && before[i] != "c1" {
			t.Fatalf("key %d moved from %s (still there) to %s when c1 left", i, before[i], after[i])
		}
	}
	t.Logf("removing a2 moved %d of %d keys, all to a1", moved, keys)
}

// Without known egress addresses, pick chooses exactly as one round over the proxies
// does (the assignment of an install whose probe target reports no address is kept).
func TestRendezvousUnknownEgressIsOneRound(t *testing.T) {
	s := pool(20, "")
	for i := 0; i < 2000; i++ {
		k := fmt.Sprintf("session-%d", i)
		var want *item
		var best uint64
		for j := range s.items {
			if sc := score(hashString(k), s.items[j].seed); want == nil || sc > best {
				want, best = &s.items[j], sc
			}
		}
		if got := s.pick(k, &filter{}, nil); got != want {
			t.Fatalf("key %s: picked %s, one round over the proxies picks %s", k, got.Name, want.Name)
		}
	}
}

// ?distinctEgress=true keeps one proxy per address (and every proxy without a known
// one), the same one on every request, and a proxy joining an address displaces the
// chosen one only when it outscores it.
func TestDistinctEgressChoice(t *testing.T) {
	byName := map[string]string{"a1": "198.51.100.1", "a2": "198.51.100.1", "a3": "198.51.100.1",
		"b1": "198.51.100.2", "u1": "", "u2": ""}
	chosen := func(s *Snapshot) map[string]string {
		out := map[string]string{}
		for it := range s.distinctEgress(&filter{}) {
			key := it.EgressIP
			if key == "" {
				key = it.Name
			}
			if prev, dup := out[key]; dup {
				t.Fatalf("two proxies for %s: %s and %s", key, prev, it.Name)
			}
			out[key] = it.Name
		}
		return out
	}
	first := chosen(sharedPool(byName, ""))
	if len(first) != 4 || first["u1"] != "u1" || first["u2"] != "u2" || first["198.51.100.2"] != "b1" {
		t.Fatalf("distinct choice %v; want one of a1..a3, b1, u1 and u2", first)
	}
	for i := 0; i < 5; i++ {
		if again := chosen(sharedPool(byName, "")); fmt.Sprint(again) != fmt.Sprint(first) {
			t.Fatalf("choice changed between requests: %v then %v", first, again)
		}
	}
	// Removing a proxy that was not chosen changes nothing.
	var other string
	for _, n := range []string{"a1", "a2", "a3"} {
		if n != first["198.51.100.1"] {
			other = n
			break
		}
	}
	if got := chosen(sharedPool(byName, other)); fmt.Sprint(got) != fmt.Sprint(first) {
		t.Errorf("removing %s (not chosen) changed the choice: %v, was %v", other, got, first)
	}
	// Removing the chosen one hands the address to another of its proxies.
	got := chosen(sharedPool(byName, first["198.51.100.1"]))
	if n := got["198.51.100.1"]; n == "" || n == first["198.51.100.1"] {
		t.Errorf("after removing %s, 198.51.100.1 is served by %q", first["198.51.100.1"], n)
	}
}
