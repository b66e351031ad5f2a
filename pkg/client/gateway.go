package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/publicsuffix"
)

// The gateway's identity headers: the exit (namespace/name) that carried a request or
// tunnel, and the address the site saw. The gateway sends them on every plain-HTTP
// response and on its answer to CONNECT; a GatewayTransport copies the CONNECT answer's
// onto every response that came through the tunnel.
const (
	HeaderEgressProxy = "X-Egress-Proxy"
	HeaderEgressIP    = "X-Egress-IP"
)

// GatewayOptions are what a crawler asks the gateway for, written into the proxy user
// name as the gateway's grammar has it (docs/gateway.md):
// USER+ns=NS+pool=POOL+session=ID+sesstime=10m+strict+ip=4. The zero value asks for
// nothing: any exit the token may use, a new one for each request or tunnel.
type GatewayOptions struct {
	// User is the crawler's own name, for the gateway's log: letters, digits, '-', '.',
	// '_' or '~', at most 128 characters; may be empty.
	User string
	// Namespace: only exits in this namespace (a DNS-1123 label).
	Namespace string
	// Pool: only this ProxyPool's exits (a DNS-1123 subdomain).
	Pool string
	// Session makes the choice sticky: every request and tunnel of the session goes to
	// the same exit. Letters, digits, '-', '.', '_' or '~', at most 128 characters.
	Session string
	// SessionTime is the session's sliding idle lifetime, whole seconds from 1 s to 24 h;
	// 0: the gateway's default (10 min). Needs Session.
	SessionTime time.Duration
	// Strict keeps the session on its exit: when that exit is unavailable the gateway
	// answers 502 naming it instead of moving the session. Needs Session.
	Strict bool
	// IPFamily is 4 or 6 for an exit whose egress address is IPv4 or IPv6; 0: either.
	IPFamily int
}

// Limits of the user name's parts, the gateway's.
const (
	maxGatewayUser    = 128
	maxGatewaySession = 128
	maxSessionTime    = 24 * time.Hour
)

