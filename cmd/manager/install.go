package main

import (
	"context"
	"fmt"
	"regexp"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// installIDNamespace is the namespace whose UID names the install when --install-id is
// not set: every cluster has it, and its UID lasts as long as the cluster.
const installIDNamespace = "kube-system"

// installIDPattern is what --install-id accepts: it is written into the mark of every
// instance, and this is what every provider's mark can hold (a GCE label value allows no
// more). A namespace UID matches it.
var installIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

func checkInstallID(id string) error {
	if id != "" && !installIDPattern.MatchString(id) {
		return fmt.Errorf("--install-id %q: use 1 to 63 lowercase letters, digits, dashes and underscores, starting with a letter or digit", id)
	}
	return nil
}

// resolveInstallID returns the identity of this install and where it came from: the
// --install-id value when set, otherwise the UID of the kube-system namespace, read
// with c (the manager's ClusterRole grants get on namespaces for this).
func resolveInstallID(ctx context.Context, c client.Reader, flagValue string) (id, source string, err error) {
	if flagValue != "" {
		return flagValue, "--install-id", nil
	}
	ns := &corev1.Namespace{}
	if err := c.Get(ctx, client.ObjectKey{Name: installIDNamespace}, ns); err != nil {
		return "", "", fmt.Errorf("reading the UID of namespace %s, the default --install-id: %w (set --install-id, or grant get on namespaces)",
			installIDNamespace, err)
	}
	if ns.UID == "" {
		return "", "", fmt.Errorf("namespace %s has no UID to serve as the default --install-id; set --install-id", installIDNamespace)
	}
	return string(ns.UID), "namespace " + installIDNamespace + " UID", nil
}
