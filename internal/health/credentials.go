package health

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// credentials are what the probe of px sends as Proxy-Authorization: none without an
// Options.Credentials. A failed lookup (a missing Secret) fails the probe with its reason.
func (e *Engine) credentials(ctx context.Context, px *v1alpha1.Proxy) (*proxyconfig.Credentials, error) {
	if e.opts.Credentials == nil {
		return nil, nil
	}
	c, err := e.opts.Credentials(ctx, px)
	if err != nil {
		return nil, fmt.Errorf("credentials for the probe of %s: %w", client.ObjectKeyFromObject(px), err)
	}
	return c, nil
}
