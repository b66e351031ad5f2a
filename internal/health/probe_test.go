package health

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
)

// whoamiTarget answers with the caller's address, like the discovery server's /v1/whoami.
func whoamiTarget(t testing.TB, format string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.RemoteAddr[:strings.LastIndex(r.RemoteAddr, ":")]
		if format == "text" {
			_, _ = w.Write([]byte(host + "\n"))
			return
		}
		_, _ = w.Write([]byte(`{"ip":"` + host + `"}`))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func fpURL(p *healthtest.ForwardProxy) *url.URL {
	return &url.URL{Scheme: "http", Host: p.Host + ":" + strconv.Itoa(int(p.Port))}
}

func TestProbeThroughProxy(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		target := whoamiTarget(t, format)
		pr, err := newProber(target.URL + "/v1/whoami")
		if err != nil {
			t.Fatal(err)
		}
		fp := healthtest.New(t, "127.0.0.7")
		r := pr.probe(context.Background(), fpURL(fp), nil, 5*time.Second)
		if r.err != nil {
			t.Fatalf("%s: %v", format, r.err)
		}
		if r.egressIP != "127.0.0.7" {
			t.Errorf("%s: egress IP %q, want the proxy's outgoing address 127.0.0.7", format, r.egressIP)
		}
		if r.latency <= 0 {
			t.Errorf("%s: latency %v", format, r.latency)
		}
		if fp.Requests.Load() != 1 {
			t.Errorf("%s: the proxy saw %d requests; the probe did not go through it", format, fp.Requests.Load())
		}
	}
}

func TestProbeFailures(t *testing.T) {
	target := whoamiTarget(t, "json")
	pr, _ := newProber(target.URL)
	fp := healthtest.New(t, "")

	fp.SetMode(healthtest.Fail)
	r := pr.probe(context.Background(), fpURL(fp), nil, 5*time.Second)
	if r.err == nil || !strings.Contains(r.err.Error(), "502") || !strings.Contains(r.err.Error(), fp.Host) {
		t.Errorf("502 from the proxy: %v", r.err)
	}

	fp.SetMode(healthtest.Hang)
	start := time.Now()
	r = pr.probe(context.Background(), fpURL(fp), nil, 200*time.Millisecond)
	if r.err == nil || !strings.Contains(r.err.Error(), "deadline") {
		t.Errorf("hanging proxy: %v", r.err)
	}
	// Only the 200ms timeout can end it; the bound, the engine's default timeout, is there
	// to catch a probe that ignores the timeout it is given and leaves room for any load.
	if el := time.Since(start); el >= DefaultTimeout {
		t.Errorf("a 200ms probe took %v against a hanging proxy", el)
	}

	fp.Close()
	r = pr.probe(context.Background(), fpURL(fp), nil, 5*time.Second)
	if r.err == nil || !strings.Contains(r.err.Error(), "refused") {
		t.Errorf("closed proxy: %v", r.err)
	}
}

func TestNewProberRejectsBadURL(t *testing.T) {
	for _, u := range []string{"", "localhost:8082/v1/whoami", "ftp://x/", "http://"} {
		if _, err := newProber(u); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
}

func TestParseEgressIP(t *testing.T) {
	for body, want := range map[string]string{
		`{"ip":"198.51.100.4"}`:               "198.51.100.4",
		`{"origin":"198.51.100.4, 10.0.0.1"}`: "198.51.100.4",
		"203.0.113.9\n":                       "203.0.113.9",
		"2001:db8::5":                         "2001:db8::5",
		"::ffff:192.0.2.1":                    "192.0.2.1",
		`{"ip":"not an ip"}`:                  "",
		"<html>hello</html>":                  "",
		`{"ip":`:                              "",
		"":                                    "",
	} {
		if got := parseEgressIP([]byte(body)); got != want {
			t.Errorf("parseEgressIP(%q) = %q, want %q", body, got, want)
		}
	}
}
