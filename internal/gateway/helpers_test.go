package gateway

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
)

// testExit is a real forward proxy on loopback, as an exit is: absolute-URI requests and
// CONNECT, Basic credentials of its own, and a distinct source address (its egress IP)
// for every connection it makes to a site. failOwn makes it answer 502 itself, marked as
// tinyproxy marks its own error pages.
type testExit struct {
	Exit
	ln       net.Listener
	srv      *http.Server
	failOwn  atomic.Bool
	served   atomic.Int64
	mu       sync.Mutex
	authSeen []string // the Proxy-Authorization headers it received
}

func startTestExit(t testing.TB, ns, name, egressIP string) *testExit {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &testExit{Exit: Exit{Namespace: ns, Name: name, Address: ln.Addr().String(), EgressIP: egressIP,
		User: "exit-" + name, Password: "secret-of-" + name}, ln: ln}
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(egressIP)}, Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: dialer.DialContext, DisableCompression: true}
	e.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.authSeen = append(e.authSeen, r.Header.Get("Proxy-Authorization"))
		e.mu.Unlock()
		if r.Header.Get("Proxy-Authorization") != basicAuth(e.User, e.Password) {
			w.Header().Set("Proxy-Authenticate", `Basic realm="exit"`)
			w.WriteHeader(http.StatusProxyAuthRequired)
			return
		}
		e.served.Add(1)
		if e.failOwn.Load() {
			w.Header().Set("Server", "tinyproxy/test")
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, "the exit cannot go on")
			return
		}
		if r.Method == http.MethodConnect {
			e.connect(w, r, dialer)
			return
		}
		r.RequestURI = ""
		r.Header.Del("Proxy-Authorization")
		resp, err := tr.RoundTrip(r)
		if err != nil {
			w.Header().Set("Server", "tinyproxy/test")
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.Header().Set("Via", "1.1 "+name+" (tinyproxy/test)")
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	})}
	go e.srv.Serve(ln)
	t.Cleanup(func() { e.srv.Close(); tr.CloseIdleConnections() })
	return e
}

func (e *testExit) connect(w http.ResponseWriter, r *http.Request, d *net.Dialer) {
	site, err := d.Dial("tcp", r.Host)
	if err != nil {
		w.Header().Set("Server", "tinyproxy/test")
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	w.WriteHeader(http.StatusOK)
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		site.Close()
		return
	}
	brw.Flush()
	go func() {
		io.Copy(site, brw)
		site.(*net.TCPConn).CloseWrite()
	}()
	io.Copy(c, site)
	c.Close()
	site.Close()
}

// stop closes the exit's listener: connections to it are refused from now on.
func (e *testExit) stop() { e.srv.Close() }

func (e *testExit) sawAuth() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.authSeen)
}

// testChooser is a Chooser over a fixed list: a session by rendezvous over the eligible
// exits, without one the Rotation-th distinct egress address. It stands where the wiring
// puts discovery's selection.
type testChooser struct {
	mu        sync.Mutex
	exits     []Exit
	pools     map[string][]string // pool -> exit IDs
	saturated map[string]bool     // sites
	down      map[string]bool     // exit IDs the health view says are unavailable
	// zero are pools that exist (as ProxyPools, in the namespace given) with no exit yet:
	// with nothing eligible, an *EmptyPoolError.
	zero  map[string]string
	calls []ChoiceRequest
}

func (c *testChooser) Choose(_ context.Context, req ChoiceRequest) (Exit, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, req)
	var members []string
	if req.Pool != "" {
		var ok bool
		if members, ok = c.pools[req.Pool]; !ok {
			return Exit{}, fmt.Errorf("%w %q", ErrUnknownPool, req.Pool)
		}
	}
	if c.saturated[req.Site] {
		return Exit{}, &SaturatedError{Site: req.Site, RetryAfter: 30 * time.Second}
	}
	var all []Exit
	for _, e := range c.exits {
		if !req.Identity.May(e.Namespace) || req.Namespace != "" && e.Namespace != req.Namespace ||
			members != nil && !slices.Contains(members, e.ID()) ||
			req.Family == FamilyIPv6 && !strings.Contains(e.EgressIP, ":") ||
			req.Family == FamilyIPv4 && strings.Contains(e.EgressIP, ":") {
			continue
		}
		all = append(all, e)
	}
	ok := func(e Exit) bool { return !req.Excludes(e.ID()) && !c.down[e.ID()] }
	if req.Session != "" {
		slices.SortFunc(all, func(a, b Exit) int { return cmpScore(req.Session, a, b) })
		if req.Strict && len(all) > 0 && !ok(all[0]) {
			return Exit{}, &UnavailableError{Exit: all[0].ID(), Reason: "excluded or down"}
		}
		for _, e := range all {
			if ok(e) {
				return e, nil
			}
		}
		if ns, ok := c.zero[req.Pool]; ok {
			return Exit{}, &EmptyPoolError{Namespace: ns, Pool: req.Pool, Reason: "no child is Ready"}
		}
		return Exit{}, ErrNoExit
	}
	var eligible []Exit
	for _, e := range all {
		if ok(e) {
			eligible = append(eligible, e)
		}
	}
	if len(eligible) == 0 {
		if ns, ok := c.zero[req.Pool]; ok {
			return Exit{}, &EmptyPoolError{Namespace: ns, Pool: req.Pool, Reason: "no child is Ready"}
		}
		return Exit{}, ErrNoExit
	}
	slices.SortFunc(eligible, func(a, b Exit) int { return strings.Compare(a.EgressIP, b.EgressIP) })
	return eligible[req.Rotation%uint64(len(eligible))], nil
}