var (
	dns1123Label     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// unreserved is RFC 3986's unreserved characters, which a user part and a session id
// take: none needs percent-encoding in a URL.
func unreserved(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
		r == '-' || r == '.' || r == '_' || r == '~'
}

// Validate checks the options as the gateway does; an error names the option at fault.
func (o GatewayOptions) Validate() error {
	bad := func(option, format string, args ...any) error {
		return fmt.Errorf("gateway option %s: %s", option, fmt.Sprintf(format, args...))
	}
	if len(o.User) > maxGatewayUser {
		return bad("User", "longer than %d characters", maxGatewayUser)
	}
	if i := strings.IndexFunc(o.User, func(r rune) bool { return !unreserved(r) }); i >= 0 {
		return bad("User", "%q has %q; use letters, digits, '-', '.', '_' or '~'", o.User, o.User[i])
	}
	if o.Namespace != "" && (len(o.Namespace) > 63 || !dns1123Label.MatchString(o.Namespace)) {
		return bad("Namespace (ns)", "%q is not a namespace name (a DNS-1123 label: at most 63 lower-case letters, digits or '-', starting and ending with a letter or digit)", o.Namespace)
	}
	if o.Pool != "" && (len(o.Pool) > 253 || !dns1123Subdomain.MatchString(o.Pool)) {
		return bad("Pool (pool)", "%q is not a pool name (a DNS-1123 subdomain: at most 253 lower-case letters, digits, '-' or '.')", o.Pool)
	}
	if len(o.Session) > maxGatewaySession {
		return bad("Session (session)", "longer than %d characters", maxGatewaySession)
	}
	if i := strings.IndexFunc(o.Session, func(r rune) bool { return !unreserved(r) }); i >= 0 {
		return bad("Session (session)", "%q has %q; use letters, digits, '-', '.', '_' or '~'", o.Session, o.Session[i])
	}
	if o.SessionTime != 0 {
		if o.Session == "" {
			return bad("SessionTime (sesstime)", "needs a Session")
		}
		if d := o.SessionTime; d < time.Second || d > maxSessionTime || d%time.Second != 0 {
			return bad("SessionTime (sesstime)", "%s is not a whole number of seconds from 1s to 24h", d)
		}
	}
	if o.Strict && o.Session == "" {
		return bad("Strict (strict)", "needs a Session")
	}
	if o.IPFamily != 0 && o.IPFamily != 4 && o.IPFamily != 6 {
		return bad("IPFamily (ip)", "must be 4, 6 or 0 (either), not %d", o.IPFamily)
	}
	return nil
}

// Username writes the options as the gateway's proxy user name, in the gateway's own
// order (ns, pool, session, sesstime, strict, ip); a bad option is an error naming it.
func (o GatewayOptions) Username() (string, error) {
	if err := o.Validate(); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(o.User)
	opt := func(name, value string) {
		b.WriteString("+" + name)
		if value != "" {
			b.WriteString("=" + value)
		}
	}
	if o.Namespace != "" {
		opt("ns", o.Namespace)
	}
	if o.Pool != "" {
		opt("pool", o.Pool)
	}
	if o.Session != "" {
		opt("session", o.Session)
	}
	if d := o.SessionTime; d != 0 {
		switch {
		case d%time.Hour == 0:
			opt("sesstime", strconv.FormatInt(int64(d/time.Hour), 10)+"h")
		case d%time.Minute == 0:
			opt("sesstime", strconv.FormatInt(int64(d/time.Minute), 10)+"m")
		default:
			opt("sesstime", strconv.FormatInt(int64(d/time.Second), 10)+"s")
		}
	}
	if o.Strict {
		opt("strict", "")
	}
	if o.IPFamily != 0 {
		opt("ip", strconv.Itoa(o.IPFamily))
	}
	return b.String(), nil
}

// GatewayProxyURL is the proxy URL of the gateway at gatewayURL (http://host:port) with
// opts in its user name and token as its password: what http.ProxyURL, curl -x or
// HTTP_PROXY take. A bad URL or option is an error naming it.
func GatewayProxyURL(gatewayURL string, opts GatewayOptions, token string) (*url.URL, error) {
	u, err := parseGatewayURL(gatewayURL)
	if err != nil {
		return nil, err
	}
	user, err := opts.Username()
	if err != nil {
		return nil, err
	}
	u.User = url.UserPassword(user, token)
	return u, nil
}

func parseGatewayURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("gateway URL %q: %w", s, err)
	}
	if u.Scheme != "http" || u.Host == "" || u.Port() == "" {
		return nil, fmt.Errorf("gateway URL %q: want http://host:port, the gateway's HTTP proxy listener (its SOCKS5 port cannot name the exit)", s)
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("gateway URL %q: want no user, path, query or fragment (the options go in GatewayConfig.Options, the token in Config.Token or Config.TokenFile)", s)
	}
	u.Path = ""
	return u, nil
}

type gatewayOptionsKey struct{}

// WithSession returns ctx carrying a session id for the gateway: a request made with it
// goes through a GatewayTransport with this session (and the transport's other options),
// so every request of the session leaves through the same exit; "": no session.
func WithSession(ctx context.Context, session string) context.Context {
	return context.WithValue(ctx, gatewayOptionsKey{}, func(o GatewayOptions) GatewayOptions {
		o.Session = session
		return o
	})
}

// WithGatewayOptions returns ctx carrying options for the gateway that replace, for a
// request made with it, the GatewayTransport's own.
func WithGatewayOptions(ctx context.Context, opts GatewayOptions) context.Context {
	return context.WithValue(ctx, gatewayOptionsKey{}, func(GatewayOptions) GatewayOptions { return opts })
}

