// Package access authenticates callers by their Kubernetes bearer tokens (TokenReview)
// and authorizes what they ask by Kubernetes RBAC (SubjectAccessReview), with bounded
// caches of both answers, so that a request in steady state never waits on the API
// server. It knows nothing of what it guards: the discovery API and a data plane use it
// alike.
package access

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Error classes of Authenticate and Allowed, checked with errors.Is.
var (
	// ErrUnauthenticated: the API server does not know the token (unknown, expired,
	// revoked, or meant for another audience). Answer 401.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrUnavailable: the review could not be made (the API server unreachable, the
	// manager not allowed to create reviews). Never cached, never allows. Answer 503.
	ErrUnavailable = errors.New("access review unavailable")
)

// Caller is who sent a request, as the API server authenticated it.
type Caller struct {
	User   string
	UID    string
	Groups []string
	Extra  map[string][]string
	// AllNamespaces marks a caller allowed everything without asking the API server
	// (a static token of one cluster-wide client).
	AllNamespaces bool

	// key identifies the caller in the decision caches: every field that a
	// SubjectAccessReview sends, unambiguously encoded.
	key string
}

// NewCaller is a Caller with its cache key worked out.
func NewCaller(user, uid string, groups []string, extra map[string][]string) *Caller {
	c := &Caller{User: user, UID: uid, Groups: groups, Extra: extra}
	var b strings.Builder
	field := func(s string) { b.WriteString(strconv.Itoa(len(s))); b.WriteByte(':'); b.WriteString(s) }
	field(user)
	field(uid)
	gs := append([]string(nil), groups...)
	sort.Strings(gs)
	b.WriteString("g" + strconv.Itoa(len(gs)))
	for _, g := range gs {
		field(g)
	}
	ks := make([]string, 0, len(extra))
	for k := range extra {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	b.WriteString("x" + strconv.Itoa(len(ks)))
	for _, k := range ks {
		field(k)
		vs := append([]string(nil), extra[k]...)
		sort.Strings(vs)
		b.WriteString("v" + strconv.Itoa(len(vs)))
		for _, v := range vs {
			field(v)
		}
	}
	c.key = b.String()
	return c
}

// AllNamespacesCaller is a caller allowed everything, named user in messages.
func AllNamespacesCaller(user string) *Caller {
	return &Caller{User: user, AllNamespaces: true, key: "*" + user}
}

// Key identifies the caller for caches of decisions derived from its permissions: two
// callers with the same key get the same answers.
func (c *Caller) Key() string { return c.key }

// String is the caller's user name, as Kubernetes names it in a refusal.
func (c *Caller) String() string { return c.User }

// Token is a bearer token with its SHA-256 digest, worked out once per request: caches
// are keyed by the digest, never by the token.
type Token struct {
	raw    string
	digest [sha256.Size]byte
}

// NewToken is raw, surrounding whitespace removed, with its digest.
func NewToken(raw string) Token {
	raw = strings.TrimSpace(raw)
	return Token{raw: raw, digest: sha256.Sum256([]byte(raw))}
}

// Matches compares the token's digest with want in constant time (digests of equal
// length leak neither the token's bytes nor its length).
func (t Token) Matches(want *[sha256.Size]byte) bool {
	return want != nil && subtle.ConstantTimeCompare(t.digest[:], want[:]) == 1
}

// Attributes are what a caller asks to do: a verb on a resource (and subresource) of an
// API group, in a namespace ("" for every namespace).
type Attributes struct {
	Verb, Group, Resource, Subresource, Namespace string
}

// resource is group-qualified resource/subresource, as RBAC and refusals name it.
func (a Attributes) resource() string {
	r := a.Resource
	if a.Subresource != "" {
		r += "/" + a.Subresource
	}
	return r
}

// Forbidden is the refusal of a, in Kubernetes' wording, for c.
func (a Attributes) Forbidden(c *Caller) string {
	where := fmt.Sprintf("in the namespace %q", a.Namespace)
	if a.Namespace == "" {
		where = "at the cluster scope"
	}
	return fmt.Sprintf("User %q cannot %s resource %q in API group %q %s", c.User, a.Verb, a.resource(), a.Group, where)
}
