package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/access"
)

// fakeReviewer knows tokens (token → user) and grants ("user verb resource namespace",
// resource with its subresource after a slash), and counts its reviews; err, when set,
// fails every review.
type fakeReviewer struct {
	mu      sync.Mutex
	tokens  map[string]string
	grants  map[string]bool
	err     error
	reviews atomic.Int64
}

func (f *fakeReviewer) ReviewToken(_ context.Context, token string) (*authnv1.TokenReviewStatus, error) {
	f.reviews.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	u, ok := f.tokens[token]
	return &authnv1.TokenReviewStatus{Authenticated: ok, User: authnv1.UserInfo{Username: u}}, nil
}

func (f *fakeReviewer) ReviewAccess(_ context.Context, spec authzv1.SubjectAccessReviewSpec) (*authzv1.SubjectAccessReviewStatus, error) {
	f.reviews.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	ra := spec.ResourceAttributes
	res := ra.Resource
	if ra.Subresource != "" {
		res += "/" + ra.Subresource
	}
	return &authzv1.SubjectAccessReviewStatus{Allowed: f.grants[spec.User+" "+ra.Verb+" "+res+" "+ra.Namespace]}, nil
}

const crawlSA = "system:serviceaccount:crawl:crawler"

// crawlReviewer knows one crawler of namespace crawl with the crawler role bound there.
func crawlReviewer() *fakeReviewer {
	return &fakeReviewer{tokens: map[string]string{"tok-crawl": crawlSA},
		grants: map[string]bool{crawlSA + " list proxies crawl": true, crawlSA + " create proxies/feedback crawl": true}}
}

// Feedback is never taken without authentication: a server with neither a token nor
// Kubernetes authentication refuses it with 401 and says how to configure it.
func TestFeedbackRefusedWithoutAuthentication(t *testing.T) {
	sk := &sink{}
	s, err := New(fixture(), Options{Feedback: sk})
	if err != nil {
		t.Fatal(err)
	}
	res, body := post(t, s.Handler(), "/v1/feedback", `{"reports":[{"proxy":"crawl/a","domain":"example.com","outcome":"banned"}]}`, "Authorization", "")
	if res.StatusCode != http.StatusUnauthorized || !strings.Contains(body, "--discovery-kubernetes-auth") || res.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("feedback without authentication: %d %s (WWW-Authenticate %q); want 401 saying how to configure it", res.StatusCode, body, res.Header.Get("WWW-Authenticate"))
	}
	if len(sk.got) != 0 {
		t.Errorf("the sink took %v", sk.got)
	}
	// Listings stay open without authentication.
	if res, body := get(t, s.Handler(), "/v1/proxies"); res.StatusCode != 200 {
		t.Errorf("an open listing: %d %s", res.StatusCode, body)
	}
}

