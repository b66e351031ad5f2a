package gateway

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// route is one request's or tunnel's way through the gateway: who asked, with which
// options, to which site, and the exits that failed it so far.
type route struct {
	id      Identity
	opts    Options
	site    string // the target host, lower case, no port, no brackets
	target  string // host:port
	exclude []string
	tried   int
	// rotation is the request's place in this gateway's rotation (without a session),
	// drawn at its first choice and kept for its retries.
	rotation uint64
	// namespace and pool label the metrics: the exit's namespace once one is chosen.
	namespace, pool string
	// demand is the pool the route is demand of (the chosen exit's, else the requested
	// one), and counted whether it was counted in the pool's requests per second.
	demand  poolKey
	counted bool
}

func newRoute(id Identity, opts Options, target string) *route {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		host = target
	}
	return &route{id: id, opts: opts, site: strings.ToLower(strings.TrimSuffix(host, ".")), target: target,
		namespace: opts.Namespace, pool: opts.Pool}
}

// choose asks the Chooser for the route's next exit and checks the answer is one the
// caller may use.
func (g *Gateway) choose(ctx context.Context, rt *route) (Exit, error) {
	req := ChoiceRequest{
		Identity:  rt.id,
		Namespace: rt.opts.Namespace,
		Pool:      rt.opts.Pool,
		Provider:  rt.opts.Provider,
		Region:    rt.opts.Region,
		Zone:      rt.opts.Zone,
		Labels:    rt.opts.Labels,
		Session:   rt.opts.Session,
		Strict:    rt.opts.Strict,
		Site:      rt.site,
		Exclude:   rt.exclude,
		Family:    rt.opts.Family,
	}
	if req.Session == "" {
		if rt.tried == 0 {
			rt.rotation = g.rotation.Add(1) - 1
		}
		req.Rotation = rt.rotation
	}
	start := time.Now()
	exit, err := g.cfg.Chooser.Choose(ctx, req)
	g.metrics.choice.Observe(time.Since(start).Seconds())
	if err != nil {
		return Exit{}, err
	}
	if !rt.id.May(exit.Namespace) || rt.opts.Namespace != "" && exit.Namespace != rt.opts.Namespace {
		// One check here, so that a Chooser's mistake never leaks another namespace's exit.
		return Exit{}, fmt.Errorf("%w: the chooser offered %s, outside the namespaces %s may use", ErrNoExit, exit.ID(), rt.id.Name)
	}
	rt.namespace = exit.Namespace
	rt.demand = poolKey{exit.Namespace, exit.Pool}
	if exit.Pool == "" {
		rt.demand.pool = rt.opts.Pool
	}
	g.countDemand(rt)
	if rt.opts.Session != "" {
		g.sessions.touch(rt, exit, g.log)
	}
	return exit, nil
}

// failed records that exit failed the route: the Reporter hears of it, the exit is
// excluded from the next choice. It returns the error to give up with, or nil when
// another exit may be tried.
func (g *Gateway) failed(rt *route, exit Exit, err error) error {
	g.cfg.Reporter.Unreachable(exit, err)
	g.log.V(1).Info("exit failed", "exit", exit.ID(), "site", rt.site, "attempt", rt.tried, "error", err.Error())
	rt.exclude = append(rt.exclude, exit.ID())
	if rt.opts.Strict {
		return &UnavailableError{Exit: exit.ID(), Reason: err.Error()}
	}
	if rt.tried >= g.cfg.MaxAttempts {
		return fmt.Errorf("%w: tried %d exits (%s); the last, %s: %v", ErrExitFailed, rt.tried, strings.Join(rt.exclude, ", "), exit.ID(), err)
	}
	return nil
}

// openTunnel connects to rt.target through an exit, trying other exits when one fails
// before answering 200 to CONNECT. It returns the connection to the exit and any bytes
// the exit sent after its answer.
func (g *Gateway) openTunnel(ctx context.Context, rt *route, cl client) (*net.TCPConn, Exit, []byte, error) {
	for {
		exit, err := g.chooseFor(ctx, rt, cl)
		if err != nil {
			return nil, Exit{}, nil, err
		}
		rt.tried++
		conn, rest, err := g.connectVia(ctx, exit, rt.target)
		if err == nil {
			return conn, exit, rest, nil
		}
		if err := g.failed(rt, exit, err); err != nil {
			return nil, exit, nil, err
		}
	}
}