// GatewayConfig configures a GatewayTransport.
type GatewayConfig struct {
	// URL is the gateway's HTTP proxy, http://host:port, such as
	// http://egress-proxies-gateway.egress-proxies-operator-system.svc:8080.
	URL string
	// Options go into the proxy user name of every request (WithSession and
	// WithGatewayOptions change them for one request). SessionTime and Strict go only
	// with a session: here they may be given without one, for the requests WithSession
	// gives one.
	Options GatewayOptions
	// Base carries the requests to the gateway; it is cloned and its Proxy, DialContext
	// and OnProxyConnectResponse wrapped. nil: a clone of http.DefaultTransport.
	Base *http.Transport
	// BanStatus are the site's answers reported as banned (default 403); ThrottleStatus
	// those reported as throttled, with their Retry-After (default 429). Other 2xx
	// answers are reported ok.
	BanStatus      []int
	ThrottleStatus []int
	// FlushInterval is how often reports are sent (default 1 s); FlushSize sends them
	// sooner, once that many are waiting (default 500).
	FlushInterval time.Duration
	FlushSize     int
	// OnFeedbackError receives what went wrong sending reports: an error, or reports the
	// API rejected. nil: dropped.
	OnFeedbackError func(error)
}

// GatewayError is the gateway's own refusal of a request or tunnel: a bad token (407),
// a bad option (407 naming it), a site its pool is saturated for (503 with RetryAfter),
// no exit (502), a strict session's exit unavailable (502 with Exit), every exit tried
// failed (502). For HTTPS it is the gateway's answer to CONNECT; for plain HTTP an answer
// without X-Egress-Proxy (a site's answer always has it).
type GatewayError struct {
	// Gateway is the gateway's URL (without credentials); Target the request's host:port.
	Gateway, Target string
	Status          int
	// Message is the gateway's plain-text body.
	Message string
	// Exit is the X-Egress-Proxy of the answer (a strict session's exit); "": none.
	Exit string
	// RetryAfter is the answer's Retry-After (a saturated site); 0: none.
	RetryAfter time.Duration
}

func (e *GatewayError) Error() string {
	s := fmt.Sprintf("egress gateway %s refused %s: %d %s", e.Gateway, e.Target, e.Status, http.StatusText(e.Status))
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Exit != "" {
		s += " (exit " + e.Exit + ")"
	}
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(" (retry after %s)", e.RetryAfter)
	}
	return s
}

// GatewayTransport is an http.RoundTripper that sends every request through the
// egress-proxies gateway, with its options in the proxy user name and the Client's
// discovery token as the password. It learns the exit of each request from the
// gateway's X-Egress-Proxy (on a plain-HTTP response; for HTTPS on the gateway's answer
// to the tunnel's CONNECT, through OnProxyConnectResponse), reports the site's answer
// by that exit's name to POST /v1/feedback (403 banned, 429 throttled with its
// Retry-After, 2xx ok), batched as the Transport batches them, and sets X-Egress-Proxy
// and X-Egress-IP on every response it returns. The gateway chooses exits and retries
// failed ones itself; a GatewayTransport sends each request once. Close it to send the
// last reports.
type GatewayTransport struct {
	c       *Client
	gateway *url.URL
	opts    GatewayOptions
	base    *http.Transport
	// fb is a Transport used for its reports and counts only: its classification, its
	// batched sender and its Stats.
	fb *Transport
}

// tunnelConn is a connection to the gateway that may become a tunnel: the CONNECT
// answer's identity headers are kept on it, for every request it carries.
type tunnelConn struct {
	net.Conn
	exit, ip atomic.Pointer[string]
	dials    *sync.Map // dial context -> *tunnelConn, until the CONNECT is answered
	key      context.Context
}

func (c *tunnelConn) Close() error {
	c.dials.Delete(c.key)
	return c.Conn.Close()
}

// gwAttempt is what one request learnt on its way.
type gwAttempt struct {
	proxy *url.URL
	conn  atomic.Pointer[tunnelConn]
}

