package client

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
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
	// OnFeedbackError receives what went wrong sending reports: an error, or reports the
	// API rejected. nil: dropped.
	OnFeedbackError func(error)
}

// Stats counts what a Transport did.
type Stats struct {
	// Requests is how many requests RoundTrip was given; Attempts how many it sent
	// through a proxy; Retries the attempts after a ban.
	Requests, Attempts, Retries int64
	// Banned, Throttled and OK count the site's answers by outcome.
	Banned, Throttled, OK int64
	// Reported is how many reports the API accepted; Rejected how many it refused or
	// could not be sent.
	Reported, Rejected int64
}

// Transport is an http.RoundTripper that sends each request through a proxy picked for
// its host (pick?domain=<host>, with &credentials=true when the Client has a token), reports the site's answer as feedback
// and sends a banned request again through another proxy. Hosts that name no site (IP
// addresses, localhost) get a proxy picked by the host as key, and no reports. Close it
// to send the last reports.
type Transport struct {
	c         *Client
	cfg       TransportConfig
	base      *http.Transport
	ban       []int
	throttle  []int
	maxRetry  int
	stats     [8]atomic.Int64
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
)

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
		Reported: t.stats[stReported].Load(), Rejected: t.stats[stRejected].Load()}
}

// RoundTrip sends req through a proxy picked for its host. An error picking a proxy names
// the request's URL and the API's answer (a saturated site: an *Error with status 503 and
// its RetryAfter).
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.stats[stRequests].Add(1)
	host := req.URL.Hostname()
	domain := host
	if _, err := publicsuffix.EffectiveTLDPlusOne(host); err != nil || net.ParseIP(host) != nil {
		domain = "" // no site to report about or to filter by
	}
	q := t.cfg.Query
	q.Domain, q.Credentials, q.Key = domain, t.c.hasToken(), ""
	if domain == "" {
		q.Key = host
	}
	rewindable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	var tried []string
	px, err := t.c.Pick(req.Context(), q)
	if avoid := t.avoided(domain); err == nil && slices.Contains(avoid, px.Ref()) {
		if alt, ok := t.another(req.Context(), q, host, avoid); ok {
			px = alt
		}
	}
	for attempt := 0; ; attempt++ {
		if err != nil {
			return nil, fmt.Errorf("egress proxy for %s %s: %w", req.Method, req.URL.Redacted(), err)
		}
		res, err := t.send(req, px, attempt)
		if err != nil {
			return nil, err
		}
		tried = append(tried, px.Ref())
		outcome, wait := t.classify(res)
		if outcome == "" || domain == "" {
			return res, nil
		}
		t.report(Report{Proxy: px.Ref(), Domain: domain, Outcome: outcome, RetryAfter: wait})
		if outcome != Banned {
			return res, nil
		}
		t.remember(domain, px.Ref())
		if attempt >= t.maxRetry || !rewindable {
			return res, nil
		}
		next, ok := t.another(req.Context(), q, host, append(tried, t.avoided(domain)...))
		if !ok {
			return res, nil // no other proxy to try: the site's answer stands
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
		res.Body.Close()
		t.stats[stRetries].Add(1)
		px = next
	}
}

// send is one attempt through px.
func (t *Transport) send(req *http.Request, px Proxy, attempt int) (*http.Response, error) {
	pu, err := url.Parse(px.URL)
	if err != nil {
		return nil, fmt.Errorf("egress proxy %s for %s %s: its url does not parse: %w", px.Ref(), req.Method, req.URL.Redacted(), err)
	}
	out := req.Clone(context.WithValue(req.Context(), proxyKey{}, pu))
	if attempt > 0 && req.GetBody != nil {
		if out.Body, err = req.GetBody(); err != nil {
			return nil, fmt.Errorf("%s %s: reading the body again to retry it: %w", req.Method, req.URL.Redacted(), err)
		}
	}
	t.stats[stAttempts].Add(1)
	res, err := t.base.RoundTrip(out)
	if err != nil {
		return nil, fmt.Errorf("%s %s through egress proxy %s: %w", req.Method, req.URL.Redacted(), px.Ref(), err)
	}
	return res, nil
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

// another is a proxy for the request's domain that it has not been sent through yet: the
// listed proxies in an order of their own for the host, so that retries of one host spread
// the same way on every crawler.
func (t *Transport) another(ctx context.Context, q Query, host string, tried []string) (Proxy, bool) {
	q.Key = ""
	list, err := t.c.List(ctx, q)
	if err != nil {
		return Proxy{}, false
	}
	rank := func(p Proxy) uint64 {
		h := fnv.New64a()
		_, _ = io.WriteString(h, host+"\x00"+p.Ref())
		return h.Sum64()
	}
	sort.Slice(list, func(i, j int) bool { return rank(list[i]) > rank(list[j]) })
	for _, p := range list {
		if !slices.Contains(tried, p.Ref()) {
			return p, true
		}
	}
	return Proxy{}, false
}

// remember avoids ref for host for BanMemory.
func (t *Transport) remember(host, ref string) {
	t.recentMu.Lock()
	defer t.recentMu.Unlock()
	if t.recent == nil {
		t.recent = map[string]map[string]time.Time{}
	}
	if t.recent[host] == nil {
		t.recent[host] = map[string]time.Time{}
	}
	now := time.Now()
	t.recent[host][ref] = now.Add(t.cfg.BanMemory)
	t.sweepLocked(now)
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

// avoided are the proxies host banned within BanMemory.
func (t *Transport) avoided(host string) []string {
	if host == "" {
		return nil
	}
	t.recentMu.Lock()
	defer t.recentMu.Unlock()
	var refs []string
	now := time.Now()
	for ref, until := range t.recent[host] {
		if now.Before(until) {
			refs = append(refs, ref)
		} else {
			delete(t.recent[host], ref)
		}
	}
	if len(t.recent[host]) == 0 {
		delete(t.recent, host)
	}
	t.sweepLocked(now)
	return refs
}

// report queues r for the next flush.
func (t *Transport) report(r Report) {
	if t.closed.Load() {
		return
	}
	t.startOnce.Do(func() { go t.flushLoop() })
	t.mu.Lock()
	t.pending = append(t.pending, r)
	full := len(t.pending) >= t.cfg.FlushSize
	t.mu.Unlock()
	if full {
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
