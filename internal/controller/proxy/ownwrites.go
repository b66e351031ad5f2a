package proxy

import (
	"context"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// ownWrites remembers, for each Proxy, the resourceVersion of the reconciler's last
// write of it (status, progress, finalizer, remediation record) until a reconcile's copy
// is known to be at least that new.
//
// The manager's cache can hand a reconcile a copy older than the reconciler's own last
// write: a Secret event wakes the Proxy before the Proxy's informer has delivered that
// write. Decided from such a copy, a reconcile acts on the provider for a state already
// left behind (a pool child's instance deleted for a credentials change that the newer
// state says is the pool's to roll), or finds its status already as it wants it, writes
// nothing, and leaves the server's newer status standing with nothing to wake it again
// (a Secret created again after it went missing, with the Proxy kept waiting for it).
// The status write's optimistic lock only catches the case where something is written.
type ownWrites struct {
	mu   sync.Mutex
	last map[types.NamespacedName]ownWrite
}

type ownWrite struct {
	uid     types.UID
	version string
}

// record notes px's resourceVersion as the reconciler's last write of it.
func (w *ownWrites) record(px *v1alpha1.Proxy) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last = map[types.NamespacedName]ownWrite{}
	}
	w.last[types.NamespacedName{Namespace: px.Namespace, Name: px.Name}] = ownWrite{uid: px.UID, version: px.ResourceVersion}
}

// forget drops what is noted for key.
func (w *ownWrites) forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.last, key)
}

// unconfirmed is the version of the reconciler's last write of px when px's copy is
// another version or object (older, or newer by another writer: only a read past the
// cache can tell), and "" when there is none or px is that version, which confirms it.
func (w *ownWrites) unconfirmed(px *v1alpha1.Proxy) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	key := types.NamespacedName{Namespace: px.Namespace, Name: px.Name}
	last, ok := w.last[key]
	switch {
	case !ok:
		return ""
	case last.uid == px.UID && last.version == px.ResourceVersion:
		delete(w.last, key)
		return ""
	}
	return last.version
}

// behindOwnWrite reports whether px, as the cache gave it, is older than the reconciler's
// last write of it. It reads past the cache (APIReader, the object's metadata alone) only
// when the copy is not the version that write made, once per write: a copy found to be
// the server's confirms the write. Without an APIReader nothing is checked.
func (r *ProxyReconciler) behindOwnWrite(ctx context.Context, px *v1alpha1.Proxy) (bool, error) {
	wrote := r.writes.unconfirmed(px)
	if wrote == "" || r.APIReader == nil {
		return false, nil
	}
	key := types.NamespacedName{Namespace: px.Namespace, Name: px.Name}
	current := &metav1.PartialObjectMetadata{}
	current.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Proxy"))
	switch err := r.APIReader.Get(ctx, key, current); {
	case apierrors.IsNotFound(err):
		r.writes.forget(key)
		return true, nil // deleted: the cache is behind, and its delete event comes
	case err != nil:
		return false, fmt.Errorf("reading proxy %s past the cache, whose copy (version %s) is not the one the reconciler last wrote (%s): %w",
			key, px.ResourceVersion, wrote, err)
	case current.UID != px.UID || current.ResourceVersion != px.ResourceVersion:
		return true, nil
	}
	r.writes.forget(key)
	return false, nil
}
