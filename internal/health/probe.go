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
)

// maxProbeBody bounds what is read of the probe target's answer.
const maxProbeBody = 4 << 10

// result is the outcome of one probe through one proxy.
type result struct {
	err      error
	latency  time.Duration
	egressIP string
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

// probe GETs the probe target through the proxy at proxyURL within timeout.
func (p *prober) probe(ctx context.Context, proxyURL *url.URL, timeout time.Duration) result {
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, proxyKey{}, proxyURL), timeout)
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
		return result{err: fmt.Errorf("probe through %s: %w", proxyURL.Host, unwrapURLError(err)), latency: time.Since(start)}
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, maxProbeBody))
	res.Body.Close()
	lat := time.Since(start)
	if err != nil {
		return result{err: fmt.Errorf("probe through %s: reading the answer of %s: %w", proxyURL.Host, p.target.Host, err), latency: lat}
	}
	if res.StatusCode < 200 || res.StatusCode > 399 {
		return result{err: fmt.Errorf("probe through %s: %s answered %s", proxyURL.Host, p.target.Host, res.Status), latency: lat}
	}
	return result{latency: lat, egressIP: parseEgressIP(body)}
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