type gwAttemptKey struct{}

// GatewayTransport returns a GatewayTransport that reports with c. c must have a token
// (Config.Token or Config.TokenFile): it is the gateway's proxy password, read again
// for each request as the discovery calls read it.
func (c *Client) GatewayTransport(cfg GatewayConfig) (*GatewayTransport, error) {
	gw, err := parseGatewayURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	check := cfg.Options
	if check.Session == "" {
		check.Session = "s" // SessionTime and Strict are checked as a request with a session sends them
	}
	if _, err := check.Username(); err != nil {
		return nil, err
	}
	if !c.hasToken() {
		return nil, errors.New("gateway mode needs the discovery token (Config.Token or Config.TokenFile): it is the gateway's proxy password")
	}
	var base *http.Transport
	if cfg.Base != nil {
		base = cfg.Base.Clone()
	} else {
		base = http.DefaultTransport.(*http.Transport).Clone()
	}
	g := &GatewayTransport{c: c, gateway: gw, opts: cfg.Options, base: base,
		fb: c.Transport(TransportConfig{BanStatus: cfg.BanStatus, ThrottleStatus: cfg.ThrottleStatus,
			FlushInterval: cfg.FlushInterval, FlushSize: cfg.FlushSize, OnFeedbackError: cfg.OnFeedbackError})}
	base.Proxy = func(r *http.Request) (*url.URL, error) {
		if a, ok := r.Context().Value(gwAttemptKey{}).(*gwAttempt); ok {
			return a.proxy, nil
		}
		return nil, errors.New("a request not sent by the GatewayTransport")
	}
	dial := base.DialContext
	if dial == nil {
		dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	// The dial of a tunnel and its CONNECT share one context: the connection dialled is
	// found again by it when the CONNECT is answered.
	var dials sync.Map
	base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := &tunnelConn{Conn: conn, dials: &dials, key: ctx}
		dials.Store(ctx, tc)
		return tc, nil
	}
	userHook := base.OnProxyConnectResponse
	base.OnProxyConnectResponse = func(ctx context.Context, proxyURL *url.URL, connectReq *http.Request, res *http.Response) error {
		if v, ok := dials.LoadAndDelete(ctx); ok {
			tc := v.(*tunnelConn)
			exit, ip := res.Header.Get(HeaderEgressProxy), res.Header.Get(HeaderEgressIP)
			tc.exit.Store(&exit)
			tc.ip.Store(&ip)
		}
		if userHook != nil {
			if err := userHook(ctx, proxyURL, connectReq, res); err != nil {
				return err
			}
		}
		if res.StatusCode != http.StatusOK {
			return g.refusal(connectReq.Host, res)
		}
		return nil
	}
	return g, nil
}

// refusal is the gateway's answer res as a *GatewayError.
func (g *GatewayTransport) refusal(target string, res *http.Response) *GatewayError {
	var msg string
	if res.Body != nil {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 4<<10))
		msg = strings.TrimSpace(string(b))
	}
	return &GatewayError{Gateway: g.gateway.String(), Target: target, Status: res.StatusCode, Message: msg,
		Exit: res.Header.Get(HeaderEgressProxy), RetryAfter: retryAfter(res.Header)}
}

// Stats returns the counts so far: Requests, Attempts (one a request), Banned,
// Throttled, OK, Reported and Rejected; the gateway does the retrying, so Retries,
// ProxyRetries and Unreachable stay 0.
func (g *GatewayTransport) Stats() Stats { return g.fb.Stats() }

// Close sends the reports still waiting (trying for at most 30 s), stops the sender and
// closes idle connections to the gateway; requests after Close are still carried, their
// reports dropped.
func (g *GatewayTransport) Close() error {
	g.base.CloseIdleConnections()
	return g.fb.Close()
}

// CloseIdleConnections closes the idle connections (and open idle tunnels) to the gateway.
func (g *GatewayTransport) CloseIdleConnections() { g.base.CloseIdleConnections() }

