package pool

import (
	"fmt"
	"slices"
	"testing"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

func TestSortForDeletionRandomIsStablePerSeed(t *testing.T) {
	mk := func() []*poolChild {
		var cs []*poolChild
		for i := 0; i < 8; i++ {
			c := kid(fmt.Sprintf("c%d", i), i, "g")
			cs = append(cs, &c)
		}
		return cs
	}
	order := func(seed string) []string {
		cs := mk()
		sortForDeletion(cs, v1alpha1.DeletionOrderRandom, seed)
		var out []string
		for _, c := range cs {
			out = append(out, c.name)
		}
		return out
	}
	a, b, other := order("pool-uid"), order("pool-uid"), order("another-uid")
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different orders: %v, %v", a, b)
	}
	if slices.Equal(a, other) {
		t.Errorf("two seeds gave the same order %v", a)
	}
	if slices.IsSorted(a) || slices.Equal(a, order("")) && slices.IsSorted(order("")) {
		t.Errorf("random order %v is just the names' order", a)
	}
}
