package framework

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// Serve runs h on a free port of host until the test ends and returns its base URL
// (http://host:port).
func Serve(t testing.TB, host string, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("listening on %s: %v", host, err)
	}
	return ServeListener(t, ln, h)
}

// ServeListener runs h on ln until the test ends and returns the base URL.
func ServeListener(t testing.TB, ln net.Listener, h http.Handler) string {
	t.Helper()
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = srv.Close()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// Whoami answers every request with the caller's address ({"ip":"..."}) and counts the
// requests per caller, so that a test can tell a request came through a guest: the
// health probe's target, and the target of the test's own requests through a proxy.
type Whoami struct {
	mu      sync.Mutex
	callers map[string]int
}

func (wh *Whoami) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	wh.mu.Lock()
	if wh.callers == nil {
		wh.callers = map[string]int{}
	}
	wh.callers[host]++
	wh.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, "{\"ip\":%q}\n", host)
}

// From reports how many requests came from ip.
func (wh *Whoami) From(ip string) int {
	wh.mu.Lock()
	defer wh.mu.Unlock()
	return wh.callers[ip]
}

// Callers is every address a request came from, with its count.
func (wh *Whoami) Callers() map[string]int {
	wh.mu.Lock()
	defer wh.mu.Unlock()
	return maps.Clone(wh.callers)
}

// Get GETs u and returns the body; an answer other than 200 is an error naming the URL,
// the status and the body.
func Get(c *http.Client, u string) (string, error) {
	resp, err := c.Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s: %s", u, resp.Status, strings.TrimSpace(string(b)))
	}
	return string(b), err
}

// GetStatus GETs u with a bearer token ("" for none) and returns the status and the
// body; status 0 is a transport error, its text in the body.
func GetStatus(c *http.Client, u, token string) (int, string) {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return 0, err.Error()
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// ThroughClient sends requests through the HTTP proxy at proxyURL (its user info, if
// any, as the proxy's credentials).
func ThroughClient(proxyURL *url.URL) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}
}

// StatusThrough is the status of a GET of target through the proxy at proxyURL.
func StatusThrough(proxyURL *url.URL, target string) (int, error) {
	resp, err := ThroughClient(proxyURL).Get(target)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// Through sends GET target through the proxy at proxyURL and fails the test unless the
// answer says, and who (target's server) saw, that the request came from the guest's
// address ip.
func Through(t testing.TB, proxyURL *url.URL, target string, who *Whoami, ip string) {
	t.Helper()
	before := who.From(ip)
	body, err := Get(ThroughClient(proxyURL), target)
	if err != nil {
		t.Fatalf("GET %s through %s: %v", target, proxyURL.Redacted(), err)
	}
	if !strings.Contains(body, `"`+ip+`"`) || who.From(ip) <= before {
		t.Fatalf("GET %s through %s answered %q; want it to come from the guest's address %s", target, proxyURL.Redacted(), body, ip)
	}
	t.Logf("a request through %s reached %s from %s", proxyURL.Redacted(), target, ip)
}
