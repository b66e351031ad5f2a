package proxy

import (
	"context"
	"errors"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// SecretRefIndex is the field index of Proxies by the name of the Secret their
// spec.proxy.basicAuth.secretRef names, which maps a changed Secret to its Proxies.
const SecretRefIndex = "spec.proxy.basicAuth.secretRef.name"

// The reconciler reads basic-auth Secrets through the manager's cache, which watches
// the opted-in ones (an unlabelled Secret only by its metadata); the only Secrets it
// writes are its credentials snapshots (snapshot.go).

// indexSecretRef is the SecretRefIndex value of a Proxy: the names of the Secrets it
// reads, its basic-auth Secret and its WireGuard Secret (spec.proxy.egress.wireguard),
// or none.
func indexSecretRef(obj client.Object) []string {
	px, ok := obj.(*v1alpha1.Proxy)
	if !ok || px.Spec.Proxy == nil {
		return nil
	}
	var names []string
	if px.Spec.Proxy.BasicAuth != nil {
		names = append(names, string(px.Spec.Proxy.BasicAuth.SecretRef.Name))
	}
	if name, _ := px.WireGuardRef(); name != "" {
		names = append(names, name)
	}
	return names
}

// proxiesForSecret maps a Secret to the Proxies of its namespace that name it, so a
// Secret created, completed, rotated, labelled or unlabelled wakes them: a Managed
// Proxy renders its configuration from it, an External one is published only while its
// Secret can be read.
func (r *ProxyReconciler) proxiesForSecret(ctx context.Context, sec client.Object) []reconcile.Request {
	if owner := snapshotOwner(sec); owner != "" {
		// A credentials snapshot deleted: its Proxy makes it again when it can.
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: sec.GetNamespace(), Name: owner}}}
	}
	list := &v1alpha1.ProxyList{}
	if err := r.Client.List(ctx, list, client.InNamespace(sec.GetNamespace()), client.MatchingFields{SecretRefIndex: sec.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "listing the proxies that use a secret", "secret", client.ObjectKeyFromObject(sec))
		return nil
	}
	var reqs []reconcile.Request
	for _, px := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&px)})
	}
	return reqs
}

// snapshotWrites drops the Secret events the reconciler causes itself: a snapshot
// created or updated (by a Create in progress) wakes nobody; one deleted wakes its Proxy.
var snapshotWrites = predicate.Funcs{
	CreateFunc: func(e event.CreateEvent) bool { return !isSnapshot(e.Object) },
	UpdateFunc: func(e event.UpdateEvent) bool { return !isSnapshot(e.ObjectNew) },
}

// isSnapshot reports a Secret controlled by a Proxy: a credentials snapshot.
func isSnapshot(obj client.Object) bool {
	return snapshotOwner(obj) != ""
}

// snapshotOwner is the name of the Proxy controlling obj, or "".
func snapshotOwner(obj client.Object) string {
	if obj == nil {
		return ""
	}
	ref, _ := v1alpha1.ControllingProxy(obj)
	return ref.Name
}

// credentials is the reconciler's credentials lookup: Credentials, or the Secrets read
// through Client (their metadata through APIReader) when that is nil.
func (r *ProxyReconciler) credentials() proxyconfig.CredentialsFunc {
	if r.Credentials != nil {
		return r.Credentials
	}
	return proxyconfig.SecretCredentials{Reader: r.Client, Metadata: r.APIReader}.Credentials
}

// wireGuard is the reconciler's WireGuard lookup: WireGuard, or the Secrets read
// through Client (their metadata through APIReader) when that is nil.
func (r *ProxyReconciler) wireGuard() proxyconfig.WireGuardFunc {
	if r.WireGuard != nil {
		return r.WireGuard
	}
	return proxyconfig.SecretWireGuard{Reader: r.Client, Metadata: r.APIReader}.WireGuard
}

// waitsForUser: err is one the user fixes in the Secret (missing, not opted in,
// incomplete, values tinyproxy cannot take, a WireGuard configuration that does not
// parse), for which the Proxy waits on the watch.
func waitsForUser(err error) bool {
	return errors.Is(err, proxyconfig.ErrWireGuardSecret) || errors.Is(err, proxyconfig.ErrSecretMissing) || errors.Is(err, proxyconfig.ErrSecretNotOptedIn) ||
		errors.Is(err, proxyconfig.ErrSecretKeyMissing) || errors.Is(err, proxyconfig.ErrBadCredentials)
}

// renderConfig is the Proxy's user-data and spec hash input (proxyconfig.ForProxy), and
// the credentials it was rendered with (nil for none).
// When it cannot be had, done is set and res and err are what the reconcile returns:
//   - the Secret is missing, lacks the opt-in label or a key, or holds values tinyproxy cannot take: the
//     Proxy waits, with the reason in status and a Warning event, and is not requeued:
//     the Secret watch wakes it;
//   - the Secret could not be read: err, retried with backoff;
//   - the spec cannot be rendered (a spec.cloudInit of no known kind, a bad range): a
//     permanent error, latched until the spec changes.
func (r *ProxyReconciler) renderConfig(ctx context.Context, s *scope) (rendered proxyconfig.Rendered, creds *proxyconfig.Credentials, done bool, res ctrl.Result, err error) {
	var lookupErr error
	lookup, wgLookup := r.credentials(), r.wireGuard()
	rendered, err = proxyconfig.ForProxyWith(ctx, s.px, func(ctx context.Context, px *v1alpha1.Proxy) (*proxyconfig.Credentials, error) {
		c, err := lookup(ctx, px)
		creds, lookupErr = c, err
		return c, err
	}, func(ctx context.Context, px *v1alpha1.Proxy) (*proxyconfig.WireGuard, error) {
		wg, err := wgLookup(ctx, px)
		lookupErr = err
		return wg, err
	})
	switch {
	case err == nil:
		return rendered, creds, false, ctrl.Result{}, nil
	case waitsForUser(err):
		r.waitForCredentials(s, err)
		return rendered, nil, true, ctrl.Result{}, nil
	case lookupErr != nil:
		res, err := r.providerError(s, common.ActionReconcile, err, false) // transient: retried with backoff
		return rendered, nil, true, res, err
	default:
		res, err := r.providerError(s, common.ActionReconcile, provider.Permanent(fmt.Errorf("rendering the proxy configuration: %w", err)), true)
		return rendered, nil, true, res, err
	}
}

// waitForCredentials shows why the Proxy's credentials cannot be had. An instance built
// earlier keeps running as it is: replacing it needs the new credentials, and deleting
// it would take a working proxy away over a Secret being edited.
func (r *ProxyReconciler) waitForCredentials(s *scope, err error) {
	s.enact(judgeCredentials(s.px, err))
}

// judgeCredentials is waitForCredentials's verdict: CredentialsUnavailable, or
// EgressUnavailable for a WireGuard Secret (judgeUnavailable).
func judgeCredentials(px *v1alpha1.Proxy, err error) phaseVerdict {
	reason, what := v1alpha1.ReasonCredentialsUnavailable, "basic-auth"
	if errors.Is(err, proxyconfig.ErrWireGuardSecret) {
		reason, what = v1alpha1.ReasonEgressUnavailable, "WireGuard"
	}
	msg := fmt.Sprintf("%v; waiting for the Secret to be fixed", err)
	if px.Status.ProviderID != "" {
		msg += fmt.Sprintf(" (instance %s keeps the configuration it was built with)", px.InstanceName())
	}
	return judgeUnavailable(px, reason, msg, "proxy waits for its "+what+" secret", "error", err.Error())
}
