package discovery

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/access"
)

// tokenAuth holds the static bearer token, kept in a file (a mounted Secret), that
// identify compares "Authorization: Bearer <token>" with. The file is read when the server is built, which fails if it is empty
// or unreadable, and re-read every reload interval, so a rotated Secret takes effect
// without a restart; a re-read that fails keeps the previous token and logs why. A file
// that does not exist yet (an optional Secret not created so far) is no error: until it
// appears a request with a token is refused with 503, never served openly, unless
// Kubernetes authentication is on (the token then goes to the TokenReview).
type tokenAuth struct {
	path   string
	digest atomic.Pointer[[sha256.Size]byte]
}

func newTokenAuth(path string) (*tokenAuth, error) {
	a := &tokenAuth{path: path}
	if err := a.load(); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return a, nil
}

// load reads the token file. Only the digest is kept: comparing digests of equal length
// in constant time leaks neither the token's bytes nor its length.
func (a *tokenAuth) load() error {
	b, err := os.ReadFile(a.path)
	if err != nil {
		return fmt.Errorf("reading discovery token file: %w", err)
	}
	tok := bytes.TrimSpace(b)
	if len(tok) == 0 {
		return fmt.Errorf("discovery token file %s is empty", a.path)
	}
	d := sha256.Sum256(tok)
	a.digest.Store(&d)
	return nil
}

// reloadLoop re-reads the token file every interval until ctx ends.
func (a *tokenAuth) reloadLoop(ctx context.Context, interval time.Duration, log logr.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			had := a.digest.Load() != nil
			err := a.load()
			switch {
			case err == nil && !had:
				log.Info("discovery token file present; serving callers that send it", "path", a.path)
			case err != nil && had:
				log.Error(err, "keeping the previous discovery token")
			}
		}
	}
}

const authRealm = `Bearer realm="egress-proxies-operator"`

// staticCaller is who holds the static token: one cluster-wide crawler, allowed every
// namespace and every permission.
var staticCaller = access.AllNamespacesCaller("the discovery token")

// callerHandler serves a request from the caller it was authenticated as; nil when the
// server has no authentication configured.
type callerHandler func(w http.ResponseWriter, r *http.Request, c *access.Caller)

// identify authenticates the request's bearer token and hands h its caller: the static
// token (--discovery-token-file) is the cluster-wide crawler; any other token, with
// Kubernetes authentication on, is whoever a TokenReview says it is. With neither
// configured, h gets a nil caller, unless authRequired (feedback): then the request is
// refused with how to configure authentication.
func (s *Server) identify(h callerHandler, authRequired bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.auth == nil && s.opts.Access == nil {
			if authRequired {
				w.Header().Set("WWW-Authenticate", authRealm)
				writeError(w, errNoAuthConfigured)
				return
			}
			h(w, r, nil)
			return
		}
		raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || strings.TrimSpace(raw) == "" {
			w.Header().Set("WWW-Authenticate", authRealm)
			writeError(w, &apiError{status: http.StatusUnauthorized, Message: "missing bearer token"})
			return
		}
		c, aerr := s.authenticate(r.Context(), raw)
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		h(w, r, c)
	})
}

// authenticate is who the bearer token raw belongs to, on a server with authentication
// configured: the static token (--discovery-token-file) is the cluster-wide crawler; any
// other token, with Kubernetes authentication on, is whoever a TokenReview says it is.
// Otherwise the refusal: 401 with its challenge, or 503.
func (s *Server) authenticate(ctx context.Context, raw string) (*access.Caller, *apiError) {
	tok := access.NewToken(raw)
	if s.auth != nil {
		want := s.auth.digest.Load()
		if tok.Matches(want) {
			return staticCaller, nil
		}
		if want == nil && s.opts.Access == nil {
			return nil, &apiError{status: http.StatusServiceUnavailable,
				Message: fmt.Sprintf("no discovery token is configured yet: %s does not exist (create the Secret it is mounted from)", s.auth.path)}
		}
	}
	if s.opts.Access == nil {
		return nil, &apiError{status: http.StatusUnauthorized, Message: "invalid bearer token", challenge: authRealm + `, error="invalid_token"`}
	}
	c, err := s.opts.Access.Authenticate(ctx, tok)
	if err != nil {
		return nil, authFailure(err)
	}
	return c, nil
}

// errNoAuthConfigured refuses feedback on a server without authentication: a report
// can retire a proxy, so it is never taken from anyone who can reach the port.
var errNoAuthConfigured = &apiError{status: http.StatusUnauthorized,
	Message: "feedback is taken only from authenticated callers, and this server has no authentication configured: " +
		"start the manager with --discovery-kubernetes-auth (callers send a Kubernetes ServiceAccount token) or --discovery-token-file"}
