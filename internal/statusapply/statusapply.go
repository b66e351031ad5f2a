// Package statusapply writes status subresources by server-side apply, one field manager
// per writer. A writer applies only the fields it owns: the API server merges them with
// the other writers' fields (conditions are a list map keyed by type, so each writer's
// conditions are its own), and a field the writer owned and no longer applies is removed.
// No write carries a resourceVersion, so none conflicts and none is retried.
package statusapply

import (
	"context"
	"fmt"
	"reflect"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// The field managers of the operator's status writers (docs/architecture.md, "Who writes
// which status field").
const (
	// ProxyController is the Proxy reconciler: the instance, phase, message, Provisioned,
	// ConfigOutdated and Preempted.
	ProxyController = "proxy-controller"
	// ProxyHealth is the health engine: healthy, the Healthy condition and probe data.
	ProxyHealth = "proxy-health"
	// ProxyPoolController is the ProxyPool reconciler: all of a pool's status.
	ProxyPoolController = "proxypool-controller"
	// ProviderHealth is the provider health monitor: all of a ProviderHealth's status.
	ProviderHealth = "providerhealth"
)

// Status applies status, a typed status struct holding only the fields manager owns, to
// obj's status subresource, taking those fields over from any other manager. Fields that
// are zero and omitempty are not applied: applying nothing is how a field is cleared.
// On success obj holds the object as the server returned it.
func Status(ctx context.Context, c client.Client, obj client.Object, status any, manager string) error {
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return err
	}
	fields, err := runtime.DefaultUnstructuredConverter.ToUnstructured(status)
	if err != nil {
		return fmt.Errorf("converting the status of %s %s: %w", gvk.Kind, client.ObjectKeyFromObject(obj), err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{"status": fields}}
	u.SetGroupVersionKind(gvk)
	u.SetName(obj.GetName())
	u.SetNamespace(obj.GetNamespace())
	if err := c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u),
		client.FieldOwner(manager), client.ForceOwnership); err != nil {
		return err
	}
	v := reflect.ValueOf(obj).Elem()
	v.Set(reflect.Zero(v.Type()))
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
		return fmt.Errorf("reading back %s %s: %w", gvk.Kind, client.ObjectKeyFromObject(obj), err)
	}
	return nil
}
