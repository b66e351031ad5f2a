package common

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// StaleRetry is how soon a reconcile that read a stale copy runs again: long enough for
// the cache to deliver the write it missed, short enough not to be noticed.
const StaleRetry = 200 * time.Millisecond

// OwnWrites remembers, for each object of one kind, the resourceVersion of a
// reconciler's last write of it until a reconcile's copy is known to be at least that
// new. Its zero value is ready to use.
//
// The manager's cache can hand a reconcile a copy older than the reconciler's own last
// write: another object's event (a Secret's, a child's) wakes it before the object's
// own informer has delivered that write. Decided from such a copy, a reconcile acts for
// a state already left behind, or finds its status already as it wants it, writes
// nothing, and leaves the server's newer status standing with nothing to wake it again.
// A status write that carries the version read only catches the case where something is
// written.
type OwnWrites struct {
	mu   sync.Mutex
	last map[types.NamespacedName]ownWrite
}

type ownWrite struct {
	uid     types.UID
	version string
}

// Record notes obj's resourceVersion as the reconciler's last write of it.
func (w *OwnWrites) Record(obj client.Object) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil {
		w.last = map[types.NamespacedName]ownWrite{}
	}
	w.last[client.ObjectKeyFromObject(obj)] = ownWrite{uid: obj.GetUID(), version: obj.GetResourceVersion()}
}

// Forget drops what is noted for key (an object gone).
func (w *OwnWrites) Forget(key types.NamespacedName) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.last, key)
}

// unconfirmed is the version of the reconciler's last write of obj when obj's copy is
// another version or object (older, or newer by another writer: only a read past the
// cache can tell), and "" when there is none or obj is that version, which confirms it.
func (w *OwnWrites) unconfirmed(obj client.Object) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	key := client.ObjectKeyFromObject(obj)
	last, ok := w.last[key]
	switch {
	case !ok:
		return ""
	case last.uid == obj.GetUID() && last.version == obj.GetResourceVersion():
		delete(w.last, key)
		return ""
	}
	return last.version
}

// Behind reports whether obj, of kind gvk as the cache gave it, is older than the
// reconciler's last write of it. It reads past the cache (live, the object's metadata
// alone) only when the copy is not the version that write made, once per write: a copy
// found to be the server's confirms the write. With live nil nothing is checked.
func (w *OwnWrites) Behind(ctx context.Context, live client.Reader, gvk schema.GroupVersionKind, obj client.Object) (bool, error) {
	wrote := w.unconfirmed(obj)
	if wrote == "" || live == nil {
		return false, nil
	}
	key := client.ObjectKeyFromObject(obj)
	current := &metav1.PartialObjectMetadata{}
	current.SetGroupVersionKind(gvk)
	switch err := live.Get(ctx, key, current); {
	case apierrors.IsNotFound(err):
		w.Forget(key)
		return true, nil // deleted: the cache is behind, and its delete event comes
	case err != nil:
		return false, fmt.Errorf("reading %s %s past the cache, whose copy (version %s) is not the one the reconciler last wrote (%s): %w",
			gvk.Kind, key, obj.GetResourceVersion(), wrote, err)
	case current.UID != obj.GetUID() || current.ResourceVersion != obj.GetResourceVersion():
		return true, nil
	}
	w.Forget(key)
	return false, nil
}