func TestKubernetesCallers(t *testing.T) {
	f := crawlReviewer()
	sk := &sink{}
	clk := clocktesting.NewFakeClock(time.Now())
	h := newTestServer(t, fixture(), Options{Access: access.New(f, access.Options{Clock: clk}), Feedback: sk, Clock: clk}).Handler()
	auth := []string{"Authorization", "Bearer tok-crawl"}

	res, body := get(t, h, "/v1/proxies", auth...)
	if res.StatusCode != 200 || names(decodeList(t, body)) != "crawl/a,crawl/b" {
		t.Errorf("list without namespace: %d %s; want crawl's healthy proxies alone", res.StatusCode, body)
	}
	res, body = get(t, h, "/v1/proxies?healthy=any&format=text", auth...)
	if res.StatusCode != 200 || strings.Count(body, "\n") != 3 {
		t.Errorf("every health without namespace: %d %q; want crawl's three", res.StatusCode, body)
	}
	for i := 0; i < 50; i++ {
		res, body = get(t, h, fmt.Sprintf("/v1/proxies/pick?key=k%d", i), auth...)
		var e Entry
		_ = json.Unmarshal([]byte(body), &e)
		if res.StatusCode != 200 || e.Namespace != "crawl" {
			t.Fatalf("pick key k%d: %d %s; want a proxy of crawl", i, res.StatusCode, body)
		}
	}
	for _, target := range []string{"/v1/proxies?namespace=other", "/v1/proxies/pick?key=k&namespace=other"} {
		res, body = get(t, h, target, auth...)
		want := `User \"system:serviceaccount:crawl:crawler\" cannot list resource \"proxies\" in API group \"egress.hrajfrisbee.cz\" in the namespace \"other\"`
		if res.StatusCode != http.StatusForbidden || !strings.Contains(body, want) || !strings.Contains(body, "--clusterrole=egress-proxies-operator-crawler --serviceaccount=crawl:crawler") {
			t.Errorf("%s: %d %s; want 403 naming verb, resource and namespace, and the role to bind", target, res.StatusCode, body)
		}
	}
	res, body = get(t, h, "/v1/proxies/pick?key=k&namespace=crawl&credentials=true", auth...)
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, `cannot get resource \"proxies/credentials\"`) || !strings.Contains(body, "egress-proxies-operator-credentials") {
		t.Errorf("credentials without the credentials role: %d %s", res.StatusCode, body)
	}
	// Without namespace, credentials are answered from the namespaces where both are granted: none.
	res, body = get(t, h, "/v1/proxies?credentials=true", auth...)
	if l := decodeList(t, body); res.StatusCode != 200 || l.Count != 0 {
		t.Errorf("credentials without namespace and without the credentials role: %d %s", res.StatusCode, body)
	}
	f.mu.Lock()
	f.grants[crawlSA+" get proxies/credentials crawl"] = true
	f.mu.Unlock()
	clk.Step(access.DefaultDenyTTL + time.Second) // the cached denial expires
	res, body = get(t, h, "/v1/proxies?credentials=true&namespace=crawl", auth...)
	if res.StatusCode != 200 || names(decodeList(t, body)) != "crawl/a,crawl/b" {
		t.Errorf("credentials with the credentials role: %d %s", res.StatusCode, body)
	}

	// Feedback: the report on the other namespace's proxy is rejected alone.
	res, body = post(t, h, "/v1/feedback", `{"reports":[{"proxy":"crawl/a","domain":"example.com","outcome":"banned"},{"proxy":"other/d","domain":"example.com","outcome":"banned"}]}`, auth...)
	var ans feedbackAnswer
	_ = json.Unmarshal([]byte(body), &ans)
	if res.StatusCode != 200 || ans.Accepted != 1 || len(ans.Rejected) != 1 || ans.Rejected[0].Index != 1 ||
		!strings.Contains(ans.Rejected[0].Error, `cannot create resource "proxies/feedback" in API group "egress.hrajfrisbee.cz" in the namespace "other"`) {
		t.Errorf("feedback on both namespaces: %d %s", res.StatusCode, body)
	}
	if len(sk.got) != 1 || !strings.HasPrefix(sk.got[0], "crawl/a ") {
		t.Errorf("the sink took %v; want crawl/a's report alone", sk.got)
	}

	// Unknown and missing tokens.
	for _, hdr := range []string{"Bearer tok-unknown", ""} {
		res, body = get(t, h, "/v1/proxies", "Authorization", hdr)
		if res.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Bearer realm=") {
			t.Errorf("token %q: %d %s (WWW-Authenticate %q); want 401", hdr, res.StatusCode, body, res.Header.Get("WWW-Authenticate"))
		}
	}
	// The API server unreachable: 503 naming the failure, nothing recorded.
	f.mu.Lock()
	f.err = errors.New("connection refused")
	f.mu.Unlock()
	n := len(sk.got)
	res, body = post(t, h, "/v1/feedback", `{"reports":[{"proxy":"crawl/a","domain":"example.org","outcome":"banned"}]}`, "Authorization", "Bearer tok-new")
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "connection refused") || len(sk.got) != n {
		t.Errorf("reviews failing: %d %s, %d reports taken; want 503 naming the failure and none", res.StatusCode, body, len(sk.got)-n)
	}
}

// The static token stays the one cluster-wide crawler beside Kubernetes callers.
func TestStaticTokenBesideKubernetesAuth(t *testing.T) {
	f := crawlReviewer()
	h := tokenServerOpts(t, fixture(), Options{Access: access.New(f, access.Options{}), Credentials: nil})
	res, body := get(t, h, "/v1/proxies", "Authorization", "Bearer "+testToken)
	if res.StatusCode != 200 || decodeList(t, body).Count != 4 {
		t.Errorf("the static token: %d %s; want every namespace", res.StatusCode, body)
	}
	if res, body = get(t, h, "/v1/proxies?namespace=other", "Authorization", "Bearer tok-crawl"); res.StatusCode != http.StatusForbidden {
		t.Errorf("a Kubernetes caller beside the static token: %d %s", res.StatusCode, body)
	}
	if n := f.reviews.Load(); n != 2 {
		t.Errorf("%d reviews; want 2 (the crawler's TokenReview and SubjectAccessReview), none for the static token", n)
	}
}

// A steady stream of picks by one caller costs the API server a handful of reviews.
func TestReviewsPer10000Picks(t *testing.T) {
	f := crawlReviewer()
	h := newTestServer(t, fixture(), Options{Access: access.New(f, access.Options{})}).Handler()
	for _, target := range []string{"/v1/proxies/pick?key=k", "/v1/proxies/pick?key=k&namespace=crawl"} {
		before := f.reviews.Load()
		for i := 0; i < 10000; i++ {
			if res, body := get(t, h, target, "Authorization", "Bearer tok-crawl"); res.StatusCode != 200 {
				t.Fatalf("%s: %d %s", target, res.StatusCode, body)
			}
		}
		n := f.reviews.Load() - before
		t.Logf("%s: %d TokenReviews and SubjectAccessReviews per 10,000 picks", target, n)
		if n > 4 {
			t.Errorf("%s: %d reviews per 10,000 picks; want at most 4", target, n)
		}
	}
}
