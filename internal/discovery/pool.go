package discovery

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// poolOf is the name of the ProxyPool controlling px, or "". The controller reference
// decides, not the pool label, which anyone may set.
func poolOf(px *v1alpha1.Proxy) string {
	ref := metav1.GetControllerOfNoCopy(px)
	if ref == nil || ref.Kind != "ProxyPool" || ref.APIVersion != v1alpha1.GroupVersion.String() {
		return ""
	}
	return ref.Name
}
