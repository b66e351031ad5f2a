package v1alpha1

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// An Amount is written out in full, whatever notation the quantity had: kubectl shows
// what a reader expects of a price.
func TestAmountOf(t *testing.T) {
	for in, want := range map[string]Amount{
		"0.021751": "0.021751", "21751u": "0.021751", "500m": "0.5", "0.50": "0.5", "2": "2",
		"2k": "2000", "0": "0", "12.000": "12", "0.0008": "0.0008", "1e-3": "0.001",
	} {
		got := AmountOf(resource.MustParse(in))
		if got != want {
			t.Errorf("AmountOf(%s) = %q, want %q", in, got, want)
		}
		if q := got.Quantity(); q.Cmp(resource.MustParse(in)) != 0 {
			t.Errorf("Amount(%q).Quantity() = %s, want %s", got, q.String(), in)
		}
	}
	if q := Amount("x").Quantity(); !q.IsZero() {
		t.Errorf("an Amount that does not parse gave %s, want zero", q.String())
	}
}
