// Package watchns reads the --watch-namespaces flag of the manager and the gateway and
// turns it into their caches' namespaces.
package watchns

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// Parse reads --watch-namespaces: a comma-separated list of namespace names, each a
// DNS-1123 label, none twice. Empty: nil, every namespace.
func Parse(value string) ([]string, error) {
	if strings.TrimSpace(value) == "" {
		return nil, nil
	}
	var out []string
	seen := map[string]bool{}
	for _, ns := range strings.Split(value, ",") {
		ns = strings.TrimSpace(ns)
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("--watch-namespaces %q: namespace %q: %s", value, ns, strings.Join(errs, "; "))
		}
		if seen[ns] {
			return nil, fmt.Errorf("--watch-namespaces %q: namespace %q is listed twice", value, ns)
		}
		seen[ns] = true
		out = append(out, ns)
	}
	return out, nil
}

// Cache is a cache's DefaultNamespaces for the namespaces Parse read: the informers of
// namespaced objects list and watch in these namespaces alone, so that Roles there are
// all the access they need; objects elsewhere are never seen. Cluster-scoped objects
// keep a cluster-wide informer. nil: every namespace.
func Cache(namespaces []string) map[string]cache.Config {
	if len(namespaces) == 0 {
		return nil
	}
	out := make(map[string]cache.Config, len(namespaces))
	for _, ns := range namespaces {
		out[ns] = cache.Config{}
	}
	return out
}
