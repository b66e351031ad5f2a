package client

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/publicsuffix"
)

// TransportConfig configures a Transport. The zero value works.
type TransportConfig struct {
	// Base carries the requests to the proxies; it is cloned and its Proxy replaced.
	// nil: a clone of http.DefaultTransport.
	Base *http.Transport
	// Query filters the proxies picked (LabelSelector, Namespace, Pool); the Transport
	// sets Domain to each request's host, and Credentials when the Client has a token.
	Query Query
	// BanStatus are the site's answers reported as banned (default 403); ThrottleStatus
	// those reported as throttled, with their Retry-After (default 429). Other 2xx
	// answers are reported ok.
	BanStatus      []int
	ThrottleStatus []int
	// MaxBanRetries is how many other proxies a banned request is sent through before its
	// ban answer is returned (default 2; -1: none). A request whose body cannot be read
	// again (no GetBody) is not retried.
	MaxBanRetries int
	// FlushInterval is how often reports are sent (default 1 s); FlushSize sends them
	// sooner, once that many are waiting (default 500).
	FlushInterval time.Duration
	FlushSize     int
	// BanMemory is how long the Transport itself avoids a proxy for a host after the host
	// banned it (default 30 s): until discovery's answers leave the proxy out (about two
	// seconds after the report), a fast crawl would otherwise keep being handed it.
	BanMemory time.Duration
	// MaxProxyRetries is how many other proxies a request is sent through when the proxy
	// itself did not answer (default 2; -1: none): its connection was refused, reset or
	// timed out before the proxy answered anything (an error dialling it, during its
	// CONNECT, or, for an http:// URL, which the proxy fetches itself, before the first
	// byte of its answer). Such a proxy is reported unreachable, and each retry asks
	// pick?exclude= with every proxy the request already tried, never the same one twice;
	// when they all failed, the error names them. A proxy answering a CONNECT with
	// anything but 200 also sends the request to another proxy, unreported (it answered).
	// A failure after the proxy answered (a site behind a working proxy resetting an
	// https:// connection, a body cut short) is the site's and is returned as it is. Only
	// requests safe to send again are retried: no body, or one GetBody reads again
	// (http.NewRequest sets it for bytes, strings and bytes.Buffer readers); the others
	// get the first failure, reported all the same.
	MaxProxyRetries int
	// UnreachableMemory is how long the Transport itself avoids, for every host, a proxy
	// that did not answer (default 10 s), until discovery's answers leave it out (about a
	// second after the report, which is sent at once).
	UnreachableMemory time.Duration
	// Spread is how a site's requests are spread over proxies; the zero value keeps a
	// whole site on one proxy (pick?domain=, the site is the key).
	Spread Spread
	// OnFeedbackError receives what went wrong sending reports: an error, or reports the
	// API rejected. nil: dropped.
	OnFeedbackError func(error)
}

// Stats counts what a Transport did.
type Stats struct {
	// Requests is how many requests RoundTrip was given; Attempts how many it sent
	// through a proxy; Retries the attempts after a ban; ProxyRetries the attempts after
	// a proxy did not answer (or refused a CONNECT).
	Requests, Attempts, Retries, ProxyRetries int64
	// Unreachable counts the attempts whose proxy did not answer, each reported
	// unreachable.
	Unreachable int64
	// Banned, Throttled and OK count the site's answers by outcome.
	Banned, Throttled, OK int64
	// Reported is how many reports the API accepted; Rejected how many it refused or
	// could not be sent.
	Reported, Rejected int64
}