// connectVia opens a CONNECT tunnel to target through exit, sending the exit's own
// credentials. Any answer but 2xx is the exit's failure.
func (g *Gateway) connectVia(ctx context.Context, exit Exit, target string) (*net.TCPConn, []byte, error) {
	d := net.Dialer{Timeout: g.cfg.ExitTimeout}
	c, err := d.DialContext(ctx, "tcp", exit.Address)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: connecting to %s: %w", ErrExitFailed, exit.Address, err)
	}
	conn := c.(*net.TCPConn)
	conn.SetDeadline(time.Now().Add(g.cfg.ExitTimeout))
	buf := make([]byte, 0, 256)
	buf = append(buf, "CONNECT "...)
	buf = append(buf, target...)
	buf = append(buf, " HTTP/1.1\r\nHost: "...)
	buf = append(buf, target...)
	if exit.User != "" || exit.Password != "" {
		buf = append(buf, "\r\nProxy-Authorization: "...)
		buf = append(buf, basicAuth(exit.User, exit.Password)...)
	}
	buf = append(buf, "\r\n\r\n"...)
	if _, err := conn.Write(buf); err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("%w: sending CONNECT %s to %s: %w", ErrExitFailed, target, exit.Address, err)
	}
	br := getReader(conn)
	defer putReader(br)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("%w: reading %s's answer to CONNECT %s: %w", ErrExitFailed, exit.Address, target, err)
	}
	if resp.StatusCode/100 != 2 {
		conn.Close()
		return nil, nil, fmt.Errorf("%w: %s answered CONNECT %s with %s", ErrExitFailed, exit.Address, target, resp.Status)
	}
	var rest []byte
	if n := br.Buffered(); n > 0 {
		p, _ := br.Peek(n)
		rest = append([]byte(nil), p...)
	}
	conn.SetDeadline(time.Time{})
	return conn, rest, nil
}

func basicAuth(user, password string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))
}

// refusal is how the gateway answers a request it cannot carry.
type refusal struct {
	status     int
	outcome    string
	msg        string
	exit       string // the exit a strict session is tied to, for X-Egress-Proxy
	retryAfter time.Duration
	socks      byte // the SOCKS5 reply code
}

// The outcomes of the metrics.
const (
	outcomeOK         = "ok"
	outcomeRetried    = "retried"
	outcomeSaturated  = "saturated"
	outcomeNoExit     = "no_exit"
	outcomeExitFailed = "exit_failed"
	// outcomeClientGone: the client left while its request was held (hold.go).
	outcomeClientGone = "client_gone"
	outcomeAuthFailed = "auth_failed"
	outcomeBadRequest = "bad_request"
)

// SOCKS5 reply codes (RFC 1928 section 6).
const (
	socksSucceeded       = 0x00
	socksNotAllowed      = 0x02
	socksNetUnreachable  = 0x03
	socksHostUnreachable = 0x04
	socksCmdUnsupported  = 0x07
	socksAddrUnsupported = 0x08
)

// refuseChoice turns an error of choose or openTunnel into the answer the client gets.
func refuseChoice(rt *route, err error) refusal {
	var sat *SaturatedError
	var unavail *UnavailableError
	var held *heldError
	switch {
	case errors.As(err, &held):
		return held.refusal()
	case errors.As(err, &sat):
		return refusal{status: http.StatusServiceUnavailable, outcome: outcomeSaturated, retryAfter: sat.RetryAfter,
			msg: fmt.Sprintf("pool %q is saturated for site %s: too many of its exits are cooling for it; retry after %s", rt.opts.Pool, sat.Site, sat.RetryAfter), socks: socksNotAllowed}
	case errors.Is(err, ErrSaturated):
		return refusal{status: http.StatusServiceUnavailable, outcome: outcomeSaturated, retryAfter: time.Minute,
			msg: fmt.Sprintf("pool %q is saturated for site %s: %v", rt.opts.Pool, rt.site, err), socks: socksNotAllowed}
	case errors.As(err, &unavail):
		return refusal{status: http.StatusBadGateway, outcome: outcomeExitFailed, exit: unavail.Exit,
			msg: fmt.Sprintf("session %q is strict and its exit %s is unavailable (%s); use a soft session to move it", rt.opts.Session, unavail.Exit, unavail.Reason), socks: socksHostUnreachable}
	case errors.Is(err, ErrUnknownPool):
		return refusal{status: http.StatusProxyAuthRequired, outcome: outcomeAuthFailed,
			msg: fmt.Sprintf("option %s: %v", OptPool, err), socks: socksNotAllowed}
	case errors.Is(err, ErrExitFailed):
		return refusal{status: http.StatusBadGateway, outcome: outcomeExitFailed, msg: err.Error(), socks: socksHostUnreachable}
	default:
		return refusal{status: http.StatusBadGateway, outcome: outcomeNoExit,
			msg: fmt.Sprintf("no exit for site %s (namespace %q, pool %q): %v", rt.site, rt.opts.Namespace, rt.opts.Pool, err), socks: socksNetUnreachable}
	}
}

