// Package client is a Go client of the egress-proxies-operator discovery API, for
// crawlers: it lists and picks proxies, sends ban, throttle and success feedback in
// batches with retries, and provides an http.RoundTripper that sends every request
// through a proxy picked for the request's host, reports what the site answered and
// retries a banned request, or one whose proxy did not answer, through another proxy.
//
//	c, err := client.New(client.Config{URL: "http://proxy-operator:8082", Token: token})
//	tr := c.Transport(client.TransportConfig{})
//	defer tr.Close()
//	hc := &http.Client{Transport: tr}
//
// GatewayTransport is the gateway mode: every request goes through the operator's
// gateway, one proxy URL, with its options in the proxy user name, and the site's
// answers are reported by the exit the gateway names in X-Egress-Proxy.
//
//	gt, err := c.GatewayTransport(client.GatewayConfig{URL: "http://gateway:8080",
//		Options: client.GatewayOptions{Namespace: "crawl"}})
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Config configures a Client.
type Config struct {
	// URL is the discovery API's base URL, http:// or https://, for example
	// http://egress-proxies-operator-controller-manager.egress-proxies-operator-system.svc:8082.
	URL string
	// Token is the discovery token, sent as Authorization: Bearer; empty: none.
	Token string
	// TokenFile is a file holding the token, in place of Token: a projected
	// ServiceAccount token, which the kubelet rotates (typically every hour). It is read
	// by New, and again before a call when the file has changed or was read more than a
	// minute ago; while it cannot be read, the token read last is sent.
	TokenFile string
	// TLS is the TLS configuration for an https:// URL (the CA that signed the API's
	// certificate); nil: the system's roots.
	TLS *tls.Config
	// HTTPClient makes the API calls; nil: a client of its own with TLS and a 30 s
	// timeout. It does not carry the crawl's requests.
	HTTPClient *http.Client
	// FeedbackAttempts is how many times a feedback batch is sent before giving up
	// (default 5). A batch is sent again after a connection failure or an answer of
	// 429, 502, 503 or 504, after the answer's Retry-After or else a back-off.
	FeedbackAttempts int
	// RetryBackoff is the first back-off between attempts without a Retry-After
	// (default 250 ms); it doubles with each attempt, up to MaxRetryWait.
	RetryBackoff time.Duration
	// MaxRetryWait caps any wait between attempts, Retry-After included (default 30 s).
	MaxRetryWait time.Duration
}

// Client talks to the discovery API. It is safe for concurrent use.
type Client struct {
	base      *url.URL
	cfg       Config
	hc        *http.Client
	tokenFile *tokenFile // nil without Config.TokenFile
}

// New checks cfg and returns a client.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("discovery URL %q: %w", cfg.URL, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("discovery URL %q: want http://host:port or https://host:port", cfg.URL)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("discovery URL %q: want no user, query or fragment (the token goes in Config.Token)", cfg.URL)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	c := &Client{base: u}
	if cfg.TokenFile != "" {
		if cfg.Token != "" {
			return nil, fmt.Errorf("discovery token: Token and TokenFile (%s) are both set; set one", cfg.TokenFile)
		}
		if c.tokenFile, err = newTokenFile(cfg.TokenFile); err != nil {
			return nil, err
		}
	}
	if cfg.FeedbackAttempts <= 0 {
		cfg.FeedbackAttempts = 5
	}
	if cfg.RetryBackoff <= 0 {
		cfg.RetryBackoff = 250 * time.Millisecond
	}
	if cfg.MaxRetryWait <= 0 {
		cfg.MaxRetryWait = 30 * time.Second
	}
	hc := cfg.HTTPClient
	if hc == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.Proxy = nil // the API is reached directly, never through a proxy from the environment
		if cfg.TLS != nil {
			t.TLSClientConfig = cfg.TLS.Clone()
		}
		hc = &http.Client{Transport: t, Timeout: 30 * time.Second}
	}
	c.cfg, c.hc = cfg, hc
	return c, nil
}

// hasToken is whether calls carry a token (Config.Token or Config.TokenFile).
func (c *Client) hasToken() bool { return c.cfg.Token != "" || c.tokenFile != nil }

// token is the token to send: Config.Token, or Config.TokenFile's as it is now.
func (c *Client) token() (string, error) {
	if c.tokenFile != nil {
		return c.tokenFile.get()
	}
	return c.cfg.Token, nil
}

