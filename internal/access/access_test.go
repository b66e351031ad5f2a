package access

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeReviewer answers from its maps and counts its calls: tokens maps a token to its
// user; allow holds "user verb resource/subresource namespace" entries that are allowed.
// err, when set, is the answer to every call; gate, when set, holds every call until it
// is closed.
type fakeReviewer struct {
	mu          sync.Mutex
	tokens      map[string]string
	allow       map[string]bool
	err         error
	gate        chan struct{}
	tokenCalls  atomic.Int64
	accessCalls atomic.Int64
}

func (f *fakeReviewer) ReviewToken(_ context.Context, token string) (*authnv1.TokenReviewStatus, error) {
	f.tokenCalls.Add(1)
	f.wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	u, ok := f.tokens[token]
	if !ok {
		return &authnv1.TokenReviewStatus{Error: "token not found"}, nil
	}
	return &authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: u, UID: "uid-" + u,
		Groups: []string{"system:serviceaccounts", "system:authenticated"}}}, nil
}

func (f *fakeReviewer) ReviewAccess(_ context.Context, spec authzv1.SubjectAccessReviewSpec) (*authzv1.SubjectAccessReviewStatus, error) {
	f.accessCalls.Add(1)
	f.wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	ra := spec.ResourceAttributes
	return &authzv1.SubjectAccessReviewStatus{Allowed: f.allow[grant(spec.User, ra.Verb, ra.Resource+"/"+ra.Subresource, ra.Namespace)]}, nil
}

func (f *fakeReviewer) wait() {
	if f.gate != nil {
		<-f.gate
	}
}

func (f *fakeReviewer) set(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

func grant(user, verb, resource, ns string) string {
	return user + " " + verb + " " + resource + " " + ns
}

var listIn = func(ns string) Attributes {
	return Attributes{Verb: "list", Group: "egress.hrajfrisbee.cz", Resource: "proxies", Namespace: ns}
}

func newTest(t *testing.T, opts Options) (*Access, *fakeReviewer, *clocktesting.FakeClock) {
	t.Helper()
	f := &fakeReviewer{tokens: map[string]string{"tok-a": "alice"}, allow: map[string]bool{grant("alice", "list", "proxies/", "team-a"): true}}
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	opts.Clock = clk
	return New(f, opts), f, clk
}

func TestAuthenticateCaches(t *testing.T) {
	ctx := context.Background()
	a, f, clk := newTest(t, Options{})
	for i := 0; i < 100; i++ {
		c, err := a.Authenticate(ctx, NewToken("tok-a"))
		if err != nil || c.User != "alice" || c.UID != "uid-alice" || len(c.Groups) != 2 {
			t.Fatalf("Authenticate(tok-a) = %+v, %v", c, err)
		}
	}
	if n := f.tokenCalls.Load(); n != 1 {
		t.Errorf("100 look-ups of one token made %d TokenReviews, want 1", n)
	}
	clk.Step(DefaultAuthenticatedTTL - time.Second)
	_, _ = a.Authenticate(ctx, NewToken("tok-a"))
	if n := f.tokenCalls.Load(); n != 1 {
		t.Errorf("within the TTL: %d TokenReviews, want 1", n)
	}
	// The token is revoked: refused once the authenticated answer expires.
	f.set(func() { delete(f.tokens, "tok-a") })
	clk.Step(2 * time.Second)
	if _, err := a.Authenticate(ctx, NewToken("tok-a")); !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), "token not found") {
		t.Errorf("a revoked token after the TTL: %v, want ErrUnauthenticated with the review's error", err)
	}
	if n := f.tokenCalls.Load(); n != 2 {
		t.Errorf("after the TTL: %d TokenReviews, want 2", n)
	}
}