// authenticate reads the options and the credential out of a user name and a password.
// A refusal is 407 (bad or missing credentials, bad options, a namespace the caller may
// not use) or 503 (the Authenticator could not tell).
func (g *Gateway) authenticate(ctx context.Context, user, password string) (Identity, Options, *refusal) {
	opts, err := ParseOptions(user)
	if err != nil {
		return Identity{}, Options{}, &refusal{status: http.StatusProxyAuthRequired, outcome: outcomeAuthFailed, msg: err.Error(), socks: 1}
	}
	if password == "" {
		return Identity{}, opts, &refusal{status: http.StatusProxyAuthRequired, outcome: outcomeAuthFailed,
			msg: "the proxy password is empty: give a discovery token as the password", socks: 1}
	}
	id, err := g.cfg.Authenticator.Authenticate(ctx, opts.User, password)
	if errors.Is(err, ErrBadCredentials) {
		return Identity{}, opts, &refusal{status: http.StatusProxyAuthRequired, outcome: outcomeAuthFailed,
			msg: "the proxy password is not a token the discovery API accepts: " + err.Error(), socks: 1}
	}
	if err != nil {
		return Identity{}, opts, &refusal{status: http.StatusServiceUnavailable, outcome: outcomeAuthFailed, retryAfter: 5 * time.Second,
			msg: "could not verify the proxy password now, try again: " + err.Error(), socks: 1}
	}
	if opts.Namespace != "" && !id.May(opts.Namespace) {
		return Identity{}, opts, &refusal{status: http.StatusProxyAuthRequired, outcome: outcomeAuthFailed,
			msg: fmt.Sprintf("option %s: %s may not use namespace %q", OptNamespace, id.Name, opts.Namespace), socks: 1}
	}
	return id, opts, nil
}

// proxyCredentials reads a Proxy-Authorization header.
func proxyCredentials(h http.Header) (user, password string, r *refusal) {
	v := h.Get("Proxy-Authorization")
	bad := func(msg string) (string, string, *refusal) {
		return "", "", &refusal{status: http.StatusProxyAuthRequired, outcome: outcomeAuthFailed, msg: msg}
	}
	if v == "" {
		return bad("proxy credentials are missing: give the options as the proxy user name and a discovery token as the password (http://USER+pool=NAME:TOKEN@gateway:port)")
	}
	scheme, enc, _ := strings.Cut(v, " ")
	if !strings.EqualFold(scheme, "Basic") {
		return bad(fmt.Sprintf("Proxy-Authorization scheme %q is not Basic", scheme))
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return bad("Proxy-Authorization Basic credentials are not base64")
	}
	user, password, ok := strings.Cut(string(raw), ":")
	if !ok {
		return bad("Proxy-Authorization Basic credentials have no ':' between user name and password")
	}
	return user, password, nil
}

// readerPool and writerPool hold 4 KiB buffers for headers and handshakes, so an open
// tunnel or an idle keep-alive connection between requests holds none of its own.
var (
	readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}
	writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4096) }}
)

func getReader(r io.Reader) *bufio.Reader {
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(r)
	return br
}

func putReader(br *bufio.Reader) {
	br.Reset(nil)
	readerPool.Put(br)
}

func getWriter(w io.Writer) *bufio.Writer {
	bw := writerPool.Get().(*bufio.Writer)
	bw.Reset(w)
	return bw
}

func putWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	writerPool.Put(bw)
}
