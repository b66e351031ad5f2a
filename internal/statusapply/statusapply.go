// Package statusapply writes status subresources by server-side apply, one field manager
// per writer. A writer applies only the fields it owns: the API server merges them with
// the other writers' fields (conditions are a list map keyed by type, so each writer's
// conditions are its own), and a field the writer owned and no longer applies is removed.
//
// A write carries no resourceVersion unless the writer asks for one (IfVersion): then
// the API server refuses it with a conflict if the object changed since that version,
// which is how a writer that decided from what it read makes sure nothing it decided
// from has moved. Nothing here retries a conflict; the writer decides what one means.
//
// To add a writer: name its field manager below, write one function that copies the
// fields it owns out of a status (proxyStatusOf in internal/controller/proxy and healthStatusOf
// in internal/health are the examples), apply that with Status, and add its row to
// docs/architecture.md, "Who writes which status field".
package statusapply

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// The field managers of the operator's status writers (docs/architecture.md, "Who writes
// which status field").
const (
	// ProxyController is the Proxy reconciler: the instance, phase, message,
	// observedGeneration and the Provisioned, ConfigOutdated, Preempted, Ready,
	// Reconciling and Stalled conditions.
	ProxyController = "proxy-controller"
	// ProxyHealth is the health engine: healthy, the Healthy condition, probeTarget and
	// the probe data.
	ProxyHealth = "proxy-health"
	// ProxyPoolController is the ProxyPool reconciler: all of a pool's status.
	ProxyPoolController = "proxypool-controller"
	// ProviderHealth is the provider health monitor: all of a ProviderHealth's status.
	ProviderHealth = "providerhealth"
	// ProxyBans is the leader's ban controller: a Proxy's coolingSites and Retired
	// condition, a ProxyPool's saturatedSites, retirements and Saturated condition. (A Proxy's
	// cooldowns are ProxyFeedback's, written on every replica.)
	ProxyBans = "proxy-bans"
	// ProxyFeedback is the ban recorder (internal/bans.Recorder, whose FieldManager it
	// is), on every replica: a Proxy's cooldowns and unreachable mark, from the crawlers'
	// reports.
	ProxyFeedback = "proxy-feedback"
	// Cost is the cost controller (internal/controller/cost): a Proxy's and a ProxyPool's
	// status.cost.
	Cost = "egress-proxies-cost"
	// Autoscaler is the built-in autoscaler (internal/controller/autoscaler): a
	// ProxyPool's status.autoscaling and Scaling condition (and, by a merge patch of the
	// spec, its spec.replicas).
	Autoscaler = "egress-proxies-autoscaler"
)

// Option adjusts one Status call.
type Option func(*options)

type options struct {
	version string
	claim   any
}

// IfVersion makes the apply carry resourceVersion rv (nothing when rv is empty): the API
// server refuses it with a conflict (apierrors.IsConflict) if the object has changed
// since. The writer then knows that what it decided from is out of date.
func IfVersion(rv string) Option { return func(o *options) { o.version = rv } }

// Claiming gives the writer's fields as obj holds them now (a status struct, as for
// Status). When the writer has never applied obj's status and obj holds some of its
// fields (written by a release that wrote status with merge patches), the status's
// update managers are dropped and those fields are applied first, as they are: from then
// on the writer owns them, so a field it stops applying is removed rather than kept for
// a manager nobody runs. It costs nothing once the writer has applied.
func Claiming(current any) Option { return func(o *options) { o.claim = current } }

// Status applies status, a typed status struct holding only the fields manager owns, to
// obj's status subresource, taking those fields over from any other manager. Fields that
// are zero and omitempty are not applied: applying nothing is how a field is cleared.
// On success obj holds the object as the server returned it.
func Status(ctx context.Context, c client.Client, obj client.Object, status any, manager string, opts ...Option) error {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.claim != nil && !Applied(obj, manager) && !reflect.ValueOf(o.claim).Elem().IsZero() {
		if err := adopt(ctx, c, obj, o.claim, manager, o.version); err != nil {
			return err
		}
		if o.version != "" {
			// The object as adopted is the version decided from, moved on by our writes.
			o.version = obj.GetResourceVersion()
		}
	}
	return apply(ctx, c, obj, status, manager, o.version)
}

func apply(ctx context.Context, c client.Client, obj client.Object, status any, manager, version string) error {
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
	u.SetResourceVersion(version)
	if err := c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u),
		client.FieldOwner(manager), client.ForceOwnership); err != nil {
		return err
	}
	return readBack(u, obj, gvk.Kind)
}

func readBack(u *unstructured.Unstructured, obj client.Object, kind string) error {
	v := reflect.ValueOf(obj).Elem()
	v.Set(reflect.Zero(v.Type()))
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
		return fmt.Errorf("reading back %s %s: %w", kind, client.ObjectKeyFromObject(obj), err)
	}
	return nil
}

// adopt drops the update managers of obj's status (an update, not an apply: a merge
// patch or a PUT of an older release, or a hand edit), in one JSON patch that holds only
// if obj is still at the version read (or at version when given), and applies claim, the
// writer's fields as they are. The writer that comes second finds no update manager left
// and its fields owned by none: it claims them the same way.
func adopt(ctx context.Context, c client.Client, obj client.Object, claim any, manager, version string) error {
	if version == "" {
		version = obj.GetResourceVersion()
	}
	var keep []metav1.ManagedFieldsEntry
	for _, mf := range obj.GetManagedFields() {
		if mf.Subresource != "status" || mf.Operation == metav1.ManagedFieldsOperationApply {
			keep = append(keep, mf)
		}
	}
	if len(keep) < len(obj.GetManagedFields()) {
		patch, err := json.Marshal([]map[string]any{
			// A resourceVersion in the patched object is a precondition (a conflict if stale).
			{"op": "replace", "path": "/metadata/resourceVersion", "value": version},
			{"op": "replace", "path": "/metadata/managedFields", "value": keep},
		})
		if err != nil {
			return err
		}
		if err := c.Patch(ctx, obj, client.RawPatch(types.JSONPatchType, patch)); err != nil {
			return fmt.Errorf("dropping the update managers of the status of %s: %w", client.ObjectKeyFromObject(obj), err)
		}
		version = obj.GetResourceVersion()
	}
	return apply(ctx, c, obj, claim, manager, version)
}

// Applied reports whether manager has applied obj's status before (an apply entry of the
// status subresource in managedFields).
func Applied(obj client.Object, manager string) bool {
	for _, mf := range obj.GetManagedFields() {
		if mf.Subresource == "status" && mf.Manager == manager && mf.Operation == metav1.ManagedFieldsOperationApply {
			return true
		}
	}
	return false
}