func cmpScore(key string, a, b Exit) int {
	sa, sb := score64(key, a.ID()), score64(key, b.ID())
	switch {
	case sa > sb:
		return -1
	case sa < sb:
		return 1
	}
	return 0
}

func score64(key, id string) uint64 {
	h := fnv.New64a()
	io.WriteString(h, key+"\x00"+id)
	return h.Sum64()
}

func (c *testChooser) setDown(id string, down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down == nil {
		c.down = map[string]bool{}
	}
	c.down[id] = down
}

// testAuth accepts the tokens it holds.
type testAuth map[string]Identity

var errAPIDown = errors.New("the API server did not answer")

func (a testAuth) Authenticate(_ context.Context, _, password string) (Identity, error) {
	if password == "api-down" {
		return Identity{}, errAPIDown
	}
	id, ok := a[password]
	if !ok {
		return Identity{}, fmt.Errorf("%w: token not recognised", ErrBadCredentials)
	}
	return id, nil
}

// testReporter records what it hears.
type testReporter struct {
	mu          sync.Mutex
	unreachable []string
	banned      []string
}

func (r *testReporter) Unreachable(e Exit, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unreachable = append(r.unreachable, e.ID())
}

func (r *testReporter) Banned(e Exit, site string, status int, retryAfter time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.banned = append(r.banned, fmt.Sprintf("%s %s %d %s", e.ID(), site, status, retryAfter))
}

func (r *testReporter) got() (unreachable, banned []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.unreachable), slices.Clone(r.banned)
}

// The tokens of testAuth.
const (
	tokenCrawlers = "token-crawlers" // may use namespace crawlers
	tokenAll      = "token-all"      // may use every namespace
)

// harness is a gateway on loopback with its listeners, chooser, reporter and registry.
type harness struct {
	g         *Gateway
	httpAddr  string
	socksAddr string
	chooser   *testChooser
	reporter  *testReporter
	reg       *prometheus.Registry
	logs      *logLines
}

type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, args)
}

func (l *logLines) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

func newHarness(t testing.TB, exits []*testExit, tune func(*Config)) *harness {
	t.Helper()
	h := &harness{chooser: &testChooser{pools: map[string][]string{}}, reporter: &testReporter{},
		reg: prometheus.NewRegistry(), logs: &logLines{}}
	for _, e := range exits {
		h.chooser.exits = append(h.chooser.exits, e.Exit)
	}
	cfg := Config{
		Chooser: h.chooser,
		Authenticator: testAuth{
			tokenCrawlers: {Name: "crawler", Namespaces: []string{"crawlers"}},
			tokenAll:      {Name: "static token", AllNamespaces: true},
		},
		Reporter: h.reporter,
		Registry: h.reg,
		Log:      funcr.New(h.logs.add, funcr.Options{Verbosity: 1}),
	}
	if tune != nil {
		tune(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.g = g
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.httpAddr, h.socksAddr = hl.Addr().String(), sl.Addr().String()
	go g.Serve(hl)
	go g.ServeSOCKS(sl)
	t.Cleanup(func() {
		// Clients' idle keep-alive tunnels would hold a graceful shutdown: close them now.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		g.Shutdown(ctx)
	})
	return h
}

// client is a plain Go HTTP client using the gateway as its proxy with the given user
// name and password, as any crawler would.
func (h *harness) client(user, password string) *http.Client {
	u := &url.URL{Scheme: "http", Host: h.httpAddr, User: url.UserPassword(user, password)}
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u), DisableKeepAlives: false}, Timeout: 20 * time.Second}
}

// site is a plain HTTP server that answers with the address it saw the request from and
// records the headers it got.
type site struct {
	url     string
	addr    string
	mu      sync.Mutex
	headers []http.Header
	status  atomic.Int32
	extra   http.Header
}

func startSite(t testing.TB) *site {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &site{url: "http://" + ln.Addr().String(), addr: ln.Addr().String(), extra: http.Header{}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.headers = append(s.headers, r.Header.Clone())
		for k, v := range s.extra {
			w.Header()[k] = v
		}
		s.mu.Unlock()
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		w.Header().Set("X-Seen-From", host)
		if st := s.status.Load(); st != 0 {
			w.WriteHeader(int(st))
		}
		io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "hello %s", host)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return s
}

func (s *site) lastHeaders() http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.headers) == 0 {
		return nil
	}
	return s.headers[len(s.headers)-1]
}

// rawConnect sends CONNECT target with the given credentials over a fresh connection and
// returns the connection, a reader positioned after the answer's header, and the answer.
func rawConnect(t testing.TB, proxy, target, user, password string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	auth := ""
	if user != "" || password != "" {
		auth = "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password)) + "\r\n"
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", target, target, auth)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("reading the answer to CONNECT %s: %v", target, err)
	}
	return c, br, resp
}

func readBody(t testing.TB, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// counterValue sums the samples of the metric name whose label has the given value.
func counterValue(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
			if label == "" {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// leakyChooser offers one exit whoever asks, as a broken Chooser might.
type leakyChooser struct{ exit Exit }

func (c *leakyChooser) Choose(context.Context, ChoiceRequest) (Exit, error) { return c.exit, nil }

// addToPool adds exit to pool as a child that just became Ready.
func (c *testChooser) addToPool(pool string, e Exit) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.exits = append(c.exits, e)
	c.pools[pool] = append(c.pools[pool], e.ID())
}
