package controllertest

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// The synchronous layer (karpenter's ExpectObjectReconciled): the test runs one
// Reconcile of an object itself, against the API server, with no manager, no cache and
// no poll, on the reconciler's fake clock, and asserts what that one pass wrote. A
// reconciler run so reads through a client that goes to the API server (not a cache), so
// every write of one pass is seen by the next.

// ExpectReconciled runs one Reconcile of obj (by its namespace and name) with r, fails
// the test on an error, and reads obj back through c (left as it was when the pass
// deleted it). It returns the pass's result.
func ExpectReconciled(t testing.TB, ctx context.Context, c client.Client, r reconcile.Reconciler, obj client.Object) reconcile.Result {
	t.Helper()
	key := client.ObjectKeyFromObject(obj)
	res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: key})
	if err != nil {
		t.Fatalf("reconciling %T %s: %v", obj, key, err)
	}
	if err := c.Get(ctx, key, obj); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("reading %T %s after its reconcile: %v", obj, key, err)
	}
	return res
}
