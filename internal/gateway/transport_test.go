package gateway

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// answeringExit is an exit that answers every proxied request itself, counting the
// connections it accepted and closed; handler replaces its answer.
type answeringExit struct {
	Exit
	srv             *http.Server
	accepted, ended atomic.Int32
}

func startAnsweringExit(t *testing.T, idle time.Duration, handler http.HandlerFunc) *answeringExit {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &answeringExit{Exit: Exit{Namespace: "crawlers", Name: "answering", Address: ln.Addr().String(), EgressIP: "127.0.0.1"}}
	if handler == nil {
		handler = func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, "ok "+r.Method)
		}
	}
	e.srv = &http.Server{Handler: handler, IdleTimeout: idle, ConnState: func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			e.accepted.Add(1)
		case http.StateClosed, http.StateHijacked:
			e.ended.Add(1)
		}
	}}
	go e.srv.Serve(ln)
	t.Cleanup(func() { e.srv.Close() })
	return e
}

func mustGet(t *testing.T, c *http.Client, method, url, body string) string {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s through the gateway: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s through the gateway: %s %q", method, url, resp.Status, b)
	}
	return string(b)
}

// Requests one after another to the same exit share one kept-alive connection to it.
func TestExitConnectionKeptAlive(t *testing.T) {
	e := startAnsweringExit(t, time.Minute, nil)
	h := newHarness(t, nil, nil)
	h.chooser.exits = []Exit{e.Exit}
	c := h.client("crawler", tokenCrawlers)
	for range 20 {
		mustGet(t, c, http.MethodGet, "http://site.test/", "")
	}
	if n := e.accepted.Load(); n != 1 {
		t.Fatalf("20 requests opened %d connections to the exit; want 1, kept alive", n)
	}
}

// An exit that closed an idle kept-alive connection costs the next request nothing, a
// request with a body included: the closed connection is found before it is used.
func TestExitClosedItsIdleConnection(t *testing.T) {
	e := startAnsweringExit(t, 50*time.Millisecond, nil)
	h := newHarness(t, nil, nil)
	h.chooser.exits = []Exit{e.Exit}
	c := h.client("crawler", tokenCrawlers)
	mustGet(t, c, http.MethodGet, "http://site.test/", "")
	testutil.WaitFor(t, testutil.WaitLong, "the exit to close its idle connection from the gateway", func() (bool, error) {
		return e.ended.Load() == 1, nil
	})
	if got := mustGet(t, c, http.MethodPost, "http://site.test/form", "a=1"); got != "ok POST" {
		t.Fatalf("POST after the exit closed the idle connection: %q", got)
	}
	mustGet(t, c, http.MethodGet, "http://site.test/", "")
	if n := e.accepted.Load(); n != 2 {
		t.Fatalf("the exit accepted %d connections; want 2 (the closed one, then a new one kept alive)", n)
	}
	if !alive(dialed(t, e.Address)) {
		t.Fatal("alive says an open idle connection is closed")
	}
}

func dialed(t *testing.T, addr string) net.Conn {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A client that goes away in the middle of a long response: the gateway closes its
// connection to the exit instead of reading the rest of the response for nobody.
func TestAbandonedResponseClosesExitConnection(t *testing.T) {
	var written atomic.Int64
	chunk := bytes.Repeat([]byte("x"), 32<<10)
	e := startAnsweringExit(t, time.Minute, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1073741824") // 1 GiB, far more than is read
		for written.Load() < 1<<30 {
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	h := newHarness(t, nil, nil)
	h.chooser.exits = []Exit{e.Exit}
	c := h.client("crawler", tokenCrawlers)
	resp, err := c.Get("http://site.test/huge")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	c.Transport.(*http.Transport).CloseIdleConnections()
	resp.Body.Close() // closes the client's connection: its body was not read to the end
	testutil.WaitFor(t, testutil.WaitLong, "the gateway to close its connection to the exit", func() (bool, error) {
		return e.ended.Load() == 1, nil
	})
	if n := written.Load(); n > 256<<20 {
		t.Fatalf("the exit wrote %d MiB of an abandoned response before its connection closed", n>>20)
	}
}
