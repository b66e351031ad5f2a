package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// staticSource serves a snapshot that a test swaps at will.
type staticSource struct{ snap atomic.Pointer[Snapshot] }

func newStaticSource(entries ...Entry) *staticSource {
	s := &staticSource{}
	s.set(entries...)
	return s
}

func (s *staticSource) set(entries ...Entry) {
	s.snap.Store(NewSnapshot(append([]Entry(nil), entries...)))
}

func (s *staticSource) Snapshot(context.Context) (*Snapshot, error) { return s.snap.Load(), nil }

type listBody struct {
	Count   int     `json:"count"`
	Proxies []Entry `json:"proxies"`
	// With ?credentials=true only.
	CredentialsUnavailable *int     `json:"credentialsUnavailable"`
	CredentialErrors       []string `json:"credentialErrors"`
}

func get(t *testing.T, h http.Handler, target string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, target, nil)
	req.Header.Set("Authorization", "Bearer "+testToken) // ignored by a server without authentication
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	res := rec.Result()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func decodeList(t *testing.T, body string) listBody {
	t.Helper()
	var l listBody
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		t.Fatalf("decoding list %q: %v", body, err)
	}
	if l.Count != len(l.Proxies) {
		t.Fatalf("count %d but %d proxies in %s", l.Count, len(l.Proxies), body)
	}
	return l
}

func names(l listBody) string {
	var n []string
	for _, p := range l.Proxies {
		n = append(n, p.Namespace+"/"+p.Name)
	}
	return strings.Join(n, ",")
}

func entry(ns, name string, healthy bool, provider, region, zone string, lbl map[string]string) Entry {
	i := len(name) + len(ns)
	return Entry{Name: name, Namespace: ns, URL: fmt.Sprintf("http://10.0.%d.%d:3128", len(ns), i),
		Mode: "Managed", Provider: provider, Region: region, Zone: zone, Healthy: healthy, Labels: lbl}
}

// testToken is the static token of the servers newTestServer builds to take feedback,
// which post sends unless told otherwise.
const testToken = "s3cret-token"

// newTestServer is New(src, opts). A server taking feedback needs authentication: unless
// opts has some, it gets the static token testToken.
func newTestServer(t testing.TB, src Source, opts Options) *Server {
	t.Helper()
	if opts.Feedback != nil && opts.TokenFile == "" && opts.Access == nil {
		opts.TokenFile = filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(opts.TokenFile, []byte(testToken), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(src, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

func newRequest(method, target string) *http.Request {
	return httptest.NewRequest(method, target, nil)
}
