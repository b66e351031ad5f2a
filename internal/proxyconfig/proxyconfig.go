// Package proxyconfig renders a Proxy's own configuration - tinyproxy, listening on
// spec.port, open to spec.proxy.allowedSourceRanges, with basic auth when the Proxy has
// credentials - as cloud-init user-data, combined with the user's spec.cloudInit when
// there is one. It is provider-independent: the reconciler calls it and hands the result
// to a provider as the instance's user-data; no provider imports it.
//
// Nothing here logs. The rendered document holds the proxy's password: callers must not
// log it or put it in Events, status or spans.
package proxyconfig

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// Config is what the rendering needs.
type Config struct {
	// Port is the port tinyproxy listens on (spec.port).
	Port int32
	// AllowedSourceRanges are the networks tinyproxy serves (spec.proxy.allowedSourceRanges).
	AllowedSourceRanges []string
	// AllowedDestinations are the exceptions to the egress fence
	// (spec.proxy.allowedDestinations).
	AllowedDestinations []string
	// Credentials, when not nil, make tinyproxy demand basic auth.
	Credentials *Credentials
	// AllowOpenProxy lets AllowedSourceRanges admit every IPv4 or IPv6 client without
	// Credentials (spec.proxy.allowOpenProxy).
	AllowOpenProxy bool
	// WireGuard, when not nil, routes the proxy's own outbound traffic through this
	// tunnel, fail-closed (spec.proxy.egress.wireguard).
	WireGuard *WireGuard
}

// Credentials are a proxy's basic-auth user name and password.
type Credentials struct {
	Username string
	Password string
}

// ConfigFor is the Config of px, whose spec.proxy must be set, with creds (nil when
// spec.proxy.basicAuth is not set). It does not validate; rendering does.
func ConfigFor(px *v1alpha1.Proxy, creds *Credentials) Config {
	c := Config{Port: px.Spec.Port, Credentials: creds}
	if px.Spec.Proxy != nil {
		c.AllowOpenProxy = px.Spec.Proxy.AllowOpenProxy
		for _, r := range px.Spec.Proxy.AllowedSourceRanges {
			c.AllowedSourceRanges = append(c.AllowedSourceRanges, string(r))
		}
		for _, r := range px.Spec.Proxy.AllowedDestinations {
			c.AllowedDestinations = append(c.AllowedDestinations, string(r))
		}
	}
	return c
}

// maxCredentials is the longest user name and password together that tinyproxy takes:
// it skips a longer BasicAuth line with a warning, and would then serve without auth.
const maxCredentials = 256

// allowedCharacters says, for error messages, what a user name or password may hold:
// tinyproxy parses both with the pattern [-a-z0-9._]+, ignoring case.
const allowedCharacters = "letters A-Z and a-z, digits, '-', '.' and '_'"

// Validation errors. The messages never quote a credential.
var (
	ErrNoSourceRanges = errors.New("spec.proxy.allowedSourceRanges is empty: list the networks (CIDRs) allowed to use the proxy")
	ErrBadCredentials = errors.New("credentials cannot be written into tinyproxy's configuration")

	errNoCredentialsFunc = errors.New("spec.proxy.basicAuth is set but the operator was given no way to read Secrets")
)

// Validate checks the user name and password can be written safely into tinyproxy's
// BasicAuth line. Its errors wrap ErrBadCredentials, name the key (username or password)
// and say which characters are allowed, without quoting the value.
func (c Credentials) Validate() error {
	for _, kv := range []struct{ key, value string }{{"username", c.Username}, {"password", c.Password}} {
		if kv.value == "" {
			return fmt.Errorf("%w: %s is empty", ErrBadCredentials, kv.key)
		}
		for i := 0; i < len(kv.value); i++ {
			if !credentialByte(kv.value[i]) {
				return fmt.Errorf("%w: %s holds a character other than %s", ErrBadCredentials, kv.key, allowedCharacters)
			}
		}
	}
	if n := len(c.Username) + len(c.Password); n > maxCredentials {
		return fmt.Errorf("%w: username and password are %d characters together, at most %d are allowed", ErrBadCredentials, n, maxCredentials)
	}
	return nil
}

func credentialByte(b byte) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		return true
	}
	return b == '-' || b == '.' || b == '_'
}

// validate checks c and returns its source ranges and allowed destinations as networks
// (host bits cleared).
func (c Config) validate() (sources, destinations []netip.Prefix, err error) {
	if c.Port < 1 || c.Port > 65535 {
		return nil, nil, fmt.Errorf("spec.port %d: want a port from 1 to 65535", c.Port)
	}
	if len(c.AllowedSourceRanges) == 0 {
		return nil, nil, ErrNoSourceRanges
	}
	if sources, err = networks("spec.proxy.allowedSourceRanges", c.AllowedSourceRanges); err != nil {
		return nil, nil, err
	}
	if err := checkOpen("spec.proxy.allowedSourceRanges", sources, c.Credentials != nil, c.AllowOpenProxy); err != nil {
		return nil, nil, err
	}
	if destinations, err = networks("spec.proxy.allowedDestinations", c.AllowedDestinations); err != nil {
		return nil, nil, err
	}
	if c.Credentials != nil {
		if err := c.Credentials.Validate(); err != nil {
			return nil, nil, err
		}
	}
	return sources, destinations, nil
}

// networks parses field's CIDRs, host bits cleared.
func networks(field string, cidrs []string) ([]netip.Prefix, error) {
	nets := make([]netip.Prefix, 0, len(cidrs))
	for i, r := range cidrs {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return nil, fmt.Errorf("%s[%d] %q: want a network in CIDR notation such as 10.0.0.0/8: %w", field, i, r, err)
		}
		nets = append(nets, p.Masked())
	}
	return nets, nil
}

// CredentialsFunc returns the basic-auth credentials of px: nil and no error when px has
// none (no spec.proxy.basicAuth). Its errors say which Secret or key is missing and never
// quote a value. The health engine and the discovery server take one; nil means that no
// Proxy has credentials.
type CredentialsFunc func(ctx context.Context, px *v1alpha1.Proxy) (*Credentials, error)
