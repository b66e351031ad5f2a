package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// maxProbeBody bounds what is read of the probe target's answer.
const maxProbeBody = 4 << 10

// result is the outcome of one probe through one proxy.
type result struct {
	err      error
	latency  time.Duration
	egressIP string
	// reason of a failure, when it is not ProbeFailed (EgressMismatch).
	reason string
	// verified: egressIP is the address the proxy's WireGuard Secret states.
	verified bool
}

type proxyKey struct{}

// prober sends the probe request through a proxy given per request. One transport
// serves every proxy; keep-alives are off so each probe opens a fresh connection to the
// proxy, which is what a crawler does, and no idle connection to 1,000 proxies is held.
type prober struct {
	target *url.URL
	client *http.Client
}

func newProber(target string) (*prober, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("parsing probe url %q: %w", target, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("probe url %q: want an absolute http:// or https:// url", target)
	}
	tr := &http.Transport{
		Proxy: func(r *http.Request) (*url.URL, error) {
			if u, ok := r.Context().Value(proxyKey{}).(*url.URL); ok {
				return u, nil
			}
			return nil, errors.New("probe request without a proxy") // never sent direct
		},
		// The status of a refused CONNECT, which the transport would reduce to its text.
		OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, res *http.Response) error {
			if res.StatusCode != http.StatusOK {
				return &connectRefused{code: res.StatusCode, status: res.Status}
			}
			return nil
		},
		DialContext:            (&net.Dialer{KeepAlive: -1}).DialContext,
		DisableKeepAlives:      true,
		ForceAttemptHTTP2:      false,
		ResponseHeaderTimeout:  0, // the caller's context bounds the whole probe
		MaxResponseHeaderBytes: 16 << 10,
	}
	return &prober{target: u, client: &http.Client{
		Transport: tr,
		// A redirect is an answer: the proxy forwarded the request.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, nil
}

// probe GETs the probe target through the proxy at proxyURL within timeout, with creds
// (nil: none) as Proxy-Authorization: on the GET itself for an http target, on the
// CONNECT for an https one. Errors name proxyURL's host, never the credentials.
func (p *prober) probe(ctx context.Context, proxyURL *url.URL, creds *proxyconfig.Credentials, timeout time.Duration) result {
	via := proxyURL
	if creds != nil {
		u := *proxyURL
		u.User = url.UserPassword(creds.Username, creds.Password) // the transport sends it
		via = &u
	}
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, proxyKey{}, via), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.target.String(), nil)
	if err != nil {
		return result{err: fmt.Errorf("building probe request for %s: %w", p.target, err)}
	}
	req.Header.Set("Accept", "application/json, text/plain;q=0.9")
	req.Header.Set("User-Agent", "egress-proxies-operator-health")
	start := time.Now()
	res, err := p.client.Do(req)
	if err != nil {
		if cr := (*connectRefused)(nil); errors.As(err, &cr) {
			if rerr := p.refusal(cr.code, cr.status, creds != nil); rerr != nil {
				return result{err: fmt.Errorf("probe through %s: %w", proxyURL.Host, rerr), latency: time.Since(start)}
			}
		}
		return result{err: fmt.Errorf("probe through %s: %w", proxyURL.Host, unwrapURLError(err)), latency: time.Since(start)}
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, maxProbeBody))
	res.Body.Close()
	lat := time.Since(start)
	if err != nil {
		return result{err: fmt.Errorf("probe through %s: reading the answer of %s: %w", proxyURL.Host, p.target.Host, err), latency: lat}
	}
	if rerr := p.refusal(res.StatusCode, res.Status, creds != nil); rerr != nil {
		return result{err: fmt.Errorf("probe through %s: %w", proxyURL.Host, rerr), latency: lat}
	}
	if res.StatusCode < 200 || res.StatusCode > 399 {
		return result{err: fmt.Errorf("probe through %s: %s answered %s", proxyURL.Host, p.target.Host, res.Status), latency: lat}
	}
	return result{latency: lat, egressIP: parseEgressIP(body)}
}

// connectRefused is a proxy's answer other than 200 to the probe's CONNECT.
type connectRefused struct {
	code   int
	status string
}

func (e *connectRefused) Error() string { return "the proxy answered the CONNECT with " + e.status }

// refusal explains an answer that is the proxy's refusal of the probe - credentials
// missing or refused, the source address not allowed - or returns nil. 401 counts when
// credentials were sent: tinyproxy answers wrong ones with 401, not 407.
func (p *prober) refusal(code int, status string, sentCredentials bool) error {
	switch {
	case code == http.StatusProxyAuthRequired && !sentCredentials:
		return fmt.Errorf("the proxy requires credentials (%s) and the Proxy has none: set spec.proxy.basicAuth", status)
	case code == http.StatusProxyAuthRequired, code == http.StatusUnauthorized && sentCredentials:
		return fmt.Errorf("the proxy refused the credentials (%s): the Secret named by spec.proxy.basicAuth.secretRef does not hold what the proxy expects", status)
	case code == http.StatusForbidden:
		hint := ""
		if p.target.Scheme == "https" && p.target.Port() != "" && p.target.Port() != "443" {
			hint = " (or it allows CONNECT to port 443 only, and the probe url uses port " + p.target.Port() + ")"
		}
		return fmt.Errorf("the proxy refused the probe's source address (%s): add the network the operator's probes come from to spec.proxy.allowedSourceRanges%s", status, hint)
	}
	return nil
}

// unwrapURLError drops the *url.Error wrapper, whose text repeats the method and URL.
func unwrapURLError(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

// parseEgressIP reads the caller's address from a probe target's answer: a JSON object
// with "ip" (the operator's own /v1/whoami) or "origin" (httpbin's /ip, possibly a
// comma-separated chain whose first entry is the client), or a body that is nothing but an
// address (icanhazip and the like). Anything else yields "".
func parseEgressIP(body []byte) string {
	s := strings.TrimSpace(string(body))
	if strings.HasPrefix(s, "{") {
		var v struct {
			IP     string `json:"ip"`
			Origin string `json:"origin"`
		}
		if json.Unmarshal([]byte(s), &v) != nil {
			return ""
		}
		s = v.IP
		if s == "" {
			s, _, _ = strings.Cut(v.Origin, ",")
		}
		s = strings.TrimSpace(s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return ""
	}
	return a.Unmap().String()
}
