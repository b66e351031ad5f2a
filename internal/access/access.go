package access

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/singleflight"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/utils/clock"
)

// The defaults of Options. The TTLs are those of kube-rbac-proxy and of the API server's
// delegating authenticator and authorizer: a token the API server stops knowing is
// refused within 2 minutes, a revoked RoleBinding takes effect within 5, and a grant
// within 30 seconds of a denial.
const (
	DefaultAuthenticatedTTL   = 2 * time.Minute
	DefaultUnauthenticatedTTL = 10 * time.Second
	DefaultAllowTTL           = 5 * time.Minute
	DefaultDenyTTL            = 30 * time.Second
	DefaultTokenCacheSize     = 4096
	DefaultDecisionCacheSize  = 16384
	// reviewTimeout bounds one review; the review is shared by every request waiting for
	// the same answer, so it does not end with the request that started it.
	reviewTimeout = 10 * time.Second
)

// Options configure an Access; zero fields take the defaults.
type Options struct {
	AuthenticatedTTL, UnauthenticatedTTL time.Duration
	AllowTTL, DenyTTL                    time.Duration
	TokenCacheSize, DecisionCacheSize    int
	Clock                                clock.PassiveClock
}

// Access authenticates tokens and authorizes callers through a Reviewer, caching both
// answers (an error is never cached), with concurrent identical look-ups sharing one
// review. It is safe for concurrent use.
type Access struct {
	r         Reviewer
	opts      Options
	tokens    *cache.LRUExpireCache // token digest → tokenAnswer
	decisions *cache.LRUExpireCache // caller key and attributes → Decision
	flights   singleflight.Group
}

// New is an Access asking r.
func New(r Reviewer, opts Options) *Access {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&opts.AuthenticatedTTL, DefaultAuthenticatedTTL)
	def(&opts.UnauthenticatedTTL, DefaultUnauthenticatedTTL)
	def(&opts.AllowTTL, DefaultAllowTTL)
	def(&opts.DenyTTL, DefaultDenyTTL)
	if opts.TokenCacheSize <= 0 {
		opts.TokenCacheSize = DefaultTokenCacheSize
	}
	if opts.DecisionCacheSize <= 0 {
		opts.DecisionCacheSize = DefaultDecisionCacheSize
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Access{r: r, opts: opts,
		tokens:    cache.NewLRUExpireCacheWithClock(opts.TokenCacheSize, opts.Clock),
		decisions: cache.NewLRUExpireCacheWithClock(opts.DecisionCacheSize, opts.Clock)}
}

type tokenAnswer struct {
	caller *Caller
	reason string // why not, when caller is nil
}

func (t tokenAnswer) result() (*Caller, error) {
	if t.caller == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnauthenticated, t.reason)
	}
	return t.caller, nil
}

