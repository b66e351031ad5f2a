// Package kube wires the gateway (package gateway) to discovery: its Chooser is
// discovery's own choice (Server.Choose, the code GET /v1/proxies/pick runs), its
// Authenticator discovery's token check (Server.AuthenticateToken), its Reporter the ban
// recorder POST /v1/feedback hands reports to (Server.Report). Nothing of the choice is
// copied here; this package only translates requests, answers and errors.
package kube

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gateway"
)

// Adapter is a discovery server as the gateway's Chooser, Authenticator and Reporter.
type Adapter struct {
	Server *discovery.Server
	// Pools reads ProxyPools (the cache): a pool that exists with no eligible exit is an
	// *gateway.EmptyPoolError, which the gateway holds requests for. Nil: every pool
	// without a published proxy is unknown.
	Pools client.Reader
	Log   logr.Logger

	wake atomic.Pointer[func()]
}

var (
	_ gateway.Chooser       = (*Adapter)(nil)
	_ gateway.Authenticator = (*Adapter)(nil)
	_ gateway.Reporter      = (*Adapter)(nil)
)

// classed is discovery's error as it is, matching the gateway's error class too.
type classed struct {
	class error
	err   error
}

func (e *classed) Error() string        { return e.err.Error() }
func (e *classed) Unwrap() error        { return e.err }
func (e *classed) Is(target error) bool { return target == e.class }

// Choose asks discovery for the exit: the session is pick's key, the target host its
// domain, the identity's namespaces its caller's.
func (a *Adapter) Choose(ctx context.Context, req gateway.ChoiceRequest) (gateway.Exit, error) {
	ch, err := a.Server.Choose(ctx, discovery.Choice{
		AllNamespaces: req.Identity.AllNamespaces,
		Namespaces:    req.Identity.Namespaces,
		Namespace:     req.Namespace,
		Pool:          req.Pool,
		Provider:      req.Provider,
		Region:        req.Region,
		Zone:          req.Zone,
		LabelSelector: req.Labels,
		Key:           req.Session,
		Rotation:      req.Rotation,
		Strict:        req.Strict,
		Domain:        req.Site,
		Exclude:       req.Exclude,
		IPv6:          req.Family == gateway.FamilyIPv6,
	})
	var sat *discovery.SaturatedError
	var strict *discovery.StrictSessionError
	switch {
	case err == nil:
	case errors.As(err, &sat):
		return gateway.Exit{}, &gateway.SaturatedError{Site: sat.Site, RetryAfter: sat.RetryAfter}
	case errors.As(err, &strict):
		return gateway.Exit{}, &gateway.UnavailableError{Exit: strict.Proxy, Reason: strict.Reason}
	case req.Pool != "" && (errors.Is(err, discovery.ErrUnknownPool) || errors.Is(err, discovery.ErrNoProxy)):
		pool, lerr := a.existingPool(ctx, req)
		switch {
		case lerr != nil:
			return gateway.Exit{}, lerr
		case pool != nil && !startsChildren(pool):
			return gateway.Exit{}, &classed{gateway.ErrNoExit, fmt.Errorf("pool %s/%s has spec.replicas 0 and no spec.autoscaling: nothing starts a child of it", pool.Namespace, pool.Name)}
		case pool != nil:
			return gateway.Exit{}, &gateway.EmptyPoolError{Namespace: pool.Namespace, Pool: req.Pool, Reason: err.Error()}
		case errors.Is(err, discovery.ErrUnknownPool):
			return gateway.Exit{}, &classed{gateway.ErrUnknownPool, err}
		}
		return gateway.Exit{}, &classed{gateway.ErrNoExit, err}
	case errors.Is(err, discovery.ErrUnknownPool):
		return gateway.Exit{}, &classed{gateway.ErrUnknownPool, err}
	case errors.Is(err, discovery.ErrNoProxy):
		return gateway.Exit{}, &classed{gateway.ErrNoExit, err}
	default:
		return gateway.Exit{}, err
	}
	return gateway.Exit{Namespace: ch.Namespace, Name: ch.Name, Address: ch.Address, EgressIP: ch.EgressIP,
		User: ch.Username, Password: ch.Password, Pool: ch.Pool}, nil
}

// existingPool finds the ProxyPool req.Pool (not being deleted) among the namespaces req
// may use (req.Namespace when given; else the first, in name order, of those holding a
// pool of that name); nil when there is none.
func (a *Adapter) existingPool(ctx context.Context, req gateway.ChoiceRequest) (*v1alpha1.ProxyPool, error) {
	if a.Pools == nil {
		return nil, nil
	}
	if req.Namespace != "" {
		pool := &v1alpha1.ProxyPool{}
		err := a.Pools.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: req.Pool}, pool)
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, err
		case pool.DeletionTimestamp != nil:
			return nil, nil
		}
		return pool, nil
	}
	var list v1alpha1.ProxyPoolList
	if err := a.Pools.List(ctx, &list); err != nil {
		return nil, err
	}
	var found *v1alpha1.ProxyPool
	for i := range list.Items {
		if p := &list.Items[i]; p.Name == req.Pool && p.DeletionTimestamp == nil && req.Identity.May(p.Namespace) &&
			(found == nil || p.Namespace < found.Namespace) {
			found = p
		}
	}
	return found, nil
}

// startsChildren says whether a pool without an eligible exit will get one without
// anyone's edit: it asks for children (spec.replicas above 0, or unset: the default 1),
// or its autoscaler sizes it from the demand a held request reports.
func startsChildren(p *v1alpha1.ProxyPool) bool {
	return p.Spec.Autoscaling != nil || p.Spec.Replicas == nil || *p.Spec.Replicas > 0
}

// Authenticate checks the proxy password as a discovery bearer token.
func (a *Adapter) Authenticate(ctx context.Context, _, password string) (gateway.Identity, error) {
	sc, err := a.Server.AuthenticateToken(ctx, password)
	if errors.Is(err, discovery.ErrInvalidToken) {
		return gateway.Identity{}, &classed{gateway.ErrBadCredentials, err}
	}
	if err != nil {
		return gateway.Identity{}, err
	}
	return gateway.Identity{Name: sc.Name, AllNamespaces: sc.AllNamespaces, Namespaces: sc.Namespaces}, nil
}

// Unreachable reports the exit as POST /v1/feedback's outcome unreachable does.
func (a *Adapter) Unreachable(exit gateway.Exit, cause error) {
	if err := a.Server.Report(types.NamespacedName{Namespace: exit.Namespace, Name: exit.Name}, "", bans.Unreachable, 0); err != nil {
		a.Log.V(1).Info("unreachable report not taken", "exit", exit.ID(), "cause", cause.Error(), "reason", err.Error())
	}
}

// Banned reports a site's ban (throttled for 429) of the exit as POST /v1/feedback does;
// the recorder coalesces the reports of one exit and site until it writes them.
func (a *Adapter) Banned(exit gateway.Exit, site string, status int, retryAfter time.Duration) {
	outcome := bans.Banned
	if status == http.StatusTooManyRequests {
		outcome = bans.Throttled
	}
	if err := a.Server.Report(types.NamespacedName{Namespace: exit.Namespace, Name: exit.Name}, site, outcome, retryAfter); err != nil {
		a.Log.V(1).Info("ban report not taken", "exit", exit.ID(), "site", site, "status", status, "reason", err.Error())
	}
}
