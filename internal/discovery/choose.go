package discovery

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/access"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// This file is pick's choice, shared by GET /v1/proxies/pick and the Go API the gateway
// calls (Choose, AuthenticateToken, Report): one selection code path for both.

// endpointGateway labels the saturation answers of Choose.
const endpointGateway = "gateway"

// chosen is pick's answer.
type chosen struct {
	it    *item
	entry Entry // it.Entry; with req.credentials, its URL carries them
	creds *proxyconfig.Credentials
	// credentialsRead: the choice went over credentials (req.credentials, past the
	// authorization and the saturation guard); failed are the proxies it passed over
	// because their credentials could not be read.
	credentialsRead bool
	failed          []string
}

// choose is pick's choice over all (both IP families) for req: among the proxies of
// req's family that authorize lets the caller read, after the saturation guard of req's
// site, less the excluded ones, the winner of req.key's rendezvous order, or without a
// key the req.rotation-th distinct egress address (Snapshot.rotate). With
// req.credentials, a proxy whose credentials cannot be read is passed over as an
// unhealthy one would be. endpoint labels the saturation metric.
func (s *Server) choose(ctx context.Context, all *Snapshot, req *request, authorize func(fam *Snapshot) *apiError, endpoint string) (chosen, *apiError) {
	snap := all.family(req.ipv6)
	if aerr := authorize(snap); aerr != nil {
		return chosen{}, aerr
	}
	if aerr := s.saturated(ctx, snap, &req.filter, endpoint); aerr != nil {
		return chosen{}, aerr
	}
	// Excluded after the guard: a client leaving out the proxies it tried does not make
	// the site look saturated.
	req.filter.exclude = all.excluded(req.exclude, snap)
	next := func(skip map[*item]bool) *item {
		if req.key == "" {
			return snap.rotate(req.rotation, &req.filter, skip)
		}
		return snap.pick(req.key, &req.filter, skip)
	}
	none := ErrNoProxy.Error()
	if !req.credentials {
		it := next(nil)
		if it == nil {
			return chosen{}, &apiError{status: http.StatusServiceUnavailable, Message: none}
		}
		return chosen{it: it, entry: it.Entry}, nil
	}
	ch := chosen{credentialsRead: true}
	skip := map[*item]bool{}
	for {
		it := next(skip)
		if it == nil {
			msg := none
			if len(ch.failed) > 0 {
				msg += fmt.Sprintf(" with readable credentials (%d left out: %s)", len(ch.failed), strings.Join(ch.failed, "; "))
			}
			return ch, &apiError{status: http.StatusServiceUnavailable, Message: msg}
		}
		c, aerr := s.credentialsOf(ctx, it.Entry)
		var e Entry
		if aerr == nil {
			e, aerr = withUser(it.Entry, c)
		}
		if aerr != nil {
			ch.failed = append(ch.failed, aerr.Message)
			skip[it] = true
			continue
		}
		ch.it, ch.creds, ch.entry = it, c, e
		return ch, nil
	}
}

// rotate is the n-th, modulo their number, of the distinct egress identities among the
// items f matches less skip, in the order of their egress addresses (as strings; a proxy
// whose address is unknown is an identity of its own, ordered by namespace/name), each
// identity standing for the proxy distinctEgress chooses for it. Consecutive n leave from
// distinct addresses, and the order stays the same while the set does. It walks
// Snapshot.egressOrder twice and allocates nothing.
func (s *Snapshot) rotate(n uint64, f *filter, skip map[*item]bool) *item {
	var count uint64
	s.eachEgress(f, skip, func(*item) bool { count++; return true })
	if count == 0 {
		return nil
	}
	want := n % count
	var got *item
	s.eachEgress(f, skip, func(it *item) bool {
		if want == 0 {
			got = it
			return false
		}
		want--
		return true
	})
	return got
}

// eachEgress calls fn, in egressOrder, with the proxy standing for each egress identity
// among the items f matches less skip (the first of its identity there, which is the one
// with the highest score for the identity), until fn returns false.
func (s *Snapshot) eachEgress(f *filter, skip map[*item]bool, fn func(*item) bool) {
	var last uint64
	have := false
	for _, it := range s.egressOrder {
		if have && it.egressSeed == last {
			continue
		}
		// Once the site's candidates are worked out, match no longer asks about the site.
		if !f.match(it) || skip[it] || (f.candsSet && f.site != "" && it.coolingFor(f.site, f.now)) {
			continue
		}
		last, have = it.egressSeed, true
		if !fn(it) {
			return
		}
	}
}