// Transport is an http.RoundTripper that sends each request through a proxy picked for
// its host (pick?domain=<host>, with &credentials=true when the Client has a token), reports the site's answer as feedback
// and sends a banned request again through another proxy; a proxy that does not answer
// is reported unreachable and the request goes through another (MaxProxyRetries). Hosts that name no site (IP
// addresses, localhost) get a proxy picked by the host as key, and no reports. Close it
// to send the last reports.
type Transport struct {
	c        *Client
	cfg      TransportConfig
	base     *http.Transport
	ban      []int
	throttle []int
	maxRetry int
	maxProxy int
	stats    [stCount]atomic.Int64
	// noExclude is set once discovery refused ?exclude= (a server older than it): the
	// Transport then chooses another proxy from the list itself.
	noExclude atomic.Bool
	mu        sync.Mutex
	pending   []Report
	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	startOnce sync.Once
	closeOnce sync.Once
	closed    atomic.Bool
	// recent holds the proxies banned lately, by host: ref -> until when they are avoided.
	// recentOps counts the look-ups and additions since the last sweep of all of it.
	recentMu  sync.Mutex
	recent    map[string]map[string]time.Time
	recentOps int
	// now is the ban memory's clock (time.Now when nil); tests move it.
	now func() time.Time
}

// minSweepOps is the fewest look-ups and additions of the ban memory between two sweeps
// of all of it: a sweep costs one step per host held, and comes at most once per as many
// operations as hosts held (and never sooner than this), so its cost per operation stays
// constant however many hosts a broad crawl has seen banning.
const minSweepOps = 256

const (
	stRequests = iota
	stAttempts
	stRetries
	stBanned
	stThrottled
	stOK
	stReported
	stRejected
	stProxyRetries
	stUnreachable
	stCount
)

// anyHost holds, in the avoided proxies' memory, those avoided for every host: the ones
// that did not answer.
const anyHost = "\x00any"

type proxyKey struct{}

