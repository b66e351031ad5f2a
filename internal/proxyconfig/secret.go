package proxyconfig

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// The keys of a basic-auth Secret.
const (
	SecretKeyUsername = "username"
	SecretKeyPassword = "password"
)

// Errors of SecretCredentials, for the reconciler to tell "wait for the user" from a
// failed API read (which it retries): ErrSecretMissing and ErrSecretKeyMissing, and
// ErrBadCredentials from Credentials.Validate.
var (
	ErrSecretMissing    = errors.New("basic-auth secret missing")
	ErrSecretKeyMissing = errors.New("basic-auth secret incomplete")
)

// SecretCredentials reads a Proxy's credentials from the Secret spec.proxy.basicAuth.secretRef
// names, in the Proxy's namespace, with the keys username and password. Its Credentials
// method is a CredentialsFunc. It only reads: a Secret without a password is the user's
// to fill, and the Proxy waits for it.
type SecretCredentials struct {
	Reader client.Reader
}

var _ CredentialsFunc = SecretCredentials{}.Credentials

// Credentials returns px's credentials: nil without spec.proxy.basicAuth. For a Managed
// Proxy they must be writable into tinyproxy's configuration (Credentials.Validate); for
// an External one they are sent as they are, so they need only be non-empty, with no ':'
// in the user name (basic auth cannot carry one). Errors name the Secret and the key,
// never a value.
func (s SecretCredentials) Credentials(ctx context.Context, px *v1alpha1.Proxy) (*Credentials, error) {
	if px.Spec.Proxy == nil || px.Spec.Proxy.BasicAuth == nil {
		return nil, nil
	}
	key := client.ObjectKey{Namespace: px.Namespace, Name: string(px.Spec.Proxy.BasicAuth.SecretRef.Name)}
	var sec corev1.Secret
	if err := s.Reader.Get(ctx, key, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: secret %s (spec.proxy.basicAuth.secretRef) does not exist", ErrSecretMissing, key)
		}
		return nil, fmt.Errorf("reading secret %s (spec.proxy.basicAuth.secretRef): %w", key, err)
	}
	c, err := credentialsOf(&sec, fmt.Sprintf("secret %s (spec.proxy.basicAuth.secretRef)", key))
	if err != nil {
		return nil, err
	}
	if px.Spec.Mode == v1alpha1.ProxyModeExternal {
		if strings.Contains(c.Username, ":") {
			return nil, fmt.Errorf("secret %s (spec.proxy.basicAuth.secretRef): %w: username holds a ':', which basic auth cannot carry", key, ErrBadCredentials)
		}
		return c, nil
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("secret %s (spec.proxy.basicAuth.secretRef): %w", key, err)
	}
	return c, nil
}