func TestAuthenticateUnknownTokenCachedBriefly(t *testing.T) {
	ctx := context.Background()
	a, f, clk := newTest(t, Options{})
	for i := 0; i < 10; i++ {
		if _, err := a.Authenticate(ctx, NewToken("tok-b")); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("unknown token: %v", err)
		}
	}
	if n := f.tokenCalls.Load(); n != 1 {
		t.Errorf("10 look-ups of an unknown token made %d TokenReviews, want 1", n)
	}
	// Created since: known after the unauthenticated TTL.
	f.set(func() { f.tokens["tok-b"] = "bob" })
	clk.Step(DefaultUnauthenticatedTTL + time.Millisecond)
	if c, err := a.Authenticate(ctx, NewToken("tok-b")); err != nil || c.User != "bob" {
		t.Errorf("a token created after the unauthenticated TTL: %+v, %v", c, err)
	}
	if _, err := a.Authenticate(ctx, NewToken(" ")); !errors.Is(err, ErrUnauthenticated) || f.tokenCalls.Load() != 2 {
		t.Errorf("an empty token: %v after %d reviews; want ErrUnauthenticated without a review", err, f.tokenCalls.Load())
	}
}

func TestErrorsAreNeverCachedNorAllow(t *testing.T) {
	ctx := context.Background()
	a, f, _ := newTest(t, Options{})
	f.set(func() { f.err = errors.New("connection refused") })
	for i := 0; i < 3; i++ {
		if c, err := a.Authenticate(ctx, NewToken("tok-a")); !errors.Is(err, ErrUnavailable) || c != nil || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("TokenReview failing: %+v, %v; want ErrUnavailable naming the failure", c, err)
		}
		d, err := a.Allowed(ctx, NewCaller("alice", "", nil, nil), listIn("team-a"))
		if !errors.Is(err, ErrUnavailable) || d.Allowed || !strings.Contains(err.Error(), `alice may list proxies in "team-a"`) {
			t.Fatalf("SubjectAccessReview failing: %+v, %v; want ErrUnavailable naming the check", d, err)
		}
	}
	if tc, ac := f.tokenCalls.Load(), f.accessCalls.Load(); tc != 3 || ac != 3 {
		t.Errorf("failures were cached: %d TokenReviews and %d SubjectAccessReviews for 3 look-ups each", tc, ac)
	}
	f.set(func() { f.err = nil })
	if c, err := a.Authenticate(ctx, NewToken("tok-a")); err != nil || c.User != "alice" {
		t.Errorf("after the API server recovers: %+v, %v", c, err)
	}
}

func TestAllowedCachesAllowAndDeny(t *testing.T) {
	ctx := context.Background()
	a, f, clk := newTest(t, Options{})
	alice := NewCaller("alice", "uid-alice", []string{"g"}, nil)
	for i := 0; i < 50; i++ {
		if d, err := a.Allowed(ctx, alice, listIn("team-a")); err != nil || !d.Allowed {
			t.Fatalf("alice list team-a: %+v, %v", d, err)
		}
		if d, err := a.Allowed(ctx, alice, listIn("team-b")); err != nil || d.Allowed {
			t.Fatalf("alice list team-b: %+v, %v", d, err)
		}
	}
	if n := f.accessCalls.Load(); n != 2 {
		t.Errorf("100 decisions on two attributes made %d reviews, want 2", n)
	}
	// Granted in team-b and revoked in team-a: the denial expires first.
	f.set(func() {
		f.allow[grant("alice", "list", "proxies/", "team-b")] = true
		delete(f.allow, grant("alice", "list", "proxies/", "team-a"))
	})
	clk.Step(DefaultDenyTTL + time.Millisecond)
	if d, _ := a.Allowed(ctx, alice, listIn("team-b")); !d.Allowed {
		t.Error("a grant is not in force after the deny TTL")
	}
	if d, _ := a.Allowed(ctx, alice, listIn("team-a")); !d.Allowed {
		t.Error("a revocation took effect before the allow TTL: the allow was not cached")
	}
	clk.Step(DefaultAllowTTL)
	if d, _ := a.Allowed(ctx, alice, listIn("team-a")); d.Allowed {
		t.Error("a revocation is not in force after the allow TTL")
	}
	// Another identity with the same user name is another cache entry.
	other := NewCaller("alice", "uid-alice", []string{"g", "h"}, nil)
	before := f.accessCalls.Load()
	_, _ = a.Allowed(ctx, other, listIn("team-b"))
	if f.accessCalls.Load() != before+1 {
		t.Error("a caller with other groups got alice's cached decision")
	}
	// A caller allowed everything is never reviewed.
	if d, err := a.Allowed(ctx, AllNamespacesCaller("static"), listIn("team-z")); err != nil || !d.Allowed || f.accessCalls.Load() != before+1 {
		t.Errorf("an all-namespaces caller: %+v, %v, reviews %d", d, err, f.accessCalls.Load()-before-1)
	}
}