// Transport returns a Transport that picks proxies with c.
func (c *Client) Transport(cfg TransportConfig) *Transport {
	var base *http.Transport
	if cfg.Base != nil {
		base = cfg.Base.Clone()
	} else {
		base = http.DefaultTransport.(*http.Transport).Clone()
	}
	base.Proxy = func(r *http.Request) (*url.URL, error) {
		u, _ := r.Context().Value(proxyKey{}).(*url.URL)
		return u, nil
	}
	t := &Transport{c: c, cfg: cfg, base: base, ban: cfg.BanStatus, throttle: cfg.ThrottleStatus,
		maxRetry: cfg.MaxBanRetries, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if t.ban == nil {
		t.ban = []int{http.StatusForbidden}
	}
	if t.throttle == nil {
		t.throttle = []int{http.StatusTooManyRequests}
	}
	switch {
	case t.maxRetry == 0:
		t.maxRetry = 2
	case t.maxRetry < 0:
		t.maxRetry = 0
	}
	switch t.maxProxy = cfg.MaxProxyRetries; {
	case t.maxProxy == 0:
		t.maxProxy = 2
	case t.maxProxy < 0:
		t.maxProxy = 0
	}
	if t.cfg.UnreachableMemory <= 0 {
		t.cfg.UnreachableMemory = 10 * time.Second
	}
	userHook := base.OnProxyConnectResponse
	base.OnProxyConnectResponse = func(ctx context.Context, proxyURL *url.URL, connectReq *http.Request, res *http.Response) error {
		if a, ok := ctx.Value(attemptKey{}).(*attemptState); ok {
			a.connectStatus.Store(int32(res.StatusCode))
		}
		if userHook != nil {
			return userHook(ctx, proxyURL, connectReq, res)
		}
		return nil
	}
	if t.cfg.FlushInterval <= 0 {
		t.cfg.FlushInterval = time.Second
	}
	if t.cfg.BanMemory <= 0 {
		t.cfg.BanMemory = 30 * time.Second
	}
	if t.cfg.FlushSize <= 0 {
		t.cfg.FlushSize = 500
	}
	return t
}

// Stats returns the counts so far.
func (t *Transport) Stats() Stats {
	return Stats{Requests: t.stats[stRequests].Load(), Attempts: t.stats[stAttempts].Load(), Retries: t.stats[stRetries].Load(),
		Banned: t.stats[stBanned].Load(), Throttled: t.stats[stThrottled].Load(), OK: t.stats[stOK].Load(),
		Reported: t.stats[stReported].Load(), Rejected: t.stats[stRejected].Load(),
		ProxyRetries: t.stats[stProxyRetries].Load(), Unreachable: t.stats[stUnreachable].Load()}
}

// RoundTrip sends req through a proxy picked for its host. An error picking a proxy names
// the request's URL and the API's answer (a saturated site: an *Error with status 503 and
// its RetryAfter); an error after every proxy tried failed to answer names them all.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.stats[stRequests].Add(1)
	ctx := req.Context()
	host := req.URL.Hostname()
	domain := host
	site, err := publicsuffix.EffectiveTLDPlusOne(host)
	if err != nil || net.ParseIP(host) != nil {
		domain, site = "", "" // no site to report about or to filter by
	}
	q := t.cfg.Query
	q.Domain, q.Credentials, q.Key, q.Exclude = domain, t.c.hasToken(), "", nil
	if domain == "" {
		q.Key = host
	} else {
		q.Key = t.cfg.Spread.key(site, req.URL)
	}
	rewindable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	var tried []string
	bans, failures := 0, 0
	px, err := t.first(ctx, q, host, t.avoided(domain))
	for {
		if err != nil {
			return nil, fmt.Errorf("egress proxy for %s %s: %w", req.Method, req.URL.Redacted(), err)
		}
		res, failure, err := t.send(req, px, len(tried))
		tried = append(tried, px.Ref())
		if err != nil {
			if failure == "" {
				return nil, err // the site's failure, or the caller's deadline
			}
			if failure == proxyUnreachable {
				t.stats[stUnreachable].Add(1)
				t.report(Report{Proxy: px.Ref(), Outcome: Unreachable})
				t.rememberFor(anyHost, px.Ref(), t.cfg.UnreachableMemory)
			}
			switch {
			case !rewindable:
				return nil, fmt.Errorf("%w (not sent through another proxy: its body cannot be read again, it has no GetBody)", err)
			case failures >= t.maxProxy:
				return nil, fmt.Errorf("%w (egress proxies tried: %s)", err, strings.Join(tried, ", "))
			}
			next, nerr := t.next(ctx, q, host, append(slices.Clone(tried), t.avoided(domain)...))
			if nerr != nil {
				return nil, fmt.Errorf("%w (egress proxies tried: %s; no other: %v)", err, strings.Join(tried, ", "), nerr)
			}
			failures++
			t.stats[stProxyRetries].Add(1)
			px = next
			continue
		}
		outcome, wait := t.classify(res)
		if outcome == "" || domain == "" {
			return res, nil
		}
		t.report(Report{Proxy: px.Ref(), Domain: domain, Outcome: outcome, RetryAfter: wait})
		if outcome != Banned {
			return res, nil
		}
		t.remember(domain, px.Ref())
		if bans >= t.maxRetry || !rewindable {
			return res, nil
		}
		next, nerr := t.next(ctx, q, host, append(slices.Clone(tried), t.avoided(domain)...))
		if nerr != nil {
			return res, nil // no other proxy to try: the site's answer stands
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
		res.Body.Close()
		bans++
		t.stats[stRetries].Add(1)
		px = next
	}
}

// first is the proxy for a request: the pick, leaving out the proxies avoided for its
// host when there are any (and the pick alone when that leaves none).
func (t *Transport) first(ctx context.Context, q Query, host string, avoid []string) (Proxy, error) {
	if len(avoid) > 0 {
		if p, err := t.next(ctx, q, host, avoid); err == nil {
			return p, nil
		}
	}
	return t.c.Pick(ctx, q)
}

// next is the proxy for a request that leaves out those in avoid: pick?exclude=, the next
// proxy in the pick's own rendezvous order; from a discovery API that does not know
// exclude= yet, one of the listed proxies in an order of the host's own.
func (t *Transport) next(ctx context.Context, q Query, host string, avoid []string) (Proxy, error) {
	if !t.noExclude.Load() {
		q.Exclude = nil
		for _, ref := range avoid { // the proxies tried come first
			if len(q.Exclude) == maxExclude {
				break
			}
			if !slices.Contains(q.Exclude, ref) {
				q.Exclude = append(q.Exclude, ref)
			}
		}
		p, err := t.c.Pick(ctx, q)
		var ae *Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Parameter != "exclude" {
			return p, err
		}
		t.noExclude.Store(true)
	}
	return t.another(ctx, q, host, avoid)
}

// maxExclude is the most proxies a pick's exclude= takes: the proxies the request tried
// are sent, then as many of those the Transport avoids for its host as fit.
const maxExclude = 100

// Why an attempt failed, when the proxy is to blame.
const (
	// proxyUnreachable: the proxy did not answer at all.
	proxyUnreachable = "unreachable"
	// proxyRefusedConnect: the proxy answered a CONNECT with another status than 200.
	proxyRefusedConnect = "connect-refused"
)

// attemptState is what one attempt learnt of its proxy on the way.
type attemptState struct {
	// answered: a byte of the answer came back (through a tunnel already open, too).
	answered atomic.Bool
	// connectStatus is the status the proxy answered this attempt's CONNECT; 0: none.
	connectStatus atomic.Int32
}

type attemptKey struct{}

// send is one attempt through px. failure says whether an error is the proxy's: "" for
// none (an answer, the site's failure behind a proxy that answered, the caller's context
// done), proxyUnreachable or proxyRefusedConnect.
func (t *Transport) send(req *http.Request, px Proxy, attempt int) (*http.Response, string, error) {
	pu, err := url.Parse(px.URL)
	if err != nil {
		return nil, "", fmt.Errorf("egress proxy %s for %s %s: its url does not parse: %w", px.Ref(), req.Method, req.URL.Redacted(), err)
	}
	st := &attemptState{}
	tunnel := req.URL.Scheme == "https"
	ctx := context.WithValue(context.WithValue(req.Context(), proxyKey{}, pu), attemptKey{}, st)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) {
			if i.Reused && tunnel {
				st.answered.Store(true) // the tunnel was open before: a failure now is inside it
			}
		},
		GotFirstResponseByte: func() { st.answered.Store(true) },
	})
	out := req.Clone(ctx)
	if attempt > 0 && req.GetBody != nil {
		if out.Body, err = req.GetBody(); err != nil {
			return nil, "", fmt.Errorf("%s %s: reading the body again to retry it: %w", req.Method, req.URL.Redacted(), err)
		}
	}
	t.stats[stAttempts].Add(1)
	res, err := t.base.RoundTrip(out)
	if err != nil {
		return nil, proxyFailure(req.Context(), st, err), fmt.Errorf("%s %s through egress proxy %s: %w", req.Method, req.URL.Redacted(), px.Ref(), err)
	}
	return res, "", nil
}