// egressKey orders egress identities: the address, or namespace/name without one (an
// address never contains "/").
func egressKey(it *item) string {
	if it.EgressIP != "" {
		return it.EgressIP
	}
	return it.Namespace + "/" + it.Name
}

// Choice is one choice of a proxy through the Go API, as GET /v1/proxies/pick makes it,
// with the caller's namespaces given rather than worked out from a token (the gateway
// has authenticated the caller with AuthenticateToken).
type Choice struct {
	// AllNamespaces, or else Namespaces, are the namespaces the caller may use.
	AllNamespaces bool
	Namespaces    []string
	// Namespace and Pool, when set, limit the choice as ?namespace= and ?pool= do.
	Namespace, Pool string
	// Provider, Region, Zone and LabelSelector, when set, limit it as ?provider=,
	// ?region=, ?zone= and ?labelSelector= do. A selector that does not parse is an
	// error wrapping ErrBadSelector.
	Provider, Region, Zone, LabelSelector string
	// Key is the session key (?key=). Without one, Rotation chooses: the Rotation-th
	// distinct egress address, modulo their number, in a fixed order.
	Key      string
	Rotation uint64
	// Strict: the proxy Key maps to among all the matching proxies whatever their health
	// is the only answer; when it cannot be chosen, a *StrictSessionError names it.
	Strict bool
	// Domain is the target host: its site (bans.Site, as ?domain= reads it) skips the
	// proxies cooling for it and is guarded against saturation. A host that is no site
	// (an IP address, a single-label name) chooses as without a domain.
	Domain string
	// Exclude lists proxies to leave out (?exclude=): namespace/name or a URL discovery
	// handed out.
	Exclude []string
	// IPv6 chooses among the proxies with an IPv6 address (?ipFamily=6).
	IPv6 bool
}

// Chosen is the proxy Choose chose, with its credentials.
type Chosen struct {
	Entry
	// Address is the proxy's host:port (from Entry.URL).
	Address string
	// Username and Password are what the proxy demands, empty when it demands none.
	Username, Password string
}

// The errors of Choose.
var (
	// ErrNoProxy: no proxy matches the choice (or none whose credentials can be read).
	ErrNoProxy = errors.New("no healthy proxy matches the request")
	// ErrUnknownPool: no published proxy, of any health, in the namespaces the caller may
	// use belongs to the pool.
	ErrUnknownPool = errors.New("unknown pool")
	// ErrBadSelector: Choice.LabelSelector is not a label selector.
	ErrBadSelector = errors.New("invalid label selector")
)

// SaturatedError is Choose's answer when more than the allowed share of the matching
// proxies are cooling for the site (pick's 503 with Retry-After).
type SaturatedError struct {
	Site       string
	RetryAfter time.Duration
	msg        string
}

func (e *SaturatedError) Error() string { return e.msg }

// StrictSessionError is Choose's answer to a strict choice whose proxy cannot be chosen.
type StrictSessionError struct {
	Proxy  string // namespace/name
	Reason string
}

func (e *StrictSessionError) Error() string {
	return fmt.Sprintf("proxy %s of the strict session is unavailable: %s", e.Proxy, e.Reason)
}

