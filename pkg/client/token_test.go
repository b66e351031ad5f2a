package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/pkg/client"
)

// bearers is an API that answers every listing with no proxies and records the bearer
// token of each call.
type bearers struct {
	mu  sync.Mutex
	got []string
}

func (b *bearers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	b.got = append(b.got, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	b.mu.Unlock()
	_, _ = w.Write([]byte(`{"proxies":[]}`))
}

func (b *bearers) last() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.got[len(b.got)-1]
}

// writeToken replaces path the way the kubelet's atomic writer rotates a projected token:
// a new file renamed into place.
func writeToken(t *testing.T, path, token string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// A rotated token file is read again: the call after the change carries the new token,
// whether the file was replaced or rewritten in place; a file gone for a while leaves
// the last token in use.
func TestTokenFileIsReadAgainWhenItChanges(t *testing.T) {
	api := &bearers{}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	path := filepath.Join(t.TempDir(), "token")
	writeToken(t, path, "first-token")
	c := newClient(t, srv.URL, "", func(cfg *client.Config) { cfg.TokenFile = path })
	list := func(want string) {
		t.Helper()
		if _, err := c.List(context.Background(), client.Query{}); err != nil {
			t.Fatal(err)
		}
		if got := api.last(); got != want {
			t.Errorf("the call carried token %q, want %q", got, want)
		}
	}
	list("first-token")
	list("first-token")

	writeToken(t, path, "rotated-token")
	list("rotated-token")

	// Rewritten in place (same file, another size).
	if err := os.WriteFile(path, []byte("rewritten-in-place-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	list("rewritten-in-place-token")

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	list("rewritten-in-place-token")
	writeToken(t, path, "back-token")
	list("back-token")
}

func TestTokenFileErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		cfg  client.Config
		want []string
	}{
		{client.Config{URL: "http://h:8082", TokenFile: missing}, []string{missing, "no such file"}},
		{client.Config{URL: "http://h:8082", TokenFile: empty}, []string{empty, "empty"}},
		{client.Config{URL: "http://h:8082", TokenFile: empty, Token: "t"}, []string{"Token and TokenFile", empty}},
	} {
		_, err := client.New(tc.cfg)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("New(%+v): %v, want an error saying %q", tc.cfg, err, w)
			}
		}
	}
}

// The Transport asks for credentials when the token comes from a file, as with Token.
func TestTransportAsksForCredentialsWithATokenFile(t *testing.T) {
	var query string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		query = r.URL.RawQuery
		http.Error(w, `{"error":"no proxy"}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(srv.Close)
	path := filepath.Join(t.TempDir(), "token")
	writeToken(t, path, "file-token")
	c := newClient(t, srv.URL, "", func(cfg *client.Config) { cfg.TokenFile = path })
	tr := c.Transport(client.TransportConfig{})
	defer tr.Close()
	if _, err := (&http.Client{Transport: tr}).Get("http://shop.example.com/"); err == nil {
		t.Fatal("a request without a proxy to pick succeeded")
	}
	if !strings.Contains(query, "credentials=true") {
		t.Errorf("the pick asked %q, want credentials=true", query)
	}
}
