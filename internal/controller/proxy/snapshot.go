package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// The credentials snapshot: at each Create the reconciler copies the username and
// password it renders into a Secret the Proxy controls (proxyconfig.SnapshotName), so the
// probe and discovery keep using what the instance demands after the referenced Secret
// is rotated, and the Secret goes with the Proxy.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;delete

// errSnapshotTaken: a Secret of the snapshot's name exists and is not the Proxy's.
var errSnapshotTaken = errors.New("the credentials snapshot's name is taken")

// syncSnapshot makes the Proxy's snapshot hold creds (none: no snapshot) and records it
// in status.credentialsSecret. A Secret of the snapshot's name that the Proxy does not
// control is never changed: the error wraps errSnapshotTaken.
func (r *ProxyReconciler) syncSnapshot(ctx context.Context, s *scope, creds *proxyconfig.Credentials) error {
	px := s.px
	if creds == nil {
		return r.deleteSnapshot(ctx, s)
	}
	key := client.ObjectKey{Namespace: px.Namespace, Name: proxyconfig.SnapshotName(px)}
	want := proxyconfig.SnapshotData(*creds)
	sec := &corev1.Secret{}
	err := r.Client.Get(ctx, key, sec)
	for attempt := 0; attempt < 2 && apierrors.IsNotFound(err); attempt++ {
		sec = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
				Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}},
			Type: corev1.SecretTypeOpaque,
			Data: want,
		}
		if err := controllerutil.SetControllerReference(px, sec, r.Scheme); err != nil {
			return fmt.Errorf("owning credentials snapshot %s: %w", key, err)
		}
		err = r.Client.Create(ctx, sec)
		if err == nil {
			s.log.V(1).Info("credentials snapshot created", "secret", key.Name)
			px.Status.CredentialsSecret = key.Name
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating credentials snapshot %s: %w", key, err)
		}
		// Made meanwhile (by a reconcile of this Proxy that read an older copy, or by
		// someone else): read it fresh, past the cache, and check it like one found.
		sec = &corev1.Secret{}
		err = r.freshReader().Get(ctx, key, sec)
	}
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("creating credentials snapshot %s: it exists and does not, by turns; trying again", key)
	case err != nil:
		return fmt.Errorf("reading credentials snapshot %s: %w", key, err)
	case !metav1.IsControlledBy(sec, px):
		return fmt.Errorf("%w: secret %s exists and is not controlled by proxy %s, so the operator does not write the credentials of instance %s into it: delete or rename that Secret",
			errSnapshotTaken, key, px.Name, px.InstanceName())
	case !sameData(sec.Data, want) || sec.Labels[v1alpha1.CredentialsLabel] != "true":
		if sec.Labels == nil {
			sec.Labels = map[string]string{}
		}
		sec.Labels[v1alpha1.CredentialsLabel] = "true"
		sec.Data = want
		if err := r.Client.Update(ctx, sec); err != nil {
			return fmt.Errorf("updating credentials snapshot %s: %w", key, err)
		}
		s.log.V(1).Info("credentials snapshot updated", "secret", key.Name)
	}
	px.Status.CredentialsSecret = key.Name
	return nil
}

// deleteSnapshot deletes the snapshot status.credentialsSecret names, when the Proxy
// controls it, and clears the field: an instance without credentials needs none.
func (r *ProxyReconciler) deleteSnapshot(ctx context.Context, s *scope) error {
	px := s.px
	if px.Status.CredentialsSecret == "" {
		return nil
	}
	key := client.ObjectKey{Namespace: px.Namespace, Name: px.Status.CredentialsSecret}
	sec := &corev1.Secret{}
	err := r.Client.Get(ctx, key, sec)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("reading credentials snapshot %s: %w", key, err)
	case metav1.IsControlledBy(sec, px):
		if err := r.Client.Delete(ctx, sec, client.Preconditions{UID: &sec.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting credentials snapshot %s: %w", key, err)
		}
	}
	px.Status.CredentialsSecret = ""
	return nil
}

func sameData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

// freshReader reads past the manager's cache: APIReader, or Client when that is nil.
func (r *ProxyReconciler) freshReader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}
