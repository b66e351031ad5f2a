package v1alpha1

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestInstanceName(t *testing.T) {
	for _, tc := range []struct{ ns, name, want string }{
		// sha256("crawlers/web-1") and sha256("default/web-1"), first 16 hex characters.
		{"crawlers", "web-1", "proxy-276a5af09c81377a"},
		{"default", "web-1", "proxy-96603d4dfddd0a0c"},
	} {
		p := &Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: tc.ns, Name: tc.name, UID: "any"}}
		if got := p.InstanceName(); got != tc.want {
			t.Errorf("InstanceName(%s/%s) = %q, want %q", tc.ns, tc.name, got, tc.want)
		}
	}
}
