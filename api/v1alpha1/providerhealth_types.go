package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ProviderTargetStatus is the health of one target of a provider (for kvm2, one host).
type ProviderTargetStatus struct {
	// Name of the target, for kvm2 the host's name.
	Name string `json:"name"`
	// Ready is true when the last check of the target succeeded.
	Ready bool `json:"ready"`
	// Reason is a CamelCase word saying where a check broke, or that it succeeded.
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message says what happened, in a sentence.
	// +optional
	Message string `json:"message,omitempty"`
	// Latency is how long the check took.
	// +optional
	Latency metav1.Duration `json:"latency,omitempty"`
	// LastChecked is when the target was last checked.
	// +optional
	LastChecked metav1.Time `json:"lastChecked,omitempty"`
	// Details are facts the check learnt (versions, pool sizes...).
	// +optional
	Details map[string]string `json:"details,omitempty"`
}

// ProviderHealthStatus is the result of the last check of every target of a provider.
type ProviderHealthStatus struct {
	// Ready is "<ready>/<total>" targets.
	// +optional
	Ready string `json:"ready,omitempty"`
	// +optional
	ReadyTargets int32 `json:"readyTargets,omitempty"`
	// +optional
	TotalTargets int32 `json:"totalTargets,omitempty"`
	// LastChecked is when the last round of checks finished.
	// +optional
	LastChecked *metav1.Time `json:"lastChecked,omitempty"`
	// Targets, in the order of the providers config. The monitor is the only writer and
	// replaces the list whole on every round.
	// +listType=atomic
	// +optional
	Targets []ProviderTargetStatus `json:"targets,omitempty"`
	// Conditions of the provider. RemediationAllowed is False (reason TooManyUnhealthy)
	// while remediation of the provider's standalone Proxies is held in some zone because
	// more of them than maxUnhealthy are unhealthy at once, True (WithinMaxUnhealthy)
	// otherwise; the message names the counts. Recomputed on every round of checks.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ProviderHealth is the health of one configured provider; it is named after the provider.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=ph,categories=egress
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.ready`
// +kubebuilder:printcolumn:name="Last Checked",type=date,JSONPath=`.status.lastChecked`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ProviderHealth struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Status ProviderHealthStatus `json:"status,omitempty"`
}

// ProviderHealthList is a list of ProviderHealth objects.
// +kubebuilder:object:root=true
type ProviderHealthList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProviderHealth `json:"items"`
}

func init() {
	register(&ProviderHealth{}, &ProviderHealthList{})
}
