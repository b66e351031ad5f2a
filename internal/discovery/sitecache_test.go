package discovery

import (
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
)

func resetSites() {
	sites.Clear()
	sitesHeld.Store(0)
}

func sitesCached() int {
	n := 0
	sites.Range(func(_, _ any) bool { n++; return true })
	return n
}

func heapAlloc() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// A ?domain= longer than a DNS name is a 400 naming the parameter, before anything is
// cached, and however many such requests come, the heap stays where it was.
func TestDomainParameterOverlongIsRefusedAndNotCached(t *testing.T) {
	h := newTestServer(t, fixture(), Options{}).Handler()
	resetSites()
	huge := strings.Repeat("a.", 1<<19) + "example.com" // over 1 MiB, each label valid
	for _, path := range []string{"/v1/proxies", "/v1/proxies/pick"} {
		res, body := get(t, h, path+"?domain="+huge)
		var e struct{ Error, Parameter string }
		if err := json.Unmarshal([]byte(body), &e); err != nil || res.StatusCode != http.StatusBadRequest ||
			e.Parameter != paramDomain || !strings.Contains(e.Error, "bytes long; a DNS name has at most 253 characters") {
			t.Errorf("%s with a 1 MiB domain: %d %.300s, want 400 naming the domain parameter and the limit", path, res.StatusCode, body)
		}
		if len(body) > 1024 {
			t.Errorf("%s: the error answer is %d bytes, want the domain cut short", path, len(body))
		}
	}
	before := heapAlloc()
	for i := 0; i < 64; i++ {
		d := fmt.Sprintf("s%d.%s", i, strings.Repeat("a.", 1<<18)) + "example.com" // 512 KiB
		if res, _ := get(t, h, "/v1/proxies/pick?domain="+d); res.StatusCode != http.StatusBadRequest {
			t.Fatalf("a 512 KiB domain: status %d, want 400", res.StatusCode)
		}
	}
	after := heapAlloc()
	t.Logf("heap after GC: %d KiB before, %d KiB after 64 requests with 512 KiB domains", before>>10, after>>10)
	if n := sitesCached(); n != 0 {
		t.Errorf("%d overlong domains cached, want none", n)
	}
	if after > before+1<<20 {
		t.Errorf("the heap grew by %d KiB after overlong requests, want it flat", (after-before)>>10)
	}
}

// A domain the cache keeps is a copy: it does not hold the rest of a long query in
// memory, and the cache stays within its bound.
func TestDomainCacheKeepsNoPartOfTheQuery(t *testing.T) {
	h := newTestServer(t, fixture(), Options{}).Handler()
	resetSites()
	key := strings.Repeat("k", 512<<10)
	before := heapAlloc()
	for i := 0; i < 32; i++ {
		if res, body := get(t, h, fmt.Sprintf("/v1/proxies/pick?key=%s&domain=Shop%d.Example.com.", key, i)); res.StatusCode != http.StatusOK {
			t.Fatalf("pick: %d %.200s", res.StatusCode, body)
		}
	}
	after := heapAlloc()
	t.Logf("heap after GC: %d KiB before, %d KiB after 32 picks with 512 KiB keys and a new domain each", before>>10, after>>10)
	if n := sitesCached(); n != 32 {
		t.Errorf("%d domains cached, want 32", n)
	}
	if v, ok := sites.Load("shop7.example.com"); !ok || v != "example.com" {
		t.Errorf("the cache holds %v for shop7.example.com, want example.com under the domain as Site reads it", v)
	}
	if after > before+1<<20 {
		t.Errorf("the heap grew by %d KiB: the cache keeps the queries", (after-before)>>10)
	}
	for i := 0; i < 3*maxSites; i++ {
		if _, err := siteOf(fmt.Sprintf("s%d.example.com", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := sitesCached(); n > maxSites {
		t.Errorf("%d domains cached, want at most %d", n, maxSites)
	}
}
