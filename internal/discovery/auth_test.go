package discovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

func writeToken(t *testing.T, path, tok string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(tok), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestTokenAuth(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	writeToken(t, path, "s3cret-token\n")
	h := newTestServer(t, fixture(), Options{TokenFile: path}).Handler()
	for _, tc := range []struct {
		name, auth string
		status     int
		challenge  string
	}{
		{"no header", "", 401, `Bearer realm="egress-proxies-operator"`},
		{"wrong token", "Bearer s3cret-tokem", 401, `Bearer realm="egress-proxies-operator", error="invalid_token"`},
		{"prefix of the token", "Bearer s3cret", 401, `error="invalid_token"`},
		{"basic auth", "Basic czNjcmV0LXRva2Vu", 401, `Bearer realm=`},
		{"right token", "Bearer s3cret-token", 200, ""},
	} {
		for _, target := range []string{"/v1/proxies", "/v1/proxies/pick?key=k"} {
			res, body := get(t, h, target, "Authorization", tc.auth)
			if res.StatusCode != tc.status {
				t.Errorf("%s %s: status %d, want %d (%s)", tc.name, target, res.StatusCode, tc.status, body)
			}
			if got := res.Header.Get("WWW-Authenticate"); !strings.Contains(got, tc.challenge) || (tc.challenge == "") != (got == "") {
				t.Errorf("%s %s: WWW-Authenticate %q, want %q", tc.name, target, got, tc.challenge)
			}
			if strings.Contains(body, "s3cret") {
				t.Errorf("%s: the body echoes the token: %s", tc.name, body)
			}
		}
	}
	// The probe target stays open.
	if res, _ := get(t, h, "/v1/whoami"); res.StatusCode != 200 {
		t.Errorf("whoami behind auth: %d", res.StatusCode)
	}
}

func TestTokenFileErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := New(fixture(), Options{TokenFile: dir}); err == nil || !strings.Contains(err.Error(), "reading discovery token file") {
		t.Errorf("a token file that is a directory: %v", err)
	}
	empty := filepath.Join(dir, "empty")
	writeToken(t, empty, " \n")
	if _, err := New(fixture(), Options{TokenFile: empty}); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty token file: %v", err)
	}
}

// A rotated token file takes effect without a restart; a token file that disappears
// keeps the last good token.
func TestTokenReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	writeToken(t, path, "old")
	var reloadFailures atomic.Int32
	log := funcr.New(func(prefix, args string) {
		if strings.Contains(args, "keeping the previous discovery token") {
			reloadFailures.Add(1)
		}
	}, funcr.Options{})
	s := newTestServer(t, fixture(), Options{TokenFile: path, TokenReload: 10 * time.Millisecond, Log: log})
	addr := serveUntilCleanup(t, s)
	status := func(tok string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/proxies", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if status("old") != 200 {
		t.Fatal("old token refused before rotation")
	}
	writeToken(t, path, "new")
	testutil.WaitFor(t, waitLong, "the rotated token to be accepted", func() (bool, error) {
		code := status("new")
		return code == 200, fmt.Errorf("status %d", code)
	})
	if status("old") != 401 {
		t.Error("old token still accepted after rotation")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, waitLong, "a failed re-read of the removed token file", func() (bool, error) {
		return reloadFailures.Load() > 0, errors.New("no failed re-read")
	})
	if status("new") != 200 {
		t.Fatal("a vanished token file dropped the last good token")
	}
}

// A token file that does not exist yet (the optional Secret it is mounted from not made so
// far) starts the server, refuses every listing, whatever the caller sends, until the file
// appears, then serves those sending its token.
func TestMissingTokenFileRefusesUntilItAppears(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	var warned, present atomic.Int32
	log := funcr.New(func(prefix, args string) {
		if strings.Contains(args, "WARNING: the discovery token file does not exist") {
			warned.Add(1)
		}
		if strings.Contains(args, "discovery token file present") {
			present.Add(1)
		}
	}, funcr.Options{})
	s := newTestServer(t, fixture(), Options{TokenFile: path, TokenReload: 10 * time.Millisecond, Log: log})
	if warned.Load() != 1 {
		t.Errorf("%d start-up warnings about the missing token file, want 1", warned.Load())
	}
	addr := serveUntilCleanup(t, s)
	call := func(auth string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/proxies", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, auth := range []string{"Bearer anything", "Bearer "} {
		code, body := call(auth)
		if auth == "Bearer " && code != 401 {
			t.Errorf("%q with no token file: %d, want 401", auth, code)
		}
		if auth == "Bearer anything" && (code != 503 || !strings.Contains(body, path+" does not exist")) {
			t.Errorf("%q with no token file: %d %s, want 503 naming %s", auth, code, body, path)
		}
	}
	if code, _ := call(""); code != 401 {
		t.Errorf("no Authorization with no token file: %d, want 401", code)
	}
	writeToken(t, path, "late")
	testutil.WaitFor(t, waitLong, "the late token to be accepted", func() (bool, error) {
		code, body := call("Bearer late")
		return code == 200, fmt.Errorf("%d %s", code, body)
	})
	if code, _ := call("Bearer anything"); code != 401 {
		t.Errorf("a wrong token once the file exists: %d, want 401", code)
	}
	// The reload stores the token and then logs, so a request may see the token first.
	testutil.WaitFor(t, waitLong, "the log line about the token file appearing", func() (bool, error) {
		return present.Load() >= 1, fmt.Errorf("%d lines", present.Load())
	})
	if present.Load() != 1 {
		t.Errorf("%d log lines about the token file appearing, want 1", present.Load())
	}
}

// serveUntilCleanup serves s on a loopback port until the test ends and returns the address.
func serveUntilCleanup(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return ln.Addr().String()
}