func TestCachesAreBounded(t *testing.T) {
	ctx := context.Background()
	a, f, _ := newTest(t, Options{TokenCacheSize: 8, DecisionCacheSize: 8})
	alice := NewCaller("alice", "", nil, nil)
	for i := 0; i < 9; i++ {
		_, _ = a.Authenticate(ctx, NewToken(fmt.Sprint("tok-", i)))
		_, _ = a.Allowed(ctx, alice, listIn(fmt.Sprint("ns-", i)))
	}
	// The first of nine entries was evicted from caches of eight; the last is held.
	_, _ = a.Authenticate(ctx, NewToken("tok-8"))
	_, _ = a.Allowed(ctx, alice, listIn("ns-8"))
	if tc, ac := f.tokenCalls.Load(), f.accessCalls.Load(); tc != 9 || ac != 9 {
		t.Fatalf("the newest entries were not cached: %d TokenReviews, %d SubjectAccessReviews, want 9 each", tc, ac)
	}
	_, _ = a.Authenticate(ctx, NewToken("tok-0"))
	_, _ = a.Allowed(ctx, alice, listIn("ns-0"))
	if tc, ac := f.tokenCalls.Load(), f.accessCalls.Load(); tc != 10 || ac != 10 {
		t.Errorf("the caches hold more than 8 entries: %d TokenReviews, %d SubjectAccessReviews, want 10 each", tc, ac)
	}
}

func TestConcurrentMissesShareOneReview(t *testing.T) {
	ctx := context.Background()
	a, f, _ := newTest(t, Options{})
	f.gate = make(chan struct{})
	alice := NewCaller("alice", "", nil, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := 0; i < 32; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if c, err := a.Authenticate(ctx, NewToken("tok-a")); err != nil || c.User != "alice" {
				errs <- fmt.Errorf("authenticate: %+v, %v", c, err)
			}
		}()
		go func() {
			defer wg.Done()
			if d, err := a.Allowed(ctx, alice, listIn("team-a")); err != nil || !d.Allowed {
				errs <- fmt.Errorf("allowed: %+v, %v", d, err)
			}
		}()
	}
	// Let every goroutine reach its look-up before the reviews answer.
	for f.tokenCalls.Load() == 0 || f.accessCalls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	close(f.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if tc, ac := f.tokenCalls.Load(), f.accessCalls.Load(); tc != 1 || ac != 1 {
		t.Errorf("32 concurrent misses each made %d TokenReviews and %d SubjectAccessReviews, want 1 each", tc, ac)
	}
}

func TestNamespaces(t *testing.T) {
	ctx := context.Background()
	a, f, clk := newTest(t, Options{})
	f.allow[grant("alice", "get", "proxies/credentials", "team-c")] = true
	f.allow[grant("alice", "list", "proxies/", "team-c")] = true
	f.allow[grant("root", "list", "proxies/", "")] = true
	nss := []string{"team-a", "team-b", "team-c"}
	alice := NewCaller("alice", "", nil, nil)
	all, allowed, expires, err := a.Namespaces(ctx, alice, nss, listIn(""))
	if err != nil || all || fmt.Sprint(allowed) != "[true false true]" {
		t.Errorf("alice's list namespaces: all %v, %v, %v", all, allowed, err)
	}
	if want := clk.Now().Add(DefaultDenyTTL); !expires.Equal(want) {
		t.Errorf("expires %v, want the soonest decision's, %v", expires, want)
	}
	creds := Attributes{Verb: "get", Group: "egress.hrajfrisbee.cz", Resource: "proxies", Subresource: "credentials"}
	if _, allowed, _, _ = a.Namespaces(ctx, alice, nss, listIn(""), creds); fmt.Sprint(allowed) != "[false false true]" {
		t.Errorf("alice's list and credentials namespaces: %v", allowed)
	}
	before := f.accessCalls.Load()
	if all, allowed, _, err = a.Namespaces(ctx, NewCaller("root", "", nil, nil), nss, listIn("")); !all || allowed != nil || err != nil || f.accessCalls.Load() != before+1 {
		t.Errorf("a cluster-wide grant: all %v, %v, %v after %d reviews; want all after one", all, allowed, err, f.accessCalls.Load()-before)
	}
}
