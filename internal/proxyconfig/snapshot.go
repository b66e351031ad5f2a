package proxyconfig

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// SnapshotName is the name of the Secret that keeps the credentials px's instance was
// built with: its instance name (a hash of namespace and name) and "-credentials".
func SnapshotName(px *v1alpha1.Proxy) string {
	return px.InstanceName() + "-credentials"
}

// SnapshotCredentials reads the credentials a Proxy's proxy demands. A Managed Proxy
// with a snapshot (status.credentialsSecret) gets the snapshot's: what its instance was
// built with, whatever the referenced Secret holds now. Any other Proxy (an External one,
// one whose instance is not built yet) gets the referenced Secret's, as SecretCredentials
// reads them. Its Credentials method is the CredentialsFunc of the health probe and
// discovery.
type SnapshotCredentials struct {
	Reader   client.Reader
	Metadata client.Reader // as SecretCredentials.Metadata
}

var _ CredentialsFunc = SnapshotCredentials{}.Credentials

// Credentials returns the credentials px's proxy demands: nil when it demands none.
func (s SnapshotCredentials) Credentials(ctx context.Context, px *v1alpha1.Proxy) (*Credentials, error) {
	if px.Spec.Mode != v1alpha1.ProxyModeExternal && px.Status.CredentialsSecret != "" {
		return ReadSnapshot(ctx, s.Reader, px)
	}
	return SecretCredentials(s).Credentials(ctx, px)
}

// ReadSnapshot reads the Secret status.credentialsSecret names, which must be
// controlled by px (a Secret of that name someone else made is not px's snapshot). Its
// errors name the Secret and wrap ErrSecretMissing or ErrSecretKeyMissing, never quoting
// a value.
func ReadSnapshot(ctx context.Context, r client.Reader, px *v1alpha1.Proxy) (*Credentials, error) {
	key := client.ObjectKey{Namespace: px.Namespace, Name: px.Status.CredentialsSecret}
	var sec corev1.Secret
	if err := r.Get(ctx, key, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: credentials snapshot %s (status.credentialsSecret) does not exist", ErrSecretMissing, key)
		}
		return nil, fmt.Errorf("reading credentials snapshot %s (status.credentialsSecret): %w", key, err)
	}
	if !metav1.IsControlledBy(&sec, px) {
		return nil, fmt.Errorf("%w: secret %s (status.credentialsSecret) is not controlled by proxy %s/%s, so it is not its credentials snapshot",
			ErrSecretMissing, key, px.Namespace, px.Name)
	}
	return credentialsOf(&sec, fmt.Sprintf("credentials snapshot %s (status.credentialsSecret)", key))
}

// credentialsOf returns the username and password keys of sec, which what names in
// errors; ErrSecretKeyMissing names a missing or empty key.
func credentialsOf(sec *corev1.Secret, what string) (*Credentials, error) {
	var c Credentials
	for _, kv := range []struct {
		name string
		dst  *string
	}{{SecretKeyUsername, &c.Username}, {SecretKeyPassword, &c.Password}} {
		v, ok := sec.Data[kv.name]
		if !ok || len(v) == 0 {
			return nil, fmt.Errorf("%w: %s has no key %q, or it is empty", ErrSecretKeyMissing, what, kv.name)
		}
		*kv.dst = string(v)
	}
	return &c, nil
}

// SnapshotData is the data of a snapshot of c: the keys of a basic-auth Secret.
func SnapshotData(c Credentials) map[string][]byte {
	return map[string][]byte{SecretKeyUsername: []byte(c.Username), SecretKeyPassword: []byte(c.Password)}
}