// Proxy is one proxy as the API describes it.
type Proxy struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	URL       string            `json:"url"`
	Mode      string            `json:"mode,omitempty"`
	Provider  string            `json:"provider,omitempty"`
	Region    string            `json:"region,omitempty"`
	Zone      string            `json:"zone,omitempty"`
	Pool      string            `json:"pool,omitempty"`
	Healthy   bool              `json:"healthy"`
	EgressIP  string            `json:"egressIP,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// Ref is the proxy's namespace/name, which feedback reports accept.
func (p Proxy) Ref() string { return p.Namespace + "/" + p.Name }

// Query selects proxies. Empty fields are left out of the request.
type Query struct {
	// Key is pick's session key; Pick without a Key needs a Domain, whose site is then the key.
	Key string
	// Domain leaves out the proxies cooling for the domain's site.
	Domain        string
	LabelSelector string
	Namespace     string
	Pool          string
	// Credentials asks for URLs carrying the proxies' user:password@ (needs a token that
	// may have them).
	Credentials bool
	// Exclude leaves these proxies (URLs discovery handed out, or namespace/name) out of
	// a pick, which then answers the next proxy in the same rendezvous order: a request
	// sent again after its proxy failed names every proxy it already tried. Pick only.
	Exclude []string
}

func (q Query) values(withKey bool) url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	if withKey {
		set("key", q.Key)
	}
	set("domain", q.Domain)
	set("labelSelector", q.LabelSelector)
	set("namespace", q.Namespace)
	set("pool", q.Pool)
	if q.Credentials {
		v.Set("credentials", "true")
	}
	if withKey {
		for _, x := range q.Exclude {
			v.Add("exclude", x)
		}
	}
	return v
}

// Error is an answer of the API other than success. Its message names the request and
// the status, and carries the API's own error.
type Error struct {
	Method string
	URL    string
	Status int
	// Message is the API's "error" field, or the start of the body when it is not JSON.
	Message string
	// Parameter is the query parameter a 400 names (the API's "parameter" field); "": none.
	Parameter string
	// RetryAfter is the answer's Retry-After (a saturated site, a draining replica); 0: none.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	s := fmt.Sprintf("discovery %s %s: %d %s", e.Method, e.URL, e.Status, http.StatusText(e.Status))
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(" (retry after %s)", e.RetryAfter)
	}
	return s
}

// StatusOf is the HTTP status of an *Error in err's chain, or 0.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

// List returns the healthy proxies q matches (GET /v1/proxies).
func (c *Client) List(ctx context.Context, q Query) ([]Proxy, error) {
	var body struct {
		Proxies []Proxy `json:"proxies"`
	}
	if err := c.get(ctx, "/v1/proxies", q.values(false), &body); err != nil {
		return nil, err
	}
	return body.Proxies, nil
}

// Pick returns the proxy for q.Key, or for q.Domain's site when Key is empty
// (GET /v1/proxies/pick). With a Domain, a saturated site is an *Error with status 503
// and its RetryAfter.
func (c *Client) Pick(ctx context.Context, q Query) (Proxy, error) {
	var p Proxy
	if q.Key == "" && q.Domain == "" {
		return p, errors.New("discovery pick: a Query with neither Key nor Domain")
	}
	err := c.get(ctx, "/v1/proxies/pick", q.values(true), &p)
	return p, err
}

func (c *Client) endpoint(path string, v url.Values) string {
	u := *c.base
	u.Path += path
	u.RawQuery = v.Encode()
	return u.String()
}

func (c *Client) get(ctx context.Context, path string, v url.Values, into any) error {
	target := c.endpoint(path, v)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fmt.Errorf("discovery GET %s: %w", target, err)
	}
	return c.do(req, into)
}

// do sends req and decodes a 200's JSON body into into; anything else is an error naming
// the method, the URL and the status.
func (c *Client) do(req *http.Request, into any) error {
	token, err := c.token()
	if err != nil {
		return fmt.Errorf("discovery %s %s: %w", req.Method, req.URL, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Accept", "application/json")
	res, err := c.hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) { // it already names the method and the URL
			return fmt.Errorf("discovery %w", ue)
		}
		return fmt.Errorf("discovery %s %s: %w", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("discovery %s %s: reading the answer (status %d): %w", req.Method, req.URL, res.StatusCode, err)
	}
	if res.StatusCode != http.StatusOK {
		return apiError(req, res, b)
	}
	if err := json.Unmarshal(b, into); err != nil {
		return fmt.Errorf("discovery %s %s: decoding the answer: %w", req.Method, req.URL, err)
	}
	return nil
}

func apiError(req *http.Request, res *http.Response, body []byte) *Error {
	e := &Error{Method: req.Method, URL: req.URL.String(), Status: res.StatusCode, RetryAfter: retryAfter(res.Header)}
	var msg struct {
		Error     string `json:"error"`
		Parameter string `json:"parameter"`
	}
	if json.Unmarshal(body, &msg) == nil && msg.Error != "" {
		e.Message, e.Parameter = msg.Error, msg.Parameter
	} else {
		e.Message = strings.TrimSpace(string(body[:min(len(body), 200)]))
	}
	return e
}

// retryAfter reads a Retry-After of seconds or an HTTP date; 0 when absent or unreadable.
func retryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil {
		if n < 0 {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

// Outcome is what a site did to a request sent through a proxy.
type Outcome string

// The outcomes feedback reports carry. Unreachable is about the proxy, not a site: it did
// not answer (its connection was refused, reset or timed out before it answered), and
// discovery leaves it out of every answer until its probe confirms it again.
const (
	Banned      Outcome = "banned"
	Throttled   Outcome = "throttled"
	OK          Outcome = "ok"
	Unreachable Outcome = "unreachable"
)

// Report is one feedback report.
type Report struct {
	// Proxy is the URL discovery handed out (credentials in it are ignored) or namespace/name.
	Proxy string
	// Domain is the host the request was for; an Unreachable report may leave it empty.
	Domain  string
	Outcome Outcome
	// RetryAfter is how long a throttled pair cools; 0: the server's default (60 s).
	RetryAfter time.Duration
}

// MarshalJSON writes the report as the API takes it, RetryAfter as retryAfterSeconds
// (for a throttle only).
func (r Report) MarshalJSON() ([]byte, error) {
	w := struct {
		Proxy      string   `json:"proxy"`
		Domain     string   `json:"domain,omitempty"`
		Outcome    Outcome  `json:"outcome"`
		RetryAfter *float64 `json:"retryAfterSeconds,omitempty"`
	}{Proxy: r.Proxy, Domain: r.Domain, Outcome: r.Outcome}
	if r.Outcome == Throttled && r.RetryAfter > 0 {
		s := r.RetryAfter.Seconds()
		w.RetryAfter = &s
	}
	return json.Marshal(w)
}

// Rejected is a report the API refused, with why.
type Rejected struct {
	// Index is the report's position in the slice given to Feedback.
	Index int    `json:"index"`
	Proxy string `json:"proxy"`
	Error string `json:"error"`
}

// FeedbackResult is what the API made of the reports.
type FeedbackResult struct {
	Accepted int
	Rejected []Rejected
}

// MaxBatch is the most reports one POST /v1/feedback carries.
const MaxBatch = 1000

// Feedback sends reports (POST /v1/feedback), MaxBatch to a request, each batch sent
// again after a connection failure or a 429, 502, 503 or 504 (a draining replica answers
// 503 with Retry-After: 1, and the next attempt reaches another one). Sending a report
// twice is harmless: a ban reported while its pair still cools changes nothing. On an
// error the result holds what the batches before it were answered.
func (c *Client) Feedback(ctx context.Context, reports []Report) (FeedbackResult, error) {
	var res FeedbackResult
	for off := 0; off < len(reports); off += MaxBatch {
		batch := reports[off:min(off+MaxBatch, len(reports))]
		ans, err := c.sendBatch(ctx, batch)
		if err != nil {
			return res, err
		}
		res.Accepted += ans.Accepted
		for _, r := range ans.Rejected {
			r.Index += off
			res.Rejected = append(res.Rejected, r)
		}
	}
	return res, nil
}

func (c *Client) sendBatch(ctx context.Context, batch []Report) (FeedbackResult, error) {
	var ans FeedbackResult
	body, err := json.Marshal(struct {
		Reports []Report `json:"reports"`
	}{batch})
	if err != nil {
		return ans, fmt.Errorf("discovery feedback: encoding %d reports: %w", len(batch), err)
	}
	target := c.endpoint("/v1/feedback", nil)
	backoff := c.cfg.RetryBackoff
	for attempt := 1; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
		if err != nil {
			return ans, fmt.Errorf("discovery POST %s: %w", target, err)
		}
		req.Header.Set("Content-Type", "application/json")
		var got struct {
			Accepted int        `json:"accepted"`
			Rejected []Rejected `json:"rejected"`
		}
		err = c.do(req, &got)
		if err == nil {
			return FeedbackResult{Accepted: got.Accepted, Rejected: got.Rejected}, nil
		}
		wait := backoff
		var ae *Error
		if errors.As(err, &ae) {
			switch ae.Status {
			case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			default:
				return ans, err // the request itself is wrong: sending it again cannot help
			}
			if ae.RetryAfter > 0 {
				wait = ae.RetryAfter
			}
		} else if ctx.Err() != nil {
			return ans, err
		}
		if attempt >= c.cfg.FeedbackAttempts {
			return ans, fmt.Errorf("%w (gave up after %d attempts)", err, attempt)
		}
		wait = min(wait, c.cfg.MaxRetryWait)
		backoff = min(2*backoff, c.cfg.MaxRetryWait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ans, fmt.Errorf("%w (stopped waiting to send it again: %w)", err, ctx.Err())
		case <-t.C:
		}
	}
}
