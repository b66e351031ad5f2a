package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The identity headers: which exit carried a request or tunnel, and the address sites saw.
const (
	HeaderEgressProxy = "X-Egress-Proxy"
	HeaderEgressIP    = "X-Egress-IP"
)

// serveHTTPConn reads requests from one client connection: CONNECT turns the connection
// into a tunnel, an absolute-URI request is forwarded through an exit and the connection
// kept alive for the next.
func (g *Gateway) serveHTTPConn(cc *clientConn) {
	lr := &io.LimitedReader{R: cc.c}
	br := getReader(lr)
	bw := getWriter(cc.c)
	defer putWriter(bw)
	defer putReader(br)
	for first := true; ; first = false {
		wait := g.cfg.IdleTimeout
		if first {
			wait = g.cfg.HeaderTimeout
		}
		cc.c.SetReadDeadline(time.Now().Add(wait))
		cc.idle.Store(true)
		if g.draining.Load() {
			return
		}
		lr.N = int64(g.cfg.MaxHeaderBytes)
		_, err := br.Peek(1)
		cc.idle.Store(false)
		if err != nil {
			if first && isTimeout(err) && !g.draining.Load() {
				g.refuseHTTP(bw, refusal{status: http.StatusRequestTimeout, outcome: outcomeBadRequest,
					msg: fmt.Sprintf("no request arrived within %s", g.cfg.HeaderTimeout)})
			}
			return
		}
		cc.c.SetReadDeadline(time.Now().Add(g.cfg.HeaderTimeout))
		req, err := http.ReadRequest(br)
		if err != nil {
			g.refuseBadHeader(bw, lr, err)
			return
		}
		lr.N = math.MaxInt64
		cc.c.SetReadDeadline(time.Time{})
		if req.Method == http.MethodConnect {
			g.handleConnect(cc, br, bw, req)
			return
		}
		if !g.handleForward(cc, br, bw, req) {
			return
		}
	}
}

