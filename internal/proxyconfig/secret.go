package proxyconfig

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// The keys of a basic-auth Secret.
const (
	SecretKeyUsername = "username"
	SecretKeyPassword = "password"
)

// Errors of SecretCredentials, for the reconciler to tell "wait for the user" from a
// failed API read (which it retries): ErrSecretMissing, ErrSecretNotOptedIn and
// ErrSecretKeyMissing, and ErrBadCredentials from Credentials.Validate.
var (
	ErrSecretMissing    = errors.New("basic-auth secret missing")
	ErrSecretNotOptedIn = errors.New("basic-auth secret not opted in")
	ErrSecretKeyMissing = errors.New("basic-auth secret incomplete")
)

// OptedIn reports whether a Secret carries v1alpha1.CredentialsLabel set to "true", the
// user's consent to the operator reading it. The operator reads no other Secret.
func OptedIn(sec metav1.Object) bool {
	return sec.GetLabels()[v1alpha1.CredentialsLabel] == "true"
}

// SecretCredentials reads a Proxy's credentials from the Secret spec.proxy.basicAuth.secretRef
// names, in the Proxy's namespace, with the keys username and password, provided the
// Secret is opted in (OptedIn). Its Credentials method is a CredentialsFunc. It only
// reads: a Secret without a password is the user's to fill, and the Proxy waits for it.
type SecretCredentials struct {
	// Reader reads the Secret. The manager passes its cache, which holds only opted-in
	// Secrets, so the data of any other Secret never reaches the operator; with a Reader
	// that sees every Secret, one without the label is refused all the same.
	Reader client.Reader
	// Metadata, when set, is asked for the Secret's metadata alone (a
	// PartialObjectMetadata read, never the data) when Reader does not find it, to tell
	// a Secret that does not exist from one without the label, which a cache restricted
	// to labelled Secrets cannot. Without it, either is ErrSecretMissing.
	Metadata client.Reader
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
			return nil, secretNotFound(ctx, s.Metadata, key, basicAuthField, ErrSecretMissing, ErrSecretNotOptedIn)
		}
		return nil, fmt.Errorf("reading secret %s (spec.proxy.basicAuth.secretRef): %w", key, err)
	}
	if !OptedIn(&sec) {
		return nil, notOptedIn(key, basicAuthField, ErrSecretNotOptedIn)
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

const basicAuthField = "spec.proxy.basicAuth.secretRef"

// secretNotFound is the error for a Secret, named by field, that a Reader did not find:
// missing (wrapping missingErr), or (as metadata says) present without the label
// (wrapping notOptedInErr), or labelled a moment ago and not in the cache yet, which is
// retried as a failed read.
func secretNotFound(ctx context.Context, metadata client.Reader, key client.ObjectKey, field string, missingErr, notOptedInErr error) error {
	missing := fmt.Errorf("%w: secret %s (%s) does not exist", missingErr, key, field)
	if metadata == nil {
		return missing
	}
	meta := &metav1.PartialObjectMetadata{}
	meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	switch err := metadata.Get(ctx, key, meta); {
	case apierrors.IsNotFound(err):
		return missing
	case err != nil:
		return fmt.Errorf("reading the metadata of secret %s (%s): %w", key, field, err)
	case !OptedIn(meta):
		return notOptedIn(key, field, notOptedInErr)
	default:
		return fmt.Errorf("secret %s (%s) carries the label %s but is not in the operator's cache yet", key, field, v1alpha1.CredentialsLabel)
	}
}

func notOptedIn(key client.ObjectKey, field string, sentinel error) error {
	return fmt.Errorf("%w: secret %s (%s) lacks the label %s: \"true\", without which the operator does not read it; "+
		"add it if this Secret is meant for the proxy: kubectl label secret -n %s %s %s=true",
		sentinel, key, field, v1alpha1.CredentialsLabel, key.Namespace, key.Name, v1alpha1.CredentialsLabel)
}
