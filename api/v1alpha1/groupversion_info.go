// Package v1alpha1 holds the egress.hrajfrisbee.cz/v1alpha1 API: Proxy (one egress HTTP
// proxy, run by a provider or pointing at an existing one) and ProviderHealth (the health
// of one configured provider's targets).
//
// +kubebuilder:object:generate=true
// +groupName=egress.hrajfrisbee.cz
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "egress.hrajfrisbee.cz", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
