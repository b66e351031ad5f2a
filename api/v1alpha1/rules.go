package v1alpha1

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The rules about a Proxy that more than one part of the operator asks: each has its
// home here, so that the reconcilers, the health engine, the ban recorder and discovery
// cannot answer them differently.

// DefaultPort is the port a proxy listens on when spec.port is not set. The CRD's
// default (+kubebuilder:default on ProxySpec.Port) is the same number; a Proxy that
// reached the API server always has spec.port, so this matters for objects built in
// memory (a pool's template before defaulting, tests).
const DefaultPort int32 = 3128

// PortOrDefault is spec.port, or DefaultPort when it is not set.
func (s *ProxySpec) PortOrDefault() int32 {
	if s.Port == 0 {
		return DefaultPort
	}
	return s.Port
}

// Port is the port the Proxy listens on: spec.port, or DefaultPort when it is not set.
func (p *Proxy) Port() int32 { return p.Spec.PortOrDefault() }

// Serving reports whether the Proxy serves users: the health engine holds it healthy and
// its phase is Ready, it is not being deleted (a Ready proxy the reconciler is replacing
// serves no one new) and it is not cordoned (CordonAnnotation "true"). Its pool's
// EndpointSlice marks exactly these ready; discovery hands them out unless a crawler's
// unreachable report waits for a probe to answer it.
func (p *Proxy) Serving() bool {
	return p.Status.Healthy && p.Status.Phase == PhaseReady && p.DeletionTimestamp.IsZero() &&
		p.Annotations[CordonAnnotation] != "true"
}

// ControllingPool is obj's controller reference when a ProxyPool controls it; ok is
// false for an object no ProxyPool controls (a standalone Proxy). The controller
// reference decides, not the pool label, which anyone may set.
func ControllingPool(obj metav1.Object) (ref metav1.OwnerReference, ok bool) {
	return controlledBy(obj, "ProxyPool")
}

// ControllingProxy is obj's controller reference when a Proxy controls it (a credentials
// snapshot Secret); ok is false otherwise.
func ControllingProxy(obj metav1.Object) (ref metav1.OwnerReference, ok bool) {
	return controlledBy(obj, "Proxy")
}

// controlledBy is obj's controller reference when it names kind of this API group.
//
// The group and the kind decide, not the version: an owner reference keeps the
// apiVersion it was written with, and once a later version of this API is served beside
// v1alpha1 (through conversion), the children made before keep references to v1alpha1
// and those made after name the new version; both are the same ProxyPool. The group is
// compared so that a kind of the same name from another API is not taken for ours.
func controlledBy(obj metav1.Object, kind string) (metav1.OwnerReference, bool) {
	ref := metav1.GetControllerOfNoCopy(obj)
	if ref == nil || ref.Kind != kind {
		return metav1.OwnerReference{}, false
	}
	if group, _, found := strings.Cut(ref.APIVersion, "/"); !found || group != GroupVersion.Group {
		return metav1.OwnerReference{}, false
	}
	return *ref, true
}