func (g *Gateway) refuseBadHeader(bw *bufio.Writer, lr *io.LimitedReader, err error) {
	var r refusal
	switch {
	case lr.N <= 0:
		r = refusal{status: http.StatusRequestHeaderFieldsTooLarge, msg: fmt.Sprintf("the request header is larger than %d bytes", g.cfg.MaxHeaderBytes)}
	case isTimeout(err):
		r = refusal{status: http.StatusRequestTimeout, msg: fmt.Sprintf("the request header did not end within %s", g.cfg.HeaderTimeout)}
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		g.metrics.requests.WithLabelValues("", "", outcomeBadRequest).Inc()
		return // the client went away
	default:
		r = refusal{status: http.StatusBadRequest, msg: "malformed request: " + err.Error()}
	}
	r.outcome = outcomeBadRequest
	g.metrics.requests.WithLabelValues("", "", outcomeBadRequest).Inc()
	g.refuseHTTP(bw, r)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// admit authenticates a request and builds its route; on a refusal it has answered.
func (g *Gateway) admit(bw *bufio.Writer, req *http.Request, target, kind string) *route {
	user, password, r := proxyCredentials(req.Header)
	if r == nil {
		var id Identity
		var opts Options
		id, opts, r = g.authenticate(req.Context(), user, password)
		if r == nil {
			return newRoute(id, opts, target)
		}
		g.count(kind, opts.Namespace, opts.Pool, r.outcome)
	} else {
		g.count(kind, "", "", r.outcome)
	}
	g.refuseHTTP(bw, *r)
	return nil
}

// handleConnect opens a tunnel through an exit and pumps bytes until both sides close.
func (g *Gateway) handleConnect(cc *clientConn, br *bufio.Reader, bw *bufio.Writer, req *http.Request) {
	target := req.Host
	if host, port, err := net.SplitHostPort(target); err != nil || host == "" || port == "" {
		g.count(kindTunnel, "", "", outcomeBadRequest)
		g.refuseHTTP(bw, refusal{status: http.StatusBadRequest, msg: fmt.Sprintf("CONNECT needs host:port, not %q", target)})
		return
	}
	rt := g.admit(bw, req, target, kindTunnel)
	if rt == nil {
		return
	}
	exitConn, exit, rest, err := g.openTunnel(context.Background(), rt, client{cc.c, br})
	if err != nil {
		r := refuseChoice(rt, err)
		g.count(kindTunnel, rt.namespace, rt.pool, r.outcome)
		g.refuseHTTP(bw, r)
		return
	}
	// Counted before the client can see the answer, so that whoever it tells finds the
	// count already there.
	g.count(kindTunnel, rt.namespace, rt.pool, rt.outcome())
	bw.WriteString("HTTP/1.1 200 Connection established\r\n")
	writeIdentity(bw, exit)
	bw.WriteString("\r\n")
	if err := bw.Flush(); err != nil {
		exitConn.Close()
		return
	}
	var early []byte
	if n := br.Buffered(); n > 0 {
		p, _ := br.Peek(n)
		early = append([]byte(nil), p...)
	}
	cc.tunneled = true
	g.startTunnel(cc.c, exitConn, early, rest, rt, exit)
}

func writeIdentity(bw *bufio.Writer, exit Exit) {
	bw.WriteString(HeaderEgressProxy + ": " + exit.ID() + "\r\n")
	if exit.EgressIP != "" {
		bw.WriteString(HeaderEgressIP + ": " + exit.EgressIP + "\r\n")
	}
}

// outcome is ok, or retried when the route needed more than one exit.
func (rt *route) outcome() string {
	if rt.tried > 1 {
		return outcomeRetried
	}
	return outcomeOK
}

// handleForward sends one absolute-URI request through an exit and writes its response.
// It reports whether the client connection may carry another request.
func (g *Gateway) handleForward(cc *clientConn, br *bufio.Reader, bw *bufio.Writer, req *http.Request) bool {
	if req.URL.Scheme != "http" || req.URL.Host == "" {
		g.count(kindRequest, "", "", outcomeBadRequest)
		g.refuseHTTP(bw, refusal{status: http.StatusBadRequest,
			msg: fmt.Sprintf("this is a proxy: send absolute http:// URLs (GET http://host/path) or CONNECT host:port, not %s %s", req.Method, req.RequestURI)})
		return false
	}
	rt := g.admit(bw, req, canonicalAddr(req.URL.Host), kindRequest)
	if rt == nil {
		return false
	}
	clientClose := req.Close
	prepareOutgoing(req)
	if req.Header.Get("Expect") == "100-continue" {
		req.Header.Del("Expect")
		bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		bw.Flush()
	}
	// Only a request without a body can be sent again: the gateway keeps no copy of one.
	retryable := req.Body == nil || req.Body == http.NoBody
	var up *countingBody
	if !retryable {
		up = &countingBody{ReadCloser: req.Body}
		req.Body = up
	}
	ctx := context.Background()
	for {
		exit, err := g.chooseFor(ctx, rt, client{cc.c, br})
		if err != nil {
			r := refuseChoice(rt, err)
			g.count(kindRequest, rt.namespace, rt.pool, r.outcome)
			g.refuseHTTP(bw, r)
			return false
		}
		rt.tried++
		resp, err := g.transport.RoundTrip(req, exit)
		if err == nil && ExitGenerated(resp) {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			resp, err = nil, fmt.Errorf("%w: %s answered %s itself", ErrExitFailed, exit.Address, resp.Status)
		}
		if err != nil {
			if !errors.Is(err, ErrExitFailed) {
				err = fmt.Errorf("%w: %w", ErrExitFailed, err)
			}
			ferr := g.failed(rt, exit, err)
			if ferr == nil && !retryable {
				ferr = fmt.Errorf("%w (exit %s; a request with a body is not sent again)", err, exit.ID())
			}
			if ferr != nil {
				r := refuseChoice(rt, ferr)
				g.count(kindRequest, rt.namespace, rt.pool, r.outcome)
				g.refuseHTTP(bw, r)
				return false
			}
			continue
		}
		g.noteBan(rt, exit, resp)
		g.count(kindRequest, rt.namespace, rt.pool, rt.outcome()) // before the client sees the answer
		keep := g.writeResponse(bw, req, resp, exit, rt, clientClose || g.draining.Load())
		if up != nil {
			g.metrics.bytes.WithLabelValues(rt.namespace, rt.pool, directionUp).Add(float64(up.n))
		}
		return keep
	}
}

// writeResponse writes the exit's response with the identity headers and reports whether
// the connection stays open.
func (g *Gateway) writeResponse(bw *bufio.Writer, req *http.Request, resp *http.Response, exit Exit, rt *route, closeAfter bool) bool {
	removeHopByHop(resp.Header)
	resp.Header.Set(HeaderEgressProxy, exit.ID())
	if exit.EgressIP != "" {
		resp.Header.Set(HeaderEgressIP, exit.EgressIP)
	}
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	resp.Request = req
	resp.Close = closeAfter
	if resp.ContentLength < 0 && !isChunked(resp.TransferEncoding) {
		resp.Close = true // the body ends where the connection does
	}
	down := &countingBody{ReadCloser: resp.Body}
	resp.Body = down
	err := resp.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	down.Close()
	g.metrics.bytes.WithLabelValues(rt.namespace, rt.pool, directionDown).Add(float64(down.n))
	return err == nil && !resp.Close
}

func isChunked(te []string) bool { return len(te) > 0 && te[0] == "chunked" }

// noteBan tells the Reporter of a site status that means banned or throttled.
func (g *Gateway) noteBan(rt *route, exit Exit, resp *http.Response) {
	for _, s := range g.cfg.BanStatuses {
		if resp.StatusCode != s {
			continue
		}
		retryAfter := parseRetryAfter(resp.Header.Get("Retry-After"))
		if s == http.StatusTooManyRequests && retryAfter == 0 {
			return
		}
		g.cfg.Reporter.Banned(exit, rt.site, resp.StatusCode, retryAfter)
		return
	}
}

func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil && secs > 0 {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}

// ExitGenerated tells an exit proxy's own failure from a site's answer it relays. The
// rule: a 407 (a site never asks for proxy credentials, so this is the exit refusing the
// credentials the gateway sent it), or a 5xx status that carries the exit software's own
// mark and not a relay's: tinyproxy's own error pages have "Server: tinyproxy/..." and no
// Via header (a site's answer relayed by tinyproxy has its Via), squid's have
// X-Squid-Error.
func ExitGenerated(resp *http.Response) bool {
	if resp.StatusCode == http.StatusProxyAuthRequired {
		return true
	}
	if resp.StatusCode < 500 || resp.StatusCode > 599 {
		return false
	}
	if resp.Header.Get("X-Squid-Error") != "" {
		return true
	}
	return strings.HasPrefix(strings.ToLower(resp.Header.Get("Server")), "tinyproxy/") && resp.Header.Get("Via") == ""
}

// hopByHop are the headers of one connection (RFC 9110 section 7.6.1), never forwarded;
// the client's Proxy-Authorization is the gateway's, never the exit's.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// prepareOutgoing turns a request the client sent to the gateway into one for the exit.
func prepareOutgoing(req *http.Request) {
	removeHopByHop(req.Header)
	req.RequestURI = ""
	req.Close = false
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = nil // the transport adds none of its own
	}
}

// canonicalAddr is host:port with the scheme's default port.
func canonicalAddr(host string) string {
	if _, _, err := net.SplitHostPort(host); err == nil {
		return host
	}
	return net.JoinHostPort(strings.Trim(host, "[]"), "80")
}

// refuseHTTP answers a request the gateway will not carry and closes the connection after.
func (g *Gateway) refuseHTTP(bw *bufio.Writer, r refusal) {
	body := r.msg + "\n"
	fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n",
		r.status, http.StatusText(r.status), len(body))
	if r.status == http.StatusProxyAuthRequired {
		fmt.Fprintf(bw, "Proxy-Authenticate: Basic realm=%q\r\n", g.cfg.Realm)
	}
	if r.retryAfter > 0 {
		fmt.Fprintf(bw, "Retry-After: %d\r\n", int((r.retryAfter+time.Second-1)/time.Second))
	}
	if r.exit != "" {
		bw.WriteString(HeaderEgressProxy + ": " + r.exit + "\r\n")
	}
	bw.WriteString("\r\n")
	bw.WriteString(body)
	bw.Flush()
}

// countingBody counts the bytes read through it.
type countingBody struct {
	io.ReadCloser
	n int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n += int64(n)
	return n, err
}
