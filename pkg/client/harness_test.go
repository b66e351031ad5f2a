package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/pkg/client"
)

const (
	testToken = "t0ken-for-crawlers"
	proxyUser = "crawler"
	proxyPass = "Pw-1.x"
)

// fleet is the discovery server as the manager runs it, over Proxies held in memory
// instead of an informer cache: every accepted report goes through bans.CooldownsAfter into the
// Proxy's status.cooldowns at once, and the next request sees the new snapshot.
type fleet struct {
	mu      sync.Mutex
	proxies []*v1alpha1.Proxy
	snap    atomic.Pointer[discovery.Snapshot]
	// feedbackPosts counts POST /v1/feedback requests the server received.
	feedbackPosts atomic.Int64
	// picks are the queries of the GET /v1/proxies/pick requests the server received,
	// and reports the reports of every POST /v1/feedback, in order (under mu).
	picks   []url.Values
	reports []map[string]any

	srv *discovery.Server
	url string
	fps map[string]*healthtest.ForwardProxy // by namespace/name
}

func (f *fleet) Snapshot(context.Context) (*discovery.Snapshot, error) { return f.snap.Load(), nil }

func (f *fleet) rebuild() {
	var entries []discovery.Entry
	for _, px := range f.proxies {
		if e, ok := discovery.EntryFor(px); ok {
			entries = append(entries, e)
		}
	}
	f.snap.Store(discovery.NewSnapshot(entries))
}

// Add is the feedback sink: an unreachable report marks the proxy's status.unreachable,
// as the manager's recorder does, which leaves it out of every answer (no probe answers
// it here); the others go into status.cooldowns.
func (f *fleet) Add(key types.NamespacedName, r bans.Report) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, px := range f.proxies {
		if px.Namespace == key.Namespace && px.Name == key.Name {
			if r.Outcome == bans.Unreachable {
				px.Status.Unreachable, _ = bans.UnreachableAfter(&px.Status, time.Now(), 1, bans.DefaultUnreachableHoldoff)
				continue
			}
			if cds, changed := bans.CooldownsAfter(px.Status.Cooldowns, r, time.Now(), bans.DefaultPolicy); changed {
				px.Status.Cooldowns = cds
			}
		}
	}
	f.rebuild()
}

// cooldowns is a copy of the named proxy's status.cooldowns.
func (f *fleet) cooldowns(name string) []v1alpha1.ProxyCooldown {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, px := range f.proxies {
		if px.Name == name {
			return append([]v1alpha1.ProxyCooldown(nil), px.Status.Cooldowns...)
		}
	}
	return nil
}

// setCooldown makes the named proxy cool for site until until.
func (f *fleet) setCooldown(name, site string, until time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, px := range f.proxies {
		if px.Name == name {
			px.Status.Cooldowns = append(px.Status.Cooldowns, v1alpha1.ProxyCooldown{Site: site,
				Until: metav1.NewTime(until), Bans: 1, LastOutcome: v1alpha1.CooldownOutcome(bans.Banned)})
		}
	}
	f.rebuild()
}

// received is a copy of the pick queries and the feedback reports the server received.
func (f *fleet) received() ([]url.Values, []map[string]any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]url.Values(nil), f.picks...), append([]map[string]any(nil), f.reports...)
}

// otherSites are sites that ban nobody, under distinct registrable domains.
var otherSites = []string{"news.example.org", "news.example.net", "news.example.info", "news.example.io",
	"news.example.dev", "news.example.app", "news.example.eu", "news.example.de", "news.example.fr", "news.example.nl"}

// siteStickingTo is the first of otherSites whose pick is the proxy named ref.
func siteStickingTo(t *testing.T, c *client.Client, ref string) string {
	t.Helper()
	for _, h := range otherSites {
		p, err := c.Pick(context.Background(), client.Query{Domain: h})
		if err != nil {
			t.Fatal(err)
		}
		if p.Ref() == ref {
			return h
		}
	}
	t.Fatalf("none of %v sticks to %s", otherSites, ref)
	return ""
}

