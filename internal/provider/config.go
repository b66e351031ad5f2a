package provider

// Config is the providers config file (--providers-config).
type Config struct {
	Providers []ProviderConfig `json:"providers"`
}

// ProviderConfig is one entry. Exactly the block named by Type is set.
type ProviderConfig struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// KVM2 is the block of a kvm2 entry.
	KVM2 *KVMConfig `json:"kvm2,omitempty"`
	// KVM is the block of a kvm (first-generation) entry; same shape as KVM2.
	KVM *KVMConfig `json:"kvm,omitempty"`
}

// Provider type names.
const (
	TypeKVM2 = "kvm2"
	TypeKVM  = "kvm"
)
