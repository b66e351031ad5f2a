package client_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gateway"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gateway/kube"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/pkg/client"
)

// gatewayFleet is the gateway as cmd/gateway runs it (internal/gateway over discovery's
// own choice, token check and ban recorder, through gateway/kube's Adapter), in front of
// the fleet's three forward proxies crawl/p2, p3 and p4 (egress 127.0.0.2 to .4); a site
// over HTTP and HTTPS that bans 127.0.0.3 for shop.example.com; and the discovery API the
// client reports to.
type gatewayFleet struct {
	*fleet
	gateway string // http://127.0.0.1:port
	site    *site
	tlsURL  func(host, path string) string
	roots   *tls.Config
	reg     *prometheus.Registry
}

// tunnels is how many CONNECTs the gateway answered 200.
func (gf *gatewayFleet) tunnels(t *testing.T) int {
	t.Helper()
	mfs, err := gf.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "proxy_operator_gateway_tunnels_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "outcome" && (l.GetValue() == "ok" || l.GetValue() == "retried") {
						n += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	return int(n)
}

func newGatewayFleet(t *testing.T) *gatewayFleet {
	t.Helper()
	f := newFleet(t, discovery.Options{})
	ad := &kube.Adapter{Server: f.srv, Log: logr.Discard()}
	reg := prometheus.NewRegistry()
	g, err := gateway.New(gateway.Config{Chooser: ad, Authenticator: ad, Reporter: ad, Log: logr.Discard(), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // open keep-alive tunnels would hold a graceful shutdown
		g.Shutdown(ctx)
	})
	for _, fp := range f.fps {
		fp.Resolve("news.example.com", "127.0.0.1") // a site that bans nobody, in the certificate's *.example.com
	}
	s := newSite(t, "shop.example.com", "127.0.0.3")
	ts := httptest.NewUnstartedServer(http.HandlerFunc(s.serve)) // its certificate covers *.example.com
	ts.Config.ErrorLog = log.New(io.Discard, "", 0)              // tunnels closed mid-handshake are no news
	ts.StartTLS()
	t.Cleanup(ts.Close)
	_, tlsPort, _ := net.SplitHostPort(ts.Listener.Addr().String())
	return &gatewayFleet{fleet: f, gateway: "http://" + ln.Addr().String(), site: s, reg: reg,
		tlsURL: func(host, path string) string { return "https://" + net.JoinHostPort(host, tlsPort) + path },
		roots:  ts.Client().Transport.(*http.Transport).TLSClientConfig}
}

