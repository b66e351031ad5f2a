package proxyconfig

import (
	"context"
	"fmt"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// Rendered is what the reconciler hands a provider for a Proxy, and what its spec hash
// covers in place of spec.cloudInit.
type Rendered struct {
	// UserData is the instance's user-data. It may hold the password: never log it.
	UserData []byte
	// HashInput goes into the spec hash; see SpecHashInput.
	HashInput string
	// WireGuard is the tunnel configuration rendered in, or nil. It holds the private
	// key: never log it.
	WireGuard *WireGuard
}

// ForProxy renders px's user-data, reading its credentials with creds (which may be nil
// when px has no spec.proxy.basicAuth). A Proxy without spec.proxy, or an External one,
// gets spec.cloudInit unchanged as both user-data and hash input, so the spec hash of a
// Proxy that does not use spec.proxy is what it was before spec.proxy existed. Errors
// are creds' (ErrSecretMissing, ErrSecretKeyMissing, ErrBadCredentials, a failed read)
// or the rendering's (ErrUserCloudInit and the range and port checks).
func ForProxy(ctx context.Context, px *v1alpha1.Proxy, creds CredentialsFunc) (Rendered, error) {
	return ForProxyWith(ctx, px, creds, nil)
}

// ForProxyWith is ForProxy that also reads the WireGuard configuration
// spec.proxy.egress.wireguard names with wgs (nil when no Proxy has one); its errors
// include wgs' (ErrWireGuardSecret, a failed read).
func ForProxyWith(ctx context.Context, px *v1alpha1.Proxy, creds CredentialsFunc, wgs WireGuardFunc) (Rendered, error) {
	if px.Spec.Proxy == nil || px.Spec.Mode == v1alpha1.ProxyModeExternal {
		return Rendered{UserData: []byte(px.Spec.CloudInit), HashInput: px.Spec.CloudInit}, nil
	}
	var c *Credentials
	if px.Spec.Proxy.BasicAuth != nil {
		if creds == nil {
			return Rendered{}, errNoCredentialsFunc
		}
		var err error
		if c, err = creds(ctx, px); err != nil {
			return Rendered{}, err
		}
	}
	cfg := ConfigFor(px, c)
	if name, field := px.WireGuardRef(); name != "" {
		if wgs == nil {
			return Rendered{}, fmt.Errorf("%s is set but the operator was given no way to read WireGuard Secrets", field)
		}
		wg, err := wgs(ctx, px)
		if err != nil {
			return Rendered{}, err
		}
		cfg.WireGuard = wg
	}
	doc, err := UserData(cfg, px.Spec.CloudInit)
	if err != nil {
		return Rendered{}, err
	}
	in, err := SpecHashInput(cfg, px.Spec.CloudInit)
	if err != nil {
		return Rendered{}, err
	}
	return Rendered{UserData: doc, HashInput: in, WireGuard: cfg.WireGuard}, nil
}