// proxyFailure says whether err, an attempt's failure, is its proxy's: a connection
// failure (refused, reset, closed, timed out) before the proxy answered anything and
// before a tunnel through it was open, or a CONNECT it refused.
func proxyFailure(ctx context.Context, st *attemptState, err error) string {
	if ctx.Err() != nil {
		return "" // the caller gave up
	}
	switch cs := st.connectStatus.Load(); {
	case cs != 0 && cs != http.StatusOK:
		return proxyRefusedConnect
	case cs == http.StatusOK || st.answered.Load():
		return "" // the proxy answered; what failed was behind it
	}
	var op *net.OpError
	if errors.As(err, &op) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) {
		return proxyUnreachable
	}
	return "" // not a connection's failure (a request Go refuses to send, say)
}

// maxReportedRetryAfter is the longest throttle a report carries, the API's limit for
// retryAfterSeconds: a site's longer Retry-After is reported as this, not refused.
const maxReportedRetryAfter = 24 * time.Hour

// classify maps the site's answer to an outcome ("" for none) and a throttle's wait.
func (t *Transport) classify(res *http.Response) (Outcome, time.Duration) {
	switch {
	case slices.Contains(t.ban, res.StatusCode):
		t.stats[stBanned].Add(1)
		return Banned, 0
	case slices.Contains(t.throttle, res.StatusCode):
		t.stats[stThrottled].Add(1)
		return Throttled, min(retryAfter(res.Header), maxReportedRetryAfter)
	case res.StatusCode >= 200 && res.StatusCode < 300:
		t.stats[stOK].Add(1)
		return OK, 0
	}
	return "", 0
}