// Choose chooses one proxy for c by pick's own code path (choose), and reads its
// credentials. Errors: ErrNoProxy, ErrUnknownPool (wrapped, naming the pool), a
// *SaturatedError, a *StrictSessionError; any other is the server's own failure (the
// proxies are not read yet).
func (s *Server) Choose(ctx context.Context, c Choice) (Chosen, error) {
	all, err := s.src.Snapshot(ctx)
	if err != nil {
		return Chosen{}, fmt.Errorf("reading proxies: %w", err)
	}
	may := func(ns string) bool { return c.AllNamespaces || slices.Contains(c.Namespaces, ns) }
	if c.Namespace != "" && !may(c.Namespace) {
		return Chosen{}, fmt.Errorf("%w: the caller may not use namespace %q", ErrNoProxy, c.Namespace)
	}
	if c.Pool != "" && !all.hasPool(c.Pool, c.Namespace, may) {
		where := "the namespaces the caller may use"
		if c.Namespace != "" {
			where = "namespace " + c.Namespace
		}
		return Chosen{}, fmt.Errorf("%w %q: no proxy of it in %s", ErrUnknownPool, c.Pool, where)
	}
	req := &request{filter: filter{namespace: c.Namespace, pool: c.Pool, provider: c.Provider, region: c.Region, zone: c.Zone},
		key: c.Key, rotation: c.Rotation, credentials: true, ipv6: c.IPv6, exclude: c.Exclude}
	if c.LabelSelector != "" {
		sel, err := labels.Parse(c.LabelSelector)
		if err != nil {
			return Chosen{}, fmt.Errorf("%w %q: %v", ErrBadSelector, c.LabelSelector, err)
		}
		req.filter.selector = sel
	}
	if c.Domain != "" {
		if site, err := siteOf(c.Domain); err == nil {
			req.filter.site = site
		}
	}
	authorize := func(fam *Snapshot) *apiError {
		if !c.AllNamespaces {
			req.filter.nsAllowed = fam.namespaceBits(c.Namespaces)
		}
		return nil
	}
	ch, aerr := s.choose(ctx, all, req, authorize, endpointGateway)
	credentialsUnavailable.WithLabelValues(endpointGateway).Add(float64(len(ch.failed)))
	if c.Strict && c.Key != "" && (aerr == nil || aerr.retryAfter == 0) {
		if serr := all.family(c.IPv6).strictCheck(req, ch.it); serr != nil {
			return Chosen{}, serr
		}
	}
	if aerr != nil {
		if aerr.retryAfter > 0 {
			return Chosen{}, &SaturatedError{Site: aerr.site, RetryAfter: time.Duration(aerr.retryAfter) * time.Second, msg: aerr.Message}
		}
		return Chosen{}, fmt.Errorf("%w%s", ErrNoProxy, strings.TrimPrefix(aerr.Message, ErrNoProxy.Error()))
	}
	out := Chosen{Entry: ch.it.Entry}
	if u, err := url.Parse(ch.it.URL); err == nil {
		out.Address = u.Host
	}
	if ch.creds != nil {
		out.Username, out.Password = ch.creds.Username, ch.creds.Password
	}
	return out, nil
}

// strictCheck is the refusal of a strict choice: the proxy req.key maps to among the
// proxies req matches whatever their health, cooldowns and exclusions, when got is not
// it; nil when it is (or no proxy matches at all).
func (s *Snapshot) strictCheck(req *request, got *item) error {
	g := req.filter
	g.anyHealth, g.site, g.cands, g.candsSet, g.exclude = true, "", nil, false, nil
	home := s.pick(req.key, &g, nil)
	if home == nil || home == got {
		return nil
	}
	reason := "its credentials cannot be read"
	switch {
	case !home.Healthy:
		reason = "it is not healthy (down, cordoned, being deleted or reported unreachable)"
	case req.filter.exclude[home]:
		reason = "it failed earlier in this request"
	case req.filter.site != "" && home.coolingFor(req.filter.site, req.filter.now):
		reason = "it is cooling for site " + req.filter.site
	}
	return &StrictSessionError{Proxy: home.Namespace + "/" + home.Name, Reason: reason}
}

// hasPool reports whether a published proxy of any health, in namespace ns (any when
// empty) and one may allows, belongs to pool.
func (s *Snapshot) hasPool(pool, ns string, may func(string) bool) bool {
	for i := range s.items {
		it := &s.items[i]
		if it.Pool == pool && (ns == "" || it.Namespace == ns) && may(it.Namespace) {
			return true
		}
	}
	return false
}

// namespaceBits is the filter's nsAllowed for the namespaces names.
func (s *Snapshot) namespaceBits(names []string) []uint64 {
	bits := make([]uint64, (len(s.namespaces)+63)/64+1)
	for i, ns := range s.namespaces {
		if slices.Contains(names, ns) {
			bits[i>>6] |= 1 << (uint(i) & 63)
		}
	}
	return bits
}