// Authenticate is the caller tok belongs to. Errors: ErrUnauthenticated when the API
// server does not know the token; ErrUnavailable when it could not be asked.
func (a *Access) Authenticate(ctx context.Context, tok Token) (*Caller, error) {
	if tok.raw == "" {
		return nil, fmt.Errorf("%w: empty bearer token", ErrUnauthenticated)
	}
	if v, ok := a.tokens.Get(tok.digest); ok {
		tokenHit.Inc()
		return v.(tokenAnswer).result()
	}
	tokenMiss.Inc()
	v, err, _ := a.flights.Do("t"+string(tok.digest[:]), func() (any, error) {
		if v, ok := a.tokens.Get(tok.digest); ok { // a flight that just ended filled it
			return v, nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		st, err := a.r.ReviewToken(rctx, tok.raw)
		if err != nil {
			reviews.WithLabelValues(kindToken, "error").Inc()
			return nil, fmt.Errorf("%w: authenticating the bearer token: %w", ErrUnavailable, err)
		}
		ans, ttl := tokenAnswer{reason: "the API server does not know the token (unknown, expired or revoked)"}, a.opts.UnauthenticatedTTL
		switch {
		case st.Authenticated && st.User.Username != "":
			ans, ttl = tokenAnswer{caller: NewCaller(st.User.Username, st.User.UID, st.User.Groups, extraOf(st.User.Extra))}, a.opts.AuthenticatedTTL
			reviews.WithLabelValues(kindToken, "authenticated").Inc()
		case st.Error != "":
			ans.reason = st.Error
			fallthrough
		default:
			reviews.WithLabelValues(kindToken, "unauthenticated").Inc()
		}
		a.tokens.Add(tok.digest, ans, ttl)
		return ans, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(tokenAnswer).result()
}

// Decision is an answer to whether a caller may do something.
type Decision struct {
	Allowed bool
	// Reason is the authorizer's, often empty for a denial by RBAC.
	Reason string
	// Expires is when the cached answer stops being used; zero: never (a caller
	// allowed everything).
	Expires time.Time
}

// Allowed decides whether c may do attrs. A caller with AllNamespaces may do anything,
// without a review. Errors (ErrUnavailable) never allow.
func (a *Access) Allowed(ctx context.Context, c *Caller, attrs Attributes) (Decision, error) {
	if c.AllNamespaces {
		return Decision{Allowed: true}, nil
	}
	key := c.key + "\x00" + attrs.Verb + "\x00" + attrs.Group + "\x00" + attrs.Resource + "\x00" + attrs.Subresource + "\x00" + attrs.Namespace
	if v, ok := a.decisions.Get(key); ok {
		accessHit.Inc()
		return v.(Decision), nil
	}
	accessMiss.Inc()
	v, err, _ := a.flights.Do("a"+key, func() (any, error) {
		if v, ok := a.decisions.Get(key); ok {
			return v, nil
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reviewTimeout)
		defer cancel()
		st, err := a.r.ReviewAccess(rctx, authzv1.SubjectAccessReviewSpec{
			User: c.User, UID: c.UID, Groups: c.Groups, Extra: extraOfAuthz(c.Extra),
			ResourceAttributes: &authzv1.ResourceAttributes{Namespace: attrs.Namespace, Verb: attrs.Verb,
				Group: attrs.Group, Resource: attrs.Resource, Subresource: attrs.Subresource},
		})
		if err != nil {
			reviews.WithLabelValues(kindAccess, "error").Inc()
			return nil, fmt.Errorf("%w: asking whether %s may %s %s in %q: %w", ErrUnavailable, c.User, attrs.Verb, attrs.resource(), attrs.Namespace, err)
		}
		if st.EvaluationError != "" && !st.Allowed && !st.Denied {
			// No authorizer had an opinion because one failed: not a decision to keep.
			reviews.WithLabelValues(kindAccess, "error").Inc()
			return nil, fmt.Errorf("%w: asking whether %s may %s %s in %q: %s", ErrUnavailable, c.User, attrs.Verb, attrs.resource(), attrs.Namespace, st.EvaluationError)
		}
		d, ttl := Decision{Allowed: st.Allowed, Reason: st.Reason}, a.opts.DenyTTL
		if d.Allowed {
			ttl = a.opts.AllowTTL
			reviews.WithLabelValues(kindAccess, "allowed").Inc()
		} else {
			reviews.WithLabelValues(kindAccess, "denied").Inc()
		}
		d.Expires = a.opts.Clock.Now().Add(ttl)
		a.decisions.Add(key, d, ttl)
		return d, nil
	})
	if err != nil {
		return Decision{}, err
	}
	return v.(Decision), nil
}

// Namespaces is where c may do every one of attrs (their Namespace ignored) among
// namespaces: everywhere (all) when it may at the cluster scope, else allowed[i] for
// namespaces[i]. expires is the soonest expiry of the decisions the answer rests on
// (zero: never), after which it must be worked out again.
func (a *Access) Namespaces(ctx context.Context, c *Caller, namespaces []string, attrs ...Attributes) (all bool, allowed []bool, expires time.Time, err error) {
	soonest := func(d Decision) {
		if !d.Expires.IsZero() && (expires.IsZero() || d.Expires.Before(expires)) {
			expires = d.Expires
		}
	}
	every := func(ns string) (bool, error) {
		for _, at := range attrs {
			at.Namespace = ns
			d, err := a.Allowed(ctx, c, at)
			if err != nil {
				return false, err
			}
			soonest(d)
			if !d.Allowed {
				return false, nil
			}
		}
		return true, nil
	}
	if all, err = every(""); err != nil || all {
		return all, nil, expires, err
	}
	allowed = make([]bool, len(namespaces))
	for i, ns := range namespaces {
		if allowed[i], err = every(ns); err != nil {
			return false, nil, expires, err
		}
	}
	return false, allowed, expires, nil
}
