package v1alpha1

import "k8s.io/apimachinery/pkg/api/resource"

// Cost is what something costs per hour, in one currency, by the list prices of the
// providers config (docs/pools.md, "Cost"). A Proxy's is the price of its machine type
// and of its external IPv4 address, shown while it has an instance; a pool's is the sum
// of its children's.
type Cost struct {
	// Hourly is the price per hour, a decimal in Kubernetes quantity notation (0.021751
	// shows as 21751u, 0.5 as 500m).
	// +required
	Hourly resource.Quantity `json:"hourly"`
	// Currency is the ISO 4217 code of the currency Hourly is in, such as USD or EUR.
	// +kubebuilder:validation:Pattern=`^[A-Z]{3}$`
	// +required
	Currency string `json:"currency"`
}
