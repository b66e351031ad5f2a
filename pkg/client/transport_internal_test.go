package client

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"
)

// The ban memory forgets the hosts whose entries expired without those hosts being
// asked again: a broad crawl's other requests sweep it.
func TestBanMemoryForgetsHostsNotAskedAgain(t *testing.T) {
	c, err := New(Config{URL: "http://discovery.invalid"})
	if err != nil {
		t.Fatal(err)
	}
	tr := c.Transport(TransportConfig{BanMemory: time.Minute})
	defer tr.Close()
	now := time.Unix(1_700_000_000, 0)
	tr.now = func() time.Time { return now }
	for i := 0; i < 5000; i++ {
		tr.remember("site"+strconv.Itoa(i)+".example", "crawl/p1")
	}
	held := func() int {
		tr.recentMu.Lock()
		defer tr.recentMu.Unlock()
		return len(tr.recent)
	}
	if n := held(); n != 5000 {
		t.Fatalf("%d hosts remembered just after their bans, want 5000", n)
	}
	now = now.Add(time.Minute)
	tr.remember("fresh.example", "crawl/p2")
	for i := 0; i < 5000 && held() > 1; i++ {
		tr.avoided("other.example") // requests to a host that never banned
	}
	if n := held(); n != 1 {
		t.Errorf("%d hosts remembered after their entries expired, want 1 (the fresh one)", n)
	}
	if got := tr.avoided("fresh.example"); len(got) != 1 || got[0] != "crawl/p2" {
		t.Errorf("the fresh ban is avoided for %v, want crawl/p2", got)
	}
}

// A site's Retry-After longer than the API takes is reported as the API's limit, so the
// report is taken rather than rejected.
func TestThrottleReportsAtMostADay(t *testing.T) {
	c, err := New(Config{URL: "http://discovery.invalid"})
	if err != nil {
		t.Fatal(err)
	}
	tr := c.Transport(TransportConfig{})
	defer tr.Close()
	for v, want := range map[string]time.Duration{"7": 7 * time.Second, "86400": 24 * time.Hour, "31536000": 24 * time.Hour, "": 0} {
		res := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{}}
		if v != "" {
			res.Header.Set("Retry-After", v)
		}
		if o, got := tr.classify(res); o != Throttled || got != want {
			t.Errorf("Retry-After %q: %s %s, want throttled %s", v, o, got, want)
		}
	}
}

// The pick keys a Spread gives: clients/scrapy's
// test_spread_keys_a_site_by_a_spread_index_and_keeps_the_domain holds the same table, so
// Go and Scrapy crawlers of a site spread it the same way.
func TestSpreadKeys(t *testing.T) {
	u, err := url.Parse("http://shop.example.com:8080/page/1?q=1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spread Spread
		key    string
	}{
		{Spread{}, ""},
		{Spread{Keys: 1}, ""},
		{Spread{PerRequest: true}, "example.com#u1dc0no963r6su"},
		{Spread{Keys: 4}, "example.com#3"},
		{Spread{Keys: 7}, "example.com#1"},
		{Spread{Worker: "w-1"}, "example.com@w-1"},
		{Spread{Worker: "w-1", Keys: 3}, "example.com@w-1#1"},
	} {
		if got := tc.spread.key("example.com", u); got != tc.key {
			t.Errorf("%+v: key %q, want %q", tc.spread, got, tc.key)
		}
	}
}

// A pick's exclude= carries at most maxExclude proxies, the request's own first: the API
// refuses more.
func TestExcludeIsBounded(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.URL.Query()["exclude"]
		_, _ = io.WriteString(w, `{"name":"p","namespace":"crawl","url":"http://127.0.0.1:1"}`)
	}))
	defer srv.Close()
	c, err := New(Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	tr := c.Transport(TransportConfig{})
	defer tr.Close()
	avoid := []string{"crawl/tried", "crawl/tried"}
	for i := range 150 {
		avoid = append(avoid, "crawl/avoided-"+strconv.Itoa(i))
	}
	if _, err := tr.next(context.Background(), Query{Domain: "shop.example.com"}, "shop.example.com", avoid); err != nil {
		t.Fatal(err)
	}
	if len(got) != maxExclude || got[0] != "crawl/tried" || got[1] != "crawl/avoided-0" {
		t.Errorf("exclude= %d entries, starting %v; want %d, the tried one first, once", len(got), got[:min(3, len(got))], maxExclude)
	}
}
