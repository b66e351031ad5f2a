package main

import (
	"errors"

	"sigs.k8s.io/controller-runtime/pkg/cache"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/watchns"
)

// parseWatchNamespaces reads --watch-namespaces (watchns.Parse): a comma-separated list
// of namespace names, each a DNS-1123 label, none twice. Empty: nil, every namespace.
func parseWatchNamespaces(value string) ([]string, error) { return watchns.Parse(value) }

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
func cacheNamespaces(namespaces []string) map[string]cache.Config { return watchns.Cache(namespaces) }
