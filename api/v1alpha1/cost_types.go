package v1alpha1

import (
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Cost is what something costs per hour, in one currency, by the list prices of the
// providers config (docs/pools.md, "Cost"). A Proxy's is the price of its machine type
// and of its external IPv4 address, shown while it has an instance; a pool's is the sum
// of its children's.
type Cost struct {
	// Hourly is the price per hour, a decimal written out in full (0.021751).
	// +required
	Hourly Amount `json:"hourly"`
	// Currency is the ISO 4217 code of the currency Hourly is in, such as USD or EUR.
	// +kubebuilder:validation:Pattern=`^[A-Z]{3}$`
	// +required
	Currency string `json:"currency"`
}

// Amount is a sum of money: a non-negative decimal written out in full ("0.021751",
// "2.5", "12"), never in a Kubernetes quantity's notation, which would show 0.021751 as
// 21751u.
// +kubebuilder:validation:Pattern=`^[0-9]{1,12}(\.[0-9]{1,9})?$`
type Amount string

// AmountOf writes q out as an Amount: its decimal with no exponent and no trailing zeros
// after the point.
func AmountOf(q resource.Quantity) Amount {
	s := q.AsDec().String()
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return Amount(s)
}

// Quantity is the Amount as a quantity, for arithmetic; zero when it does not parse
// (the API server refuses such an Amount).
func (a Amount) Quantity() resource.Quantity {
	q, err := resource.ParseQuantity(string(a))
	if err != nil {
		return resource.Quantity{}
	}
	return q
}