// Scope is who a token belongs to and which namespaces it may list proxies in.
type Scope struct {
	Name          string
	AllNamespaces bool
	// Namespaces, when not AllNamespaces: those of the published proxies the token may
	// list proxies in (the permission pick needs).
	Namespaces []string
}

// ErrInvalidToken: the token is not one the discovery API accepts.
var ErrInvalidToken = errors.New("invalid token")

// AuthenticateToken checks token as a bearer token of the discovery API (the static
// token, or a Kubernetes token by TokenReview, cached as for the API) and works out the
// namespaces it may list proxies in (by SubjectAccessReview, cached per snapshot as for
// the API). Errors: ErrInvalidToken (wrapped, saying why); any other means the check
// could not be made now.
func (s *Server) AuthenticateToken(ctx context.Context, token string) (Scope, error) {
	if s.auth == nil && s.opts.Access == nil {
		return Scope{}, errors.New("this server has no authentication configured (a token file or Kubernetes authentication)")
	}
	if strings.TrimSpace(token) == "" {
		return Scope{}, fmt.Errorf("%w: empty", ErrInvalidToken)
	}
	c, aerr := s.authenticate(ctx, token)
	if aerr != nil {
		if aerr.status == http.StatusUnauthorized {
			return Scope{}, fmt.Errorf("%w: %s", ErrInvalidToken, strings.TrimPrefix(strings.TrimPrefix(aerr.Message, "invalid bearer token"), ": "))
		}
		return Scope{}, errors.New(aerr.Message)
	}
	return s.scopeOf(ctx, c)
}

func (s *Server) scopeOf(ctx context.Context, c *access.Caller) (Scope, error) {
	if c.AllNamespaces {
		return Scope{Name: c.User, AllNamespaces: true}, nil
	}
	snap, err := s.src.Snapshot(ctx)
	if err != nil {
		return Scope{}, fmt.Errorf("reading proxies: %w", err)
	}
	sc, err := s.scope(ctx, c, snap, false, readAttrs)
	if err != nil {
		return Scope{}, errors.New(unavailable(err).Message)
	}
	out := Scope{Name: c.User, Namespaces: []string{}}
	for i, ns := range snap.namespaces {
		if sc.allowed == nil || sc.allowed[i>>6]&(1<<(uint(i)&63)) != 0 {
			out.Namespaces = append(out.Namespaces, ns)
		}
	}
	return out, nil
}

// Report hands one report about proxy to the feedback sink, as POST /v1/feedback does
// with a report it took: domain is read by bans.Site (and not used for unreachable).
// It never blocks on the API server. An error says why the report was not taken: the
// server takes no feedback, is draining, or domain is no site.
func (s *Server) Report(proxy types.NamespacedName, domain string, outcome bans.Outcome, retryAfter time.Duration) error {
	br := bans.Report{Outcome: outcome, RetryAfter: retryAfter}
	if outcome != bans.Unreachable {
		site, err := siteOf(domain)
		if err != nil {
			return err
		}
		br.Site = site
	}
	if s.opts.Feedback == nil {
		return errors.New("this server takes no feedback")
	}
	s.fbMu.RLock()
	defer s.fbMu.RUnlock()
	if s.draining {
		return errors.New("this server is draining and takes no more feedback")
	}
	s.take(proxy, br)
	return nil
}

// PoolBansFrom is Options.PoolBans reading a pool's spec.bans through c (a cache); nil
// when the pool or its spec.bans does not exist.
func PoolBansFrom(c client.Reader) func(context.Context, types.NamespacedName) *v1alpha1.PoolBans {
	return func(ctx context.Context, key types.NamespacedName) *v1alpha1.PoolBans {
		pool := &v1alpha1.ProxyPool{}
		if err := c.Get(ctx, key, pool); err != nil {
			return nil
		}
		return pool.Spec.Bans
	}
}

// WatchTokenFile re-reads the static token file every Options.TokenReload until ctx
// ends, as Serve does; for a server whose API is not served (the gateway's).
func (s *Server) WatchTokenFile(ctx context.Context) {
	if s.auth != nil {
		s.auth.reloadLoop(ctx, s.opts.TokenReload, s.opts.Log)
	}
}