// another is a proxy for the request's domain that is not in avoid, for a discovery API
// that does not take exclude=: the listed proxies in an order of their own for the host,
// so that retries of one host spread the same way on every crawler.
func (t *Transport) another(ctx context.Context, q Query, host string, avoid []string) (Proxy, error) {
	q.Key, q.Exclude = "", nil
	list, err := t.c.List(ctx, q)
	if err != nil {
		return Proxy{}, err
	}
	rank := func(p Proxy) uint64 {
		h := fnv.New64a()
		_, _ = io.WriteString(h, host+"\x00"+p.Ref())
		return h.Sum64()
	}
	sort.Slice(list, func(i, j int) bool { return rank(list[i]) > rank(list[j]) })
	for _, p := range list {
		if !slices.Contains(avoid, p.Ref()) {
			return p, nil
		}
	}
	return Proxy{}, fmt.Errorf("none of the %d proxies listed for %s is left", len(list), host)
}

// remember avoids ref for host for BanMemory.
func (t *Transport) remember(host, ref string) { t.rememberFor(host, ref, t.cfg.BanMemory) }

// rememberFor avoids ref for host (anyHost: every host) for d.
func (t *Transport) rememberFor(host, ref string, d time.Duration) {
	t.recentMu.Lock()
	defer t.recentMu.Unlock()
	if t.recent == nil {
		t.recent = map[string]map[string]time.Time{}
	}
	if t.recent[host] == nil {
		t.recent[host] = map[string]time.Time{}
	}
	now := t.clock()
	t.recent[host][ref] = now.Add(d)
	t.sweepLocked(now)
}

func (t *Transport) clock() time.Time {
	if t.now != nil {
		return t.now()
	}
	return time.Now()
}

// sweepLocked forgets the expired entries of every host, when enough operations have
// passed since the last sweep, so that the hosts a crawl does not ask again are not
// kept for the Transport's life.
func (t *Transport) sweepLocked(now time.Time) {
	t.recentOps++
	if t.recentOps < max(minSweepOps, len(t.recent)) {
		return
	}
	t.recentOps = 0
	for host, refs := range t.recent {
		for ref, until := range refs {
			if !now.Before(until) {
				delete(refs, ref)
			}
		}
		if len(refs) == 0 {
			delete(t.recent, host)
		}
	}
}

// avoided are the proxies host banned within BanMemory, and those that did not answer
// within UnreachableMemory.
func (t *Transport) avoided(host string) []string {
	t.recentMu.Lock()
	defer t.recentMu.Unlock()
	var refs []string
	now := t.clock()
	for _, h := range []string{host, anyHost} {
		if h == "" || t.recent[h] == nil {
			continue
		}
		for ref, until := range t.recent[h] {
			if now.Before(until) {
				refs = append(refs, ref)
			} else {
				delete(t.recent[h], ref)
			}
		}
		if len(t.recent[h]) == 0 {
			delete(t.recent, h)
		}
	}
	t.sweepLocked(now)
	return refs
}