// RoundTrip sends req through the gateway with the transport's options (or those of
// req's context), reports the site's answer by the exit that carried it, and returns the
// answer with X-Egress-Proxy and X-Egress-IP set. A refusal of the gateway's is a
// *GatewayError; a bad option in the context is an error naming it.
func (g *GatewayTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t := g.fb
	t.stats[stRequests].Add(1)
	opts := g.opts
	if f, ok := req.Context().Value(gatewayOptionsKey{}).(func(GatewayOptions) GatewayOptions); ok {
		opts = f(opts)
	}
	if opts.Session == "" {
		opts.SessionTime, opts.Strict = 0, false // a session's own options
	}
	user, err := opts.Username()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Redacted(), err)
	}
	token, err := g.c.token()
	if err != nil {
		return nil, fmt.Errorf("%s %s: the gateway's password: %w", req.Method, req.URL.Redacted(), err)
	}
	pu := *g.gateway
	pu.User = url.UserPassword(user, token)
	a := &gwAttempt{proxy: &pu}
	ctx := context.WithValue(req.Context(), gwAttemptKey{}, a)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) {
			if tc := tunnelOf(i.Conn); tc != nil {
				a.conn.Store(tc)
			}
		},
	})
	t.stats[stAttempts].Add(1)
	res, err := g.base.RoundTrip(req.Clone(ctx))
	if err != nil {
		return nil, fmt.Errorf("%s %s through the egress gateway %s: %w", req.Method, req.URL.Redacted(), g.gateway, err)
	}
	if req.URL.Scheme == "https" {
		if tc := a.conn.Load(); tc != nil {
			if p := tc.exit.Load(); p != nil {
				res.Header.Set(HeaderEgressProxy, *p)
				res.Header.Del(HeaderEgressIP)
				if ip := tc.ip.Load(); ip != nil && *ip != "" {
					res.Header.Set(HeaderEgressIP, *ip)
				}
			}
		}
	} else if res.Header.Get(HeaderEgressProxy) == "" {
		// Every answer the gateway relays names its exit: this one is the gateway's own.
		gerr := g.refusal(canonicalHostPort(req.URL), res)
		res.Body.Close()
		return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Redacted(), gerr)
	}
	exit := res.Header.Get(HeaderEgressProxy)
	host := req.URL.Hostname()
	site, serr := publicsuffix.EffectiveTLDPlusOne(host)
	if exit == "" || serr != nil || site == "" || net.ParseIP(host) != nil {
		return res, nil // no exit or no site to report about
	}
	outcome, wait := t.classify(res)
	if outcome == "" {
		return res, nil
	}
	t.report(Report{Proxy: exit, Domain: host, Outcome: outcome, RetryAfter: wait})
	if tc := a.conn.Load(); tc != nil && outcome != OK && req.URL.Scheme == "https" {
		// A tunnel keeps its exit for as long as it is open: the next request for the
		// site opens a new one, which the gateway chooses an exit for again.
		res.Body = &closeTunnelBody{ReadCloser: res.Body, tc: tc}
	}
	return res, nil
}

// closeTunnelBody closes its tunnel when the answer's body is closed.
type closeTunnelBody struct {
	io.ReadCloser
	tc *tunnelConn
}

func (b *closeTunnelBody) Close() error {
	err := b.ReadCloser.Close()
	b.tc.Close()
	return err
}

// tunnelOf is the connection to the gateway under c (a TLS connection through a
// tunnel, or the plain connection itself); nil when it is none of this transport's.
func tunnelOf(c net.Conn) *tunnelConn {
	for c != nil {
		switch v := c.(type) {
		case *tunnelConn:
			return v
		case *tls.Conn:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// canonicalHostPort is u's host:port with the scheme's default port.
func canonicalHostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return net.JoinHostPort(u.Hostname(), "80")
}