// newFleet starts three forward proxies (egress 127.0.0.2, .3 and .4, demanding basic
// auth, resolving every site name to 127.0.0.1) published as the Ready External Proxies
// crawl/p2, crawl/p3 and crawl/p4, and the discovery API over them behind testToken.
func newFleet(t *testing.T, opts discovery.Options) *fleet {
	t.Helper()
	f := &fleet{fps: map[string]*healthtest.ForwardProxy{}}
	for i := 2; i <= 4; i++ {
		ip := "127.0.0." + strconv.Itoa(i)
		fp := healthtest.New(t, ip)
		fp.RequireAuth(&healthtest.Auth{Username: proxyUser, Password: proxyPass})
		for _, h := range append([]string{"shop.example.com", "www.shop.example.com"}, otherSites...) {
			fp.Resolve(h, "127.0.0.1")
		}
		name := "p" + strconv.Itoa(i)
		f.fps["crawl/"+name] = fp
		f.proxies = append(f.proxies, &v1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "crawl", Name: name, Labels: map[string]string{"tier": map[bool]string{true: "gold", false: "silver"}[i < 4]}},
			Spec: v1alpha1.ProxySpec{Mode: v1alpha1.ProxyModeExternal, Address: fp.Host, Port: fp.Port,
				Proxy: &v1alpha1.ProxyConfig{BasicAuth: &v1alpha1.ProxyBasicAuth{SecretRef: v1alpha1.BasicAuthSecretRef{Name: "auth"}}}},
			Status: v1alpha1.ProxyStatus{IP: fp.Host, Phase: v1alpha1.PhaseReady, Healthy: true, EgressIP: ip},
		})
	}
	f.rebuild()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts.TokenFile = tokenFile
	opts.Feedback = f
	opts.Credentials = func(context.Context, *v1alpha1.Proxy) (*proxyconfig.Credentials, error) {
		return &proxyconfig.Credentials{Username: proxyUser, Password: proxyPass}, nil
	}
	srv, err := discovery.New(f, opts)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	h := srv.Handler()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/feedback":
			f.feedbackPosts.Add(1)
			b, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(b))
			var body struct {
				Reports []map[string]any `json:"reports"`
			}
			_ = json.Unmarshal(b, &body)
			f.mu.Lock()
			f.reports = append(f.reports, body.Reports...)
			f.mu.Unlock()
		case "/v1/proxies/pick":
			f.mu.Lock()
			f.picks = append(f.picks, r.URL.Query())
			f.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	f.url = ts.URL
	return f
}

// site is a web site on loopback serving /page/N under any host name. It answers 403 to
// requests for banHost that come from one of the banned source addresses, 429 with
// Retry-After: 7 on /throttle and 404 on /404.
type site struct {
	srv     *httptest.Server
	port    string
	mu      sync.Mutex
	banHost string
	banned  map[string]bool
	// seen counts requests by source address and host.
	seen map[string]int
}

func newSite(t *testing.T, banHost string, bannedSources ...string) *site {
	t.Helper()
	s := &site{banHost: banHost, banned: map[string]bool{}, seen: map[string]int{}}
	for _, b := range bannedSources {
		s.banned[b] = true
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	_, s.port, _ = net.SplitHostPort(s.srv.Listener.Addr().String())
	return s
}

func (s *site) serve(w http.ResponseWriter, r *http.Request) {
	src, _, _ := net.SplitHostPort(r.RemoteAddr)
	host, _, _ := net.SplitHostPort(r.Host)
	s.mu.Lock()
	s.seen[src+" "+host]++
	banned := s.banned[src] && strings.HasSuffix(host, s.banHost)
	s.mu.Unlock()
	switch {
	case banned:
		http.Error(w, "forbidden", http.StatusForbidden)
	case r.URL.Path == "/404":
		http.NotFound(w, r)
	case r.URL.Path == "/throttle":
		w.Header().Set("Retry-After", "7")
		http.Error(w, "slow down", http.StatusTooManyRequests)
	default:
		fmt.Fprintf(w, "%s %s", host, r.URL.Path)
	}
}

// url is the address of path on host, served by this site.
func (s *site) url(host, path string) string {
	return "http://" + net.JoinHostPort(host, s.port) + path
}

func (s *site) count(src, host string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[src+" "+host]
}