// report queues r for the next flush; an Unreachable report sends the batch at once.
func (t *Transport) report(r Report) {
	if t.closed.Load() {
		return
	}
	t.startOnce.Do(func() { go t.flushLoop() })
	t.mu.Lock()
	t.pending = append(t.pending, r)
	full := len(t.pending) >= t.cfg.FlushSize
	t.mu.Unlock()
	if full || r.Outcome == Unreachable { // a proxy that does not answer is news at once
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

func (t *Transport) flushLoop() {
	defer close(t.done)
	tick := time.NewTicker(t.cfg.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-t.kick:
		case <-t.stop: // the last flush gets a while, then gives up
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			t.flush(ctx)
			return
		}
		t.flush(context.Background())
	}
}

// flush sends the reports waiting now and hands what went wrong to OnFeedbackError.
func (t *Transport) flush(ctx context.Context) {
	t.mu.Lock()
	batch := t.pending
	t.pending = nil
	t.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	res, err := t.c.Feedback(ctx, batch)
	t.stats[stReported].Add(int64(res.Accepted))
	t.stats[stRejected].Add(int64(len(batch) - res.Accepted))
	if t.cfg.OnFeedbackError == nil {
		return
	}
	if err != nil {
		t.cfg.OnFeedbackError(fmt.Errorf("sending %d reports: %w", len(batch), err))
	}
	if len(res.Rejected) > 0 {
		msgs := make([]string, 0, len(res.Rejected))
		for _, r := range res.Rejected {
			msgs = append(msgs, fmt.Sprintf("report %d (proxy %s): %s", r.Index, r.Proxy, r.Error))
		}
		t.cfg.OnFeedbackError(errors.New("discovery rejected reports: " + strings.Join(msgs, "; ")))
	}
}

// Close sends the reports still waiting (trying for at most 30 s) and stops the
// Transport's sender; requests after Close are still carried, their reports dropped.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.closed.Store(true)
		t.startOnce.Do(func() { close(t.done) }) // never started: nothing to send
		close(t.stop)
		t.base.CloseIdleConnections()
	})
	<-t.done
	return nil
}

// Spread is how a site's requests are spread over proxies. pick?domain= keys a request by
// its site, so a whole site goes through one proxy (the same one on every crawler): kind
// to the site, but one proxy's rate and one address for all of it. A Spread derives the
// pick key from the site and a spread index instead, and the Transport still sends
// domain=, so the proxies cooling for the site stay out. The zero value: one proxy a site.
type Spread struct {
	// Keys spreads a site over up to Keys proxies: a request's key is "<site>#<i>", i a
	// hash of its path and query modulo Keys, so a page always goes the same way. 0 or 1:
	// one key a site.
	Keys int
	// Worker, when set, is this crawler's own name (its Pod's, say): the key is then
	// "<site>@<worker>", so each worker crawls a site through a proxy of its own (with
	// Keys, "<site>@<worker>#<i>").
	Worker string
	// PerRequest keys each request by a hash of its URL ("<site>#u<hash>"): a site's pages
	// spread over every proxy evenly, each page always the same way. Keys is then ignored.
	PerRequest bool
}

// key is the pick key of a request for site at u; "": the site itself (domain= alone).
func (s Spread) key(site string, u *url.URL) string {
	k := site
	if s.Worker != "" {
		k += "@" + s.Worker
	}
	switch {
	case s.PerRequest:
		h := fnv.New64a()
		_, _ = io.WriteString(h, u.Scheme+"://"+u.Host+u.RequestURI())
		return k + "#u" + strconv.FormatUint(h.Sum64(), 36)
	case s.Keys > 1:
		h := fnv.New32a()
		_, _ = io.WriteString(h, u.RequestURI())
		return k + "#" + strconv.Itoa(int(h.Sum32()%uint32(s.Keys)))
	case s.Worker != "":
		return k
	}
	return ""
}
