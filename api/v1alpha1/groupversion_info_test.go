package v1alpha1

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
)

// AddToScheme registers every kind of the package under GroupVersion, with the
// meta types (ListOptions and the like) a client needs for it.
func TestAddToSchemeRegistersEveryKind(t *testing.T) {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatalf("add to scheme: %v", err)
	}
	var kinds []string
	for k := range s.KnownTypes(GroupVersion) {
		kinds = append(kinds, k)
	}
	for _, want := range []string{"Proxy", "ProxyList", "ProviderHealth", "ProviderHealthList", "ProxyPool", "ProxyPoolList", "ListOptions", "WatchEvent"} {
		if !slices.Contains(kinds, want) {
			t.Errorf("kind %s not registered under %s; registered: %v", want, GroupVersion, kinds)
		}
	}
	gvks, _, err := s.ObjectKinds(&ProviderHealth{})
	if err != nil || len(gvks) != 1 || gvks[0] != GroupVersion.WithKind("ProviderHealth") {
		t.Errorf("ProviderHealth kinds %v, %v; want %s", gvks, err, GroupVersion.WithKind("ProviderHealth"))
	}
}
