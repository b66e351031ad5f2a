package gateway

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// startTinyproxy runs Debian's tinyproxy as an exit: Basic credentials of its own and
// an outgoing address (Bind) of its own.
func startTinyproxy(t testing.TB, name, egressIP string) Exit {
	t.Helper()
	needTool(t, "tinyproxy", func() error { _, err := exec.LookPath("tinyproxy"); return err })
	bin, err := exec.LookPath("tinyproxy")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, port, _ := net.SplitHostPort(addr)
	e := Exit{Namespace: "crawlers", Name: name, Address: addr, EgressIP: egressIP, User: "tp-" + name, Password: "tp-secret-" + name}
	conf := filepath.Join(t.TempDir(), "tinyproxy.conf")
	os.WriteFile(conf, []byte(fmt.Sprintf("Port %s\nListen 127.0.0.1\nBind %s\nTimeout 10\nMaxClients 50\nAllow 127.0.0.1\nBasicAuth %s %s\nLogLevel Critical\n",
		port, egressIP, e.User, e.Password)), 0o644)
	cmd := exec.Command(bin, "-d", "-c", conf)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	testutil.WaitFor(t, testutil.WaitLong, "tinyproxy to listen on "+addr, func() (bool, error) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false, err
		}
		c.Close()
		return true, nil
	})
	return e
}

// Real tinyproxy exits: a request and a tunnel through them; tinyproxy's own failure
// (it cannot reach the site) is told from a site's 502 it relays: the first is retried on
// the other exit and reported, the second reaches the client as it is.
func TestTinyproxyExits(t *testing.T) {
	a := startTinyproxy(t, "tp-a", "127.0.0.101")
	b := startTinyproxy(t, "tp-b", "127.0.0.102")
	s := startSite(t)
	h := newHarness(t, nil, func(c *Config) { c.MaxAttempts = 2 })
	h.chooser.exits = []Exit{a, b}
	c := h.client("crawler", tokenCrawlers)

	ip, resp := egressOf(t, c, s.url)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderEgressIP) != ip || !strings.HasPrefix(ip, "127.0.0.10") {
		t.Fatalf("through tinyproxy: %s from %q, %s %q", resp.Status, ip, HeaderEgressIP, resp.Header.Get(HeaderEgressIP))
	}

	conn, br, cresp := rawConnect(t, h.httpAddr, echoServer(t), "crawler", tokenCrawlers)
	if cresp.StatusCode != 200 || !strings.HasPrefix(cresp.Header.Get(HeaderEgressProxy), "crawlers/tp-") {
		t.Fatalf("CONNECT through tinyproxy: %s %v", cresp.Status, cresp.Header)
	}
	conn.SetDeadline(time.Now().Add(testutil.WaitLong))
	echoOnce(t, conn, br, "through tinyproxy")

	s.status.Store(http.StatusBadGateway)
	resp, err := c.Get(s.url)
	if err != nil {
		t.Fatal(err)
	}
	if body := readBody(t, resp); resp.StatusCode != 502 || !strings.HasPrefix(body, "hello 127.0.0.10") {
		t.Errorf("a site's own 502 through tinyproxy: %s %q, want it relayed", resp.Status, body)
	}
	if u, _ := h.reporter.got(); len(u) != 0 {
		t.Errorf("a site's 502 was reported against %v", u)
	}

	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := closed.Addr().String()
	closed.Close()
	resp, err = c.Get("http://" + deadAddr + "/")
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if resp.StatusCode != 502 || !strings.Contains(body, "tried 2 exits (crawlers/tp-") || !strings.Contains(body, "itself") {
		t.Errorf("tinyproxy's own failure: %s %q, want 502 after both exits", resp.Status, body)
	}
	if u, _ := h.reporter.got(); len(u) != 2 {
		t.Errorf("Reporter.Unreachable heard %v, want both tinyproxies", u)
	}
}
