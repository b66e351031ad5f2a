package main

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// parseWatchNamespaces reads --watch-namespaces: a comma-separated list of namespace
// names, each a DNS-1123 label, none twice. Empty: nil, every namespace.
func parseWatchNamespaces(value string) ([]string, error) {
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

// errWatchNamespacesNeedInstallID refuses --watch-namespaces without --install-id. The
// default install id, the kube-system namespace's UID, is the same for every install in
// the cluster; an install that sees only some namespaces lists the instances of them all
// (they carry the install id, not a namespace) and its orphan GC would take those of
// Proxies it cannot see for orphans and delete them.
var errWatchNamespacesNeedInstallID = errors.New("--watch-namespaces needs --install-id: the default install id (the kube-system namespace's UID) is shared by every install of the cluster, and an install that sees only some namespaces would take the instances of Proxies in the others for orphans and delete them; give this install an id of its own")

// cacheNamespaces is the manager cache's DefaultNamespaces for --watch-namespaces: the
// informers of namespaced objects (Proxies, ProxyPools, Secrets, Services,
// EndpointSlices) list and watch in these namespaces alone, so that Roles there are all
// the access they need; objects elsewhere are never seen. Cluster-scoped objects
// (ProviderHealths) keep a cluster-wide informer. nil: every namespace.
func cacheNamespaces(namespaces []string) map[string]cache.Config {
	if len(namespaces) == 0 {
		return nil
	}
	out := make(map[string]cache.Config, len(namespaces))
	for _, ns := range namespaces {
		out[ns] = cache.Config{}
	}
	return out
}
