package kube

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gateway"
)

type staticSource struct{ snap *discovery.Snapshot }

func (s staticSource) Snapshot(context.Context) (*discovery.Snapshot, error) { return s.snap, nil }

type sink struct {
	mu  sync.Mutex
	got []string
}

func (s *sink) Add(px types.NamespacedName, r bans.Report) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, fmt.Sprintf("%s %s %s %s", px, r.Site, r.Outcome, r.RetryAfter))
}

// newAdapter is an Adapter over a discovery server with the static token "good" and a
// fixed set of proxies: a/p0..p2 of pool news, b/q0.
func newAdapter(t *testing.T, rec discovery.FeedbackSink) *Adapter {
	t.Helper()
	var es []discovery.Entry
	for i := range 3 {
		es = append(es, discovery.Entry{Namespace: "a", Name: fmt.Sprintf("p%d", i), URL: fmt.Sprintf("http://127.0.0.%d:3128", 10+i),
			Healthy: true, Pool: "news", EgressIP: fmt.Sprintf("198.51.100.%d", i), Provider: "kvm2-home", Region: "home",
			Zone: fmt.Sprintf("rack%d", i), Labels: map[string]string{"n": fmt.Sprint(i)}})
	}
	es = append(es, discovery.Entry{Namespace: "b", Name: "q0", URL: "http://127.0.0.20:3128", Healthy: true})
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("good"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := discovery.New(staticSource{discovery.NewSnapshot(es)}, discovery.Options{TokenFile: tok, Feedback: rec})
	if err != nil {
		t.Fatal(err)
	}
	return &Adapter{Server: srv, Log: logr.Discard()}
}

// The adapter answers with discovery's choice and the gateway's error classes.
func TestAdapterChooses(t *testing.T) {
	a := newAdapter(t, nil)
	ctx := context.Background()
	id, err := a.Authenticate(ctx, "me", "good")
	if err != nil || !id.AllNamespaces {
		t.Fatalf("the static token: %+v, %v", id, err)
	}
	if _, err := a.Authenticate(ctx, "me", "bad"); !errors.Is(err, gateway.ErrBadCredentials) || !errors.Is(err, discovery.ErrInvalidToken) {
		t.Errorf("a bad token: %v, want ErrBadCredentials", err)
	}
	ex, err := a.Choose(ctx, gateway.ChoiceRequest{Identity: id, Pool: "news", Session: "s1"})
	if err != nil || ex.Namespace != "a" || !strings.HasPrefix(ex.Address, "127.0.0.1") || ex.EgressIP == "" {
		t.Fatalf("session s1 in pool news: %+v, %v", ex, err)
	}
	again, _ := a.Choose(ctx, gateway.ChoiceRequest{Identity: id, Pool: "news", Session: "s1"})
	if again != ex {
		t.Errorf("session s1 again: %+v, want %+v", again, ex)
	}
	// Placement and labels reach discovery's filter.
	for _, tc := range []struct {
		req  gateway.ChoiceRequest
		want string
	}{
		{gateway.ChoiceRequest{Identity: id, Zone: "rack1", Session: "s1"}, "a/p1"},
		{gateway.ChoiceRequest{Identity: id, Provider: "kvm2-home", Region: "home", Labels: "n=2", Session: "s1"}, "a/p2"},
		{gateway.ChoiceRequest{Identity: id, Labels: "n in (0)", Rotation: 1}, "a/p0"},
	} {
		if e, err := a.Choose(ctx, tc.req); err != nil || e.ID() != tc.want {
			t.Errorf("%+v: %s, %v; want %s", tc.req, e.ID(), err, tc.want)
		}
	}
	if _, err := a.Choose(ctx, gateway.ChoiceRequest{Identity: id, Region: "cloud"}); !errors.Is(err, gateway.ErrNoExit) {
		t.Errorf("region cloud: %v, want ErrNoExit", err)
	}
	seen := map[string]bool{}
	for n := range uint64(3) {
		e, err := a.Choose(ctx, gateway.ChoiceRequest{Identity: id, Pool: "news", Rotation: n})
		if err != nil {
			t.Fatal(err)
		}
		seen[e.EgressIP] = true
	}
	if len(seen) != 3 {
		t.Errorf("3 rotations left from %v, want 3 distinct addresses", seen)
	}
	if _, err := a.Choose(ctx, gateway.ChoiceRequest{Identity: id, Pool: "sports"}); !errors.Is(err, gateway.ErrUnknownPool) || !strings.Contains(err.Error(), `"sports"`) {
		t.Errorf("pool sports: %v, want ErrUnknownPool naming it", err)
	}
	onlyB := gateway.Identity{Name: "b's crawler", Namespaces: []string{"b"}}
	if _, err := a.Choose(ctx, gateway.ChoiceRequest{Identity: onlyB, Pool: "news"}); !errors.Is(err, gateway.ErrUnknownPool) {
		t.Errorf("pool news for a caller of namespace b: %v, want ErrUnknownPool", err)
	}
	if e, err := a.Choose(ctx, gateway.ChoiceRequest{Identity: onlyB, Session: "x"}); err != nil || e.ID() != "b/q0" {
		t.Errorf("a caller of namespace b: %s, %v; want b/q0", e.ID(), err)
	}
	if _, err := a.Choose(ctx, gateway.ChoiceRequest{Identity: onlyB, Exclude: []string{"b/q0"}}); !errors.Is(err, gateway.ErrNoExit) {
		t.Errorf("every exit excluded: %v, want ErrNoExit", err)
	}
	_, err = a.Choose(ctx, gateway.ChoiceRequest{Identity: id, Pool: "news", Session: "s1", Strict: true, Exclude: []string{ex.ID()}})
	var un *gateway.UnavailableError
	if !errors.As(err, &un) || un.Exit != ex.ID() || !errors.Is(err, gateway.ErrSessionExitUnavailable) {
		t.Errorf("strict session with its exit excluded: %v, want UnavailableError naming %s", err, ex.ID())
	}
}

// Failed exits and bans reach the feedback sink as POST /v1/feedback's reports do.
func TestAdapterReports(t *testing.T) {
	var sk sink
	a := newAdapter(t, &sk)
	ex := gateway.Exit{Namespace: "a", Name: "p1"}
	a.Unreachable(ex, errors.New("connection refused"))
	a.Banned(ex, "www.shop.example.com", http.StatusForbidden, 0)
	a.Banned(ex, "shop.example.com", http.StatusTooManyRequests, 30*time.Second)
	a.Banned(ex, "127.0.0.1", http.StatusForbidden, 0) // no site: not taken, logged
	want := "a/p1  unreachable 0s|a/p1 example.com banned 0s|a/p1 example.com throttled 30s"
	if got := strings.Join(sk.got, "|"); got != want {
		t.Errorf("the sink took %q, want %q", got, want)
	}
}
