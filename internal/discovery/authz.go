package discovery

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/util/cache"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/access"
)

// What a Kubernetes caller needs, on proxies of egress.hrajfrisbee.cz in the namespace
// of the proxies it touches (docs/discovery.md lists them; config/rbac grants them):
// list and pick need list on proxies; URLs with credentials also need get on
// proxies/credentials; each feedback report needs create on proxies/feedback. RBAC grants
// the two subresource names though the API serves neither.
var (
	attrList        = access.Attributes{Verb: "list", Group: v1alpha1.GroupVersion.Group, Resource: "proxies"}
	attrCredentials = access.Attributes{Verb: "get", Group: v1alpha1.GroupVersion.Group, Resource: "proxies", Subresource: "credentials"}
	attrFeedback    = access.Attributes{Verb: "create", Group: v1alpha1.GroupVersion.Group, Resource: "proxies", Subresource: "feedback"}

	readAttrs            = []access.Attributes{attrList}
	readCredentialsAttrs = []access.Attributes{attrList, attrCredentials}
)

// The ClusterRoles config/rbac ships (names as config/default prefixes them), which a
// refusal tells the caller to bind.
const (
	crawlerRole     = "egress-proxies-operator-crawler"
	credentialsRole = "egress-proxies-operator-credentials"
)

// maxScopes bounds the cache of callers' namespace scopes.
const maxScopes = 4096

// forbidden is the 403 refusing at to c, in Kubernetes' wording, with what to grant.
func forbidden(c *access.Caller, at access.Attributes, reason string) *apiError {
	role := crawlerRole
	if at.Subresource == attrCredentials.Subresource {
		role = credentialsRole
	}
	subject := "--user=" + c.User
	if sa, ok := strings.CutPrefix(c.User, "system:serviceaccount:"); ok {
		subject = "--serviceaccount=" + sa
	}
	msg := at.Forbidden(c)
	if reason != "" {
		msg += ": " + reason
	}
	if at.Namespace != "" {
		msg += fmt.Sprintf("; grant it with a RoleBinding to the ClusterRole %s in that namespace: kubectl -n %s create rolebinding <name> --clusterrole=%s %s",
			role, at.Namespace, role, subject)
	}
	return &apiError{status: http.StatusForbidden, Message: msg}
}

// unavailable is the 503 of an authentication or authorization that could not be made.
func unavailable(err error) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, Message: "cannot check the caller's access: " + err.Error()}
}

// allowed checks at for c; a refusal or a failed check is the answer to send.
func (s *Server) allowed(ctx context.Context, c *access.Caller, at access.Attributes) *apiError {
	d, err := s.opts.Access.Allowed(ctx, c, at)
	if err != nil {
		return unavailable(err)
	}
	if !d.Allowed {
		return forbidden(c, at, d.Reason)
	}
	return nil
}

// authorizeRead limits a list or pick by c to what c may read: a request naming a
// namespace is refused unless c may list proxies there (and get their credentials, if it
// asks for them); one naming none is answered from the namespaces c may use, never more.
// A caller that is nil (no authentication configured) or allowed everything reads all.
func (s *Server) authorizeRead(ctx context.Context, c *access.Caller, snap *Snapshot, req *request) *apiError {
	if c == nil || c.AllNamespaces {
		return nil
	}
	attrs := readAttrs
	if req.credentials {
		attrs = readCredentialsAttrs
	}
	if ns := req.filter.namespace; ns != "" {
		for _, at := range attrs {
			at.Namespace = ns
			if aerr := s.allowed(ctx, c, at); aerr != nil {
				return aerr
			}
		}
		return nil
	}
	sc, err := s.scope(ctx, c, snap, req.credentials, attrs)
	if err != nil {
		return unavailable(err)
	}
	req.filter.nsAllowed = sc.allowed
	return nil
}

// nsScope is which of a snapshot's namespaces a caller may read.
type nsScope struct {
	snap *Snapshot
	// allowed has a bit per index of snap.namespaces; nil: every one of them.
	allowed []uint64
}

type scopeKey struct {
	caller      string
	credentials bool
}

// scope is c's nsScope over snap, from the cache while snap is the current snapshot and
// the decisions it rests on hold: a steady stream of requests works it out once per
// snapshot or expiry, not per request.
func (s *Server) scope(ctx context.Context, c *access.Caller, snap *Snapshot, credentials bool, attrs []access.Attributes) (*nsScope, error) {
	key := scopeKey{c.Key(), credentials}
	if v, ok := s.scopes.Get(key); ok {
		if sc := v.(*nsScope); sc.snap == snap {
			return sc, nil
		}
	}
	all, allowed, expires, err := s.opts.Access.Namespaces(ctx, c, snap.namespaces, attrs...)
	if err != nil {
		return nil, err
	}
	sc := &nsScope{snap: snap}
	if !all && !everyOne(allowed) {
		sc.allowed = make([]uint64, (len(allowed)+63)/64+1)
		for i, ok := range allowed {
			if ok {
				sc.allowed[i>>6] |= 1 << (uint(i) & 63)
			}
		}
	}
	if ttl := expires.Sub(s.opts.Clock.Now()); ttl > 0 {
		s.scopes.Add(key, sc, ttl)
	}
	return sc, nil
}

func everyOne(bs []bool) bool {
	for _, b := range bs {
		if !b {
			return false
		}
	}
	return true
}

// authorizeReports checks, for each report resolved to a proxy (ok[i]), that c may
// create feedback in that proxy's namespace; it returns the refusal per report ("" when
// allowed). A check that cannot be made fails the whole request, before anything is
// recorded.
func (s *Server) authorizeReports(ctx context.Context, c *access.Caller, namespaces []string) ([]string, *apiError) {
	refused := make([]string, len(namespaces))
	if c == nil || c.AllNamespaces {
		return refused, nil
	}
	for i, ns := range namespaces {
		if ns == "" {
			continue
		}
		at := attrFeedback
		at.Namespace = ns
		aerr := s.allowed(ctx, c, at)
		switch {
		case aerr == nil:
		case aerr.status == http.StatusForbidden:
			refused[i] = aerr.Message
		default:
			return nil, aerr
		}
	}
	return refused, nil
}

// newScopeCache is the cache of callers' namespace scopes.
func newScopeCache(clk cache.Clock) *cache.LRUExpireCache {
	return cache.NewLRUExpireCacheWithClock(maxScopes, clk)
}

// authFailure is the answer to a token that could not be authenticated.
func authFailure(err error) *apiError {
	if errors.Is(err, access.ErrUnauthenticated) {
		return &apiError{status: http.StatusUnauthorized, challenge: authRealm + `, error="invalid_token"`,
			Message: "invalid bearer token: " + strings.TrimPrefix(err.Error(), access.ErrUnauthenticated.Error()+": ")}
	}
	return unavailable(err)
}
