package controllertest

import (
	"context"
	"reflect"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// LaggingCache is a client whose Get of one object answers an older copy of it while
// Stale is set, as the manager's cache does before its informer has delivered the
// latest write; every other read, and every write, goes to Client. A reconciler run
// through it in the synchronous layer meets a cache that lags.
type LaggingCache struct {
	client.Client
	// Stale is the copy answered for the object of its kind, namespace and name; nil:
	// none.
	Stale client.Object
}

func (c *LaggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if c.Stale != nil && reflect.TypeOf(obj) == reflect.TypeOf(c.Stale) && key == client.ObjectKeyFromObject(c.Stale) {
		reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(c.Stale.DeepCopyObject()).Elem())
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}