// transport is a GatewayTransport of a client of the fleet's discovery API.
func (gf *gatewayFleet) transport(t *testing.T, cfg client.GatewayConfig) *client.GatewayTransport {
	t.Helper()
	c, err := client.New(client.Config{URL: gf.url, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	cfg.URL = gf.gateway
	if cfg.Base == nil {
		cfg.Base = http.DefaultTransport.(*http.Transport).Clone()
		cfg.Base.TLSClientConfig = gf.roots.Clone()
	}
	if cfg.FlushInterval == 0 {
		cfg.FlushInterval = 20 * time.Millisecond
	}
	cfg.OnFeedbackError = func(err error) { t.Errorf("feedback: %v", err) }
	gt, err := c.GatewayTransport(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gt.Close() })
	return gt
}

var egressOf = map[string]string{"crawl/p2": "127.0.0.2", "crawl/p3": "127.0.0.3", "crawl/p4": "127.0.0.4"}

// get fetches u with the session and returns the status, the exit named and its address.
func get(t *testing.T, hc *http.Client, u, session string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(client.WithSession(context.Background(), session), http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s (session %s): %v", u, session, err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, res.Header.Get(client.HeaderEgressProxy), res.Header.Get(client.HeaderEgressIP)
}

// reportsFor are the reports the API received for proxy, as "outcome domain".
func reportsFor(gf *gatewayFleet, proxy string) []string {
	_, reports := gf.received()
	var out []string
	for _, r := range reports {
		if r["proxy"] == proxy {
			out = append(out, fmt.Sprintf("%v %v", r["outcome"], r["domain"]))
		}
	}
	return out
}

// The exit a report names is the one whose address the site saw: through the HTTPS
// tunnel (X-Egress-Proxy of the gateway's CONNECT answer, read by
// OnProxyConnectResponse) and for plain HTTP (the response's own header). The ban closes
// the tunnel, so the same soft session, once discovery holds the cooldown, leaves
// through another exit.
func TestGatewayTransportReportsTheExitTheSiteSaw(t *testing.T) {
	for _, scheme := range []string{"https", "http"} {
		t.Run(scheme, func(t *testing.T) {
			gf := newGatewayFleet(t)
			gt := gf.transport(t, client.GatewayConfig{Options: client.GatewayOptions{User: "crawler-1", Namespace: "crawl"}})
			hc := &http.Client{Transport: gt, Timeout: 30 * time.Second}
			u := gf.site.url("shop.example.com", "/page/1")
			if scheme == "https" {
				u = gf.tlsURL("shop.example.com", "/page/1")
			}
			bannedSession := ""
			seen := map[string]bool{}
			for i := 0; i < 30 && bannedSession == ""; i++ {
				session := fmt.Sprintf("s%d", i)
				status, exit, ip := get(t, hc, u, session)
				seen[exit] = true
				if want, ok := egressOf[exit]; !ok || ip != want {
					t.Fatalf("session %s: X-Egress-Proxy %q, X-Egress-IP %q: want one of %v with its address", session, exit, ip, egressOf)
				}
				switch {
				case status == http.StatusForbidden && exit == "crawl/p3":
					bannedSession = session
				case status == http.StatusForbidden:
					t.Fatalf("session %s: 403 through %s, which the site does not ban", session, exit)
				case status != http.StatusOK:
					t.Fatalf("session %s: status %d through %s", session, status, exit)
				case exit == "crawl/p3":
					t.Fatalf("session %s: 200 through crawl/p3, which the site bans", session)
				}
			}
			if bannedSession == "" {
				t.Fatalf("no session of 30 went through crawl/p3 (exits seen: %v)", seen)
			}
			if n := gf.site.count("127.0.0.3", "shop.example.com"); n == 0 {
				t.Fatal("the site never saw 127.0.0.3, the address the 403 was attributed to")
			}
			// Waited for: the report reaching the API and its cooldown in p3's status.
			deadline := time.Now().Add(20 * time.Second)
			for len(gf.cooldowns("p3")) == 0 || !contains(reportsFor(gf, "crawl/p3"), "banned shop.example.com") {
				if time.Now().After(deadline) {
					t.Fatalf("no banned report for crawl/p3 within 20 s; its reports %v, cooldowns %v", reportsFor(gf, "crawl/p3"), gf.cooldowns("p3"))
				}
				time.Sleep(10 * time.Millisecond)
			}
			for _, other := range []string{"crawl/p2", "crawl/p4"} {
				for _, r := range reportsFor(gf, other) {
					if r != "ok shop.example.com" {
						t.Errorf("%s reported %q; only crawl/p3 was banned", other, r)
					}
				}
			}
			if cd := gf.cooldowns("p3"); cd[0].Site != "example.com" {
				t.Errorf("p3's cooldowns %+v, want the site example.com", cd)
			}
			status, exit, _ := get(t, hc, u, bannedSession)
			if status != http.StatusOK || exit == "crawl/p3" {
				t.Errorf("session %s after its ban was recorded: %d through %s, want 200 through another exit", bannedSession, status, exit)
			}
			// Reports are sent in batches: Close sends what is left and waits for it. (In
			// plain HTTP the cooldown waited for above may be the gateway's own report.)
			gt.Close()
			if st := gt.Stats(); st.Banned < 1 || st.OK < 1 || st.Reported < st.Banned+st.OK-1 || st.Rejected != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A 429 with Retry-After through a tunnel is reported throttled with its wait, by the
// exit's name.
func TestGatewayTransportReportsThrottles(t *testing.T) {
	gf := newGatewayFleet(t)
	gt := gf.transport(t, client.GatewayConfig{Options: client.GatewayOptions{Namespace: "crawl", Session: "t1"}})
	hc := &http.Client{Transport: gt, Timeout: 30 * time.Second}
	status, exit, _ := get(t, hc, gf.tlsURL("news.example.com", "/throttle"), "t1")
	if status != http.StatusTooManyRequests || exit == "" {
		t.Fatalf("GET /throttle: %d through %q", status, exit)
	}
	gt.Close()
	_, reports := gf.received()
	if len(reports) != 1 || reports[0]["proxy"] != exit || reports[0]["outcome"] != "throttled" ||
		reports[0]["domain"] != "news.example.com" || reports[0]["retryAfterSeconds"] != 7.0 {
		t.Errorf("reports %v, want one throttled of %s for news.example.com, retryAfterSeconds 7", reports, exit)
	}
}

// One session's requests, HTTP and HTTPS, leave through one exit; WithGatewayOptions
// replaces the transport's options for a request (here a namespace without exits).
func TestGatewayTransportSessions(t *testing.T) {
	gf := newGatewayFleet(t)
	// SessionTime and Strict without a Session: they go with the requests WithSession gives one.
	gt := gf.transport(t, client.GatewayConfig{Options: client.GatewayOptions{Namespace: "crawl", SessionTime: 90 * time.Second, Strict: true}})
	hc := &http.Client{Transport: gt, Timeout: 30 * time.Second}
	exits := map[string]bool{}
	for i := 0; i < 5; i++ {
		_, e1, _ := get(t, hc, gf.site.url("news.example.com", fmt.Sprintf("/p%d", i)), "one")
		_, e2, _ := get(t, hc, gf.tlsURL("news.example.com", fmt.Sprintf("/p%d", i)), "one")
		exits[e1], exits[e2] = true, true
		gt.CloseIdleConnections() // a new tunnel each time: the session, not the tunnel, holds the exit
	}
	if len(exits) != 1 {
		t.Errorf("session one left through %v, want one exit", exits)
	}
	for i := 0; i < 3; i++ { // without a session: no sesstime nor strict sent, each request rotates
		req, _ := http.NewRequest(http.MethodGet, gf.site.url("news.example.com", fmt.Sprintf("/r%d", i)), nil)
		res, err := hc.Do(req)
		if err != nil {
			t.Fatalf("a request without a session: %v", err)
		}
		res.Body.Close()
		exits[res.Header.Get(client.HeaderEgressProxy)] = true
	}
	if len(exits) != 3 {
		t.Errorf("three requests without a session and one session left through %v, want the three exits", exits)
	}
	ctx := client.WithGatewayOptions(context.Background(), client.GatewayOptions{Namespace: "nowhere"})
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, gf.site.url("news.example.com", "/"), nil)
	_, err := hc.Do(req)
	var ge *client.GatewayError
	if !errors.As(err, &ge) || ge.Status != http.StatusBadGateway || !strings.Contains(ge.Message, `namespace "nowhere"`) {
		t.Errorf("a namespace without exits: %v, want a *GatewayError 502 naming it", err)
	}
}

// The gateway's refusals are *GatewayErrors for HTTPS (its CONNECT answer) and plain
// HTTP alike, with its message; bad configuration is refused naming what is wrong.
func TestGatewayTransportErrors(t *testing.T) {
	gf := newGatewayFleet(t)
	c, err := client.New(client.Config{URL: gf.url, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cfg  client.GatewayConfig
		want string
	}{
		{client.GatewayConfig{URL: "gateway:8080"}, `gateway URL "gateway:8080": want http://host:port`},
		{client.GatewayConfig{URL: "socks5://gateway:1080"}, "want http://host:port"},
		{client.GatewayConfig{URL: "http://gateway"}, "want http://host:port"},
		{client.GatewayConfig{URL: "http://me:pw@gateway:8080"}, "want no user, path, query or fragment"},
		{client.GatewayConfig{URL: "http://gateway:8080/x"}, "want no user, path, query or fragment"},
		{client.GatewayConfig{URL: "http://gateway:8080", Options: client.GatewayOptions{Pool: "News"}}, `gateway option Pool (pool): "News" is not a pool name`},
		{client.GatewayConfig{URL: "http://gateway:8080", Options: client.GatewayOptions{Namespace: "a.b"}}, `gateway option Namespace (ns): "a.b" is not a namespace name`},
		{client.GatewayConfig{URL: "http://gateway:8080", Options: client.GatewayOptions{Session: "a+b"}}, `gateway option Session (session): "a+b" has '+'`},
		{client.GatewayConfig{URL: "http://gateway:8080", Options: client.GatewayOptions{SessionTime: 1500 * time.Millisecond}}, "gateway option SessionTime (sesstime): 1.5s is not a whole number"},
		{client.GatewayConfig{URL: "http://gateway:8080", Options: client.GatewayOptions{IPFamily: 5}}, "gateway option IPFamily (ip): must be 4, 6 or 0"},
		{client.GatewayConfig{URL: "http://gateway:8080", Options: client.GatewayOptions{User: "me@home"}}, `gateway option User: "me@home" has '@'`},
	} {
		if _, err := c.GatewayTransport(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one containing %q", tc.cfg, err, tc.want)
		}
	}
	noToken, err := client.New(client.Config{URL: gf.url})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noToken.GatewayTransport(client.GatewayConfig{URL: gf.gateway}); err == nil || !strings.Contains(err.Error(), "needs the discovery token") {
		t.Errorf("a Client without a token: %v", err)
	}

	badToken, err := client.New(client.Config{URL: gf.url, Token: "not-the-token"})
	if err != nil {
		t.Fatal(err)
	}
	gt, err := badToken.GatewayTransport(client.GatewayConfig{URL: gf.gateway, Base: &http.Transport{TLSClientConfig: gf.roots.Clone()}})
	if err != nil {
		t.Fatal(err)
	}
	defer gt.Close()
	hc := &http.Client{Transport: gt, Timeout: 30 * time.Second}
	for _, u := range []string{gf.tlsURL("shop.example.com", "/"), gf.site.url("shop.example.com", "/")} {
		_, err := hc.Get(u)
		var ge *client.GatewayError
		if !errors.As(err, &ge) || ge.Status != http.StatusProxyAuthRequired ||
			!strings.Contains(ge.Message, "not a token the discovery API accepts") || !strings.Contains(err.Error(), gf.gateway) {
			t.Errorf("GET %s with a bad token: %v, want a *GatewayError 407 naming the gateway and the reason", u, err)
		}
	}
	good := gf.transport(t, client.GatewayConfig{Options: client.GatewayOptions{Namespace: "crawl", Pool: "no-such-pool"}})
	hc = &http.Client{Transport: good, Timeout: 30 * time.Second}
	for _, u := range []string{gf.tlsURL("shop.example.com", "/"), gf.site.url("shop.example.com", "/")} {
		_, err := hc.Get(u)
		var ge *client.GatewayError
		if !errors.As(err, &ge) || ge.Status != http.StatusProxyAuthRequired || !strings.Contains(ge.Message, "no-such-pool") {
			t.Errorf("GET %s with an unknown pool: %v, want a *GatewayError 407 naming the pool", u, err)
		}
	}
	for _, opts := range []client.GatewayOptions{{IPFamily: 7}, {Session: "a b"}} {
		req, _ := http.NewRequestWithContext(client.WithGatewayOptions(context.Background(), opts),
			http.MethodGet, gf.site.url("shop.example.com", "/"), nil)
		if _, err := hc.Do(req); err == nil || !strings.Contains(err.Error(), "gateway option") {
			t.Errorf("a bad option in the request's context (%+v): %v", opts, err)
		}
	}
	req, _ := http.NewRequestWithContext(client.WithGatewayOptions(context.Background(), client.GatewayOptions{IPFamily: 7}),
		http.MethodGet, gf.site.url("shop.example.com", "/"), nil)
	if _, err := hc.Do(req); err == nil || !strings.Contains(err.Error(), "gateway option IPFamily (ip)") {
		t.Errorf("a bad option in the request's context: %v", err)
	}
	if st := good.Stats(); st.Reported != 0 || st.Banned != 0 || st.OK != 0 {
		t.Errorf("refused requests were reported: %+v", st)
	}
}

// GatewayOptions.Username writes what the gateway's own parser reads back to the same
// options, and refuses what the gateway refuses.
func TestGatewayUsernameParsesInTheGateway(t *testing.T) {
	for _, o := range []client.GatewayOptions{
		{},
		{User: "crawler-1"},
		{Namespace: "crawl", Pool: "news.eu-1"},
		{User: "a.b_c~d", Namespace: "n", Pool: "p", Session: "ABC-123_x.y~z", SessionTime: 90 * time.Second, Strict: true, IPFamily: 6},
		{Session: "s", SessionTime: 10 * time.Minute, IPFamily: 4},
		{Session: "s", SessionTime: 24 * time.Hour},
		{Session: strings.Repeat("s", 128), Pool: strings.Repeat("p", 63) + "." + strings.Repeat("q", 63)},
	} {
		user, err := o.Username()
		if err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		got, err := gateway.ParseOptions(user)
		if err != nil {
			t.Fatalf("%+v wrote %q, which the gateway refuses: %v", o, user, err)
		}
		want := gateway.Options{User: o.User, Namespace: o.Namespace, Pool: o.Pool, Session: o.Session,
			SessionTTL: o.SessionTime, Strict: o.Strict, Family: gateway.Family(o.IPFamily)}
		if got != want {
			t.Errorf("%q: the gateway read %+v, want %+v", user, got, want)
		}
		u, err := client.GatewayProxyURL("http://gw:8080", o, "tok")
		if err != nil || u.User.Username() != user || u.Host != "gw:8080" {
			t.Errorf("GatewayProxyURL(%+v) = %v, %v", o, u, err)
		}
	}
	for _, o := range []client.GatewayOptions{
		{User: strings.Repeat("u", 129)},
		{User: "a+b"},
		{Namespace: "Crawl"},
		{Namespace: strings.Repeat("n", 64)},
		{Pool: "-pool"},
		{Pool: strings.Repeat("p", 254)},
		{Session: strings.Repeat("s", 129)},
		{Session: "a=b"},
		{SessionTime: time.Minute},
		{Session: "s", SessionTime: 25 * time.Hour},
		{Session: "s", SessionTime: 500 * time.Millisecond},
		{Strict: true},
		{IPFamily: 5},
	} {
		if _, err := o.Username(); err == nil {
			t.Errorf("%+v: accepted", o)
		}
		g := gateway.Options{User: o.User, Namespace: o.Namespace, Pool: o.Pool, Session: o.Session,
			SessionTTL: o.SessionTime, Strict: o.Strict, Family: gateway.Family(o.IPFamily)}
		if g.Validate() == nil {
			t.Errorf("%+v: the client refuses what the gateway takes", o)
		}
	}
}

// Every request a kept-alive tunnel carries is attributed to the tunnel's exit, though
// only its first had a CONNECT (and OnProxyConnectResponse); a ban through the tunnel
// closes it, so the next request has a tunnel of its own.
func TestGatewayTransportAttributesKeptAliveTunnels(t *testing.T) {
	gf := newGatewayFleet(t)
	gt := gf.transport(t, client.GatewayConfig{Options: client.GatewayOptions{Namespace: "crawl"}})
	hc := &http.Client{Transport: gt, Timeout: 30 * time.Second}
	var banned, fine string
	for i := 0; i < 30 && (banned == "" || fine == ""); i++ {
		session := fmt.Sprintf("k%d", i)
		_, exit, _ := get(t, hc, gf.tlsURL("news.example.com", "/"), session)
		switch {
		case exit == "crawl/p3" && banned == "":
			banned = session
		case exit != "crawl/p3" && fine == "":
			fine = session
		}
	}
	if banned == "" || fine == "" {
		t.Fatal("no two sessions of 30 found, one through crawl/p3 and one through another exit")
	}
	before := gf.tunnels(t)
	var exit string
	for i := 0; i < 5; i++ {
		var e string
		_, e, _ = get(t, hc, gf.tlsURL("news.example.com", fmt.Sprintf("/kept/%d", i)), fine)
		if exit != "" && e != exit || e == "" {
			t.Fatalf("request %d of session %s through %q, the ones before through %q", i, fine, e, exit)
		}
		exit = e
	}
	if n := gf.tunnels(t) - before; n != 0 {
		t.Errorf("5 requests of a session with an open tunnel opened %d more tunnels, want none", n)
	}
	before = gf.tunnels(t)
	if status, e, _ := get(t, hc, gf.tlsURL("shop.example.com", "/banned/1"), banned); status != http.StatusForbidden || e != "crawl/p3" {
		t.Fatalf("session %s: %d through %s, want 403 through crawl/p3", banned, status, e)
	}
	get(t, hc, gf.tlsURL("shop.example.com", "/banned/2"), banned) // through crawl/p3 again, or moved once the ban is recorded
	if n := gf.tunnels(t) - before; n != 2 {
		t.Errorf("two requests of one session, the first banned, opened %d tunnels, want 2 (a ban closes its tunnel)", n)
	}
}

// The proxy password is the Client's token as it is now: a token file rewritten with a
// token discovery does not accept is the gateway's 407 from the next request on.
func TestGatewayTransportReadsTheTokenFileAgain(t *testing.T) {
	gf := newGatewayFleet(t)
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Config{URL: gf.url, TokenFile: file})
	if err != nil {
		t.Fatal(err)
	}
	gt, err := c.GatewayTransport(client.GatewayConfig{URL: gf.gateway, Options: client.GatewayOptions{Namespace: "crawl"}})
	if err != nil {
		t.Fatal(err)
	}
	defer gt.Close()
	hc := &http.Client{Transport: gt, Timeout: 30 * time.Second}
	u := gf.site.url("news.example.com", "/")
	res, err := hc.Get(u)
	if err != nil {
		t.Fatalf("with the token file's token: %v", err)
	}
	res.Body.Close()
	if err := os.WriteFile(file, []byte("a-token-discovery-never-issued\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = hc.Get(u)
	var ge *client.GatewayError
	if !errors.As(err, &ge) || ge.Status != http.StatusProxyAuthRequired {
		t.Errorf("after the token file changed to a bad token: %v, want the gateway's 407", err)
	}
}
