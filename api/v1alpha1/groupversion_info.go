// Package v1alpha1 holds the egress.hrajfrisbee.cz/v1alpha1 API: Proxy (one egress HTTP
// proxy, run by a provider or pointing at an existing one), ProviderHealth (the health
// of one configured provider's targets) and ProxyPool (replicas of a Proxy template).
//
// +kubebuilder:object:generate=true
// +groupName=egress.hrajfrisbee.cz
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every type in this package.
	GroupVersion = schema.GroupVersion{Group: "egress.hrajfrisbee.cz", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme. The package
	// depends on apimachinery alone (not controller-runtime), so it stays cheap to import.
	SchemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		metav1.AddToGroupVersion(s, GroupVersion)
		return nil
	})

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// register adds objs, under GroupVersion, to what AddToScheme registers.
func register(objs ...runtime.Object) {
	SchemeBuilder.Register(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, objs...)
		return nil
	})
}
