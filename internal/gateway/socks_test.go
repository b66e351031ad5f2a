package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/proxy"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// SOCKS5 with username/password, through a client library that contains none of the
// gateway's code, to a destination given as an IPv4 address, a domain name and an IPv6
// address; the same options and token as the HTTP proxy's.
func TestSOCKS5Connect(t *testing.T) {
	exit := startTestExit(t, "crawlers", "exit-a", "127.0.0.61")
	s := startSite(t)
	_, port, _ := net.SplitHostPort(s.addr)
	h := newHarness(t, []*testExit{exit}, nil)
	dialer, err := proxy.SOCKS5("tcp", h.socksAddr, &proxy.Auth{User: "crawler+ns=crawlers", Password: tokenCrawlers}, proxy.Direct)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{DialContext: dialer.(proxy.ContextDialer).DialContext}}
	for _, host := range []string{"127.0.0.1", "localhost"} {
		resp, err := c.Get("http://" + net.JoinHostPort(host, port) + "/")
		if err != nil {
			t.Fatalf("GET through SOCKS5 to %s: %v", host, err)
		}
		if body := readBody(t, resp); body != "hello 127.0.0.61" {
			t.Errorf("to %s: %q, want the site to see the exit's 127.0.0.61", host, body)
		}
	}

	ln6, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Logf("no IPv6 loopback here (%v): the IPv6 destination is checked by TestSOCKS5Replies' address parsing only", err)
		return
	}
	defer ln6.Close()
	go func() {
		c, err := ln6.Accept()
		if err == nil {
			io.WriteString(c, "v6 site")
			c.Close()
		}
	}()
	// The test exit dials from an IPv4 source; an IPv6 destination needs an exit of that
	// family, which is what the ip=6 option is for.
	exit6 := startTestExit(t, "crawlers", "exit-6", "::1")
	h6 := newHarness(t, []*testExit{exit6}, nil)
	d6, _ := proxy.SOCKS5("tcp", h6.socksAddr, &proxy.Auth{User: "crawler+ip=6", Password: tokenCrawlers}, proxy.Direct)
	conn, err := d6.Dial("tcp", ln6.Addr().String())
	if err != nil {
		t.Fatalf("SOCKS5 to %s: %v", ln6.Addr(), err)
	}
	defer conn.Close()
	if got, _ := io.ReadAll(conn); string(got) != "v6 site" {
		t.Errorf("through SOCKS5 to an IPv6 destination: %q", got)
	}
}

// socksGreet opens a SOCKS5 connection, offers the given methods and returns the
// server's choice.
func socksGreet(t *testing.T, addr string, methods ...byte) (net.Conn, *bufio.Reader, [2]byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	c.Write(append([]byte{5, byte(len(methods))}, methods...))
	br := bufio.NewReader(c)
	var got [2]byte
	if _, err := io.ReadFull(br, got[:]); err != nil {
		t.Fatalf("reading the method choice: %v", err)
	}
	return c, br, got
}

func socksAuth(t *testing.T, c net.Conn, br *bufio.Reader, user, password string) [2]byte {
	t.Helper()
	c.Write(append(append(append([]byte{1, byte(len(user))}, user...), byte(len(password))), password...))
	var got [2]byte
	if _, err := io.ReadFull(br, got[:]); err != nil {
		t.Fatalf("reading the auth status: %v", err)
	}
	return got
}

// The SOCKS5 refusals, byte for byte: no acceptable method, failed authentication (bad
// token, bad options), an unsupported command, no exit; and the success reply's bound
// address is the exit's egress address.
func TestSOCKS5Replies(t *testing.T) {
	exit := startTestExit(t, "crawlers", "exit-a", "127.0.0.62")
	s := startSite(t)
	h := newHarness(t, []*testExit{exit}, nil)

	if _, _, got := socksGreet(t, h.socksAddr, 0x00); got != [2]byte{5, 0xff} {
		t.Errorf("offering only no-auth: got %v, want 05 ff", got)
	}
	for _, tc := range []struct{ user, password string }{
		{"crawler", "wrong"}, {"crawler+colour=red", tokenCrawlers}, {"crawler+ns=other", tokenCrawlers},
	} {
		c, br, got := socksGreet(t, h.socksAddr, 0x00, 0x02)
		if got != [2]byte{5, 2} {
			t.Fatalf("method choice %v, want 05 02", got)
		}
		if st := socksAuth(t, c, br, tc.user, tc.password); st != [2]byte{1, 1} {
			t.Errorf("%s:%s: auth status %v, want 01 01", tc.user, tc.password, st)
		}
	}

	request := func(cmd byte, user string) []byte {
		c, br, _ := socksGreet(t, h.socksAddr, 0x02)
		if st := socksAuth(t, c, br, user, tokenCrawlers); st != [2]byte{1, 0} {
			t.Fatalf("auth status %v, want 01 00", st)
		}
		host, port, _ := net.SplitHostPort(s.addr)
		var p int
		fmt.Sscan(port, &p)
		req := append([]byte{5, cmd, 0, 1}, net.ParseIP(host).To4()...)
		c.Write(append(req, byte(p>>8), byte(p)))
		reply := make([]byte, 10)
		if _, err := io.ReadFull(br, reply); err != nil {
			t.Fatalf("reading the reply: %v", err)
		}
		return reply
	}
	if got := request(0x02, "crawler"); got[1] != socksCmdUnsupported {
		t.Errorf("BIND: reply %v, want code 07", got)
	}
	if got := request(0x01, "crawler+ip=6"); got[1] != socksNetUnreachable {
		t.Errorf("no exit of family 6: reply %v, want code 03", got)
	}
	if got, want := request(0x01, "crawler"), []byte{5, 0, 0, 1, 127, 0, 0, 62}; string(got[:8]) != string(want) {
		t.Errorf("success reply %v, want it to start %v (the egress address)", got, want)
	}
	if n := counterValue(t, h.reg, "proxy_operator_gateway_tunnels_total", "outcome", "auth_failed"); n != 4 {
		t.Errorf("tunnels auth_failed = %v, want 4 (no method, bad token, bad option, foreign namespace)", n)
	}
	// The gateway logs a refused handshake after it has answered it: wait for the line.
	testutil.WaitFor(t, testutil.WaitLong, "the log to say why a SOCKS5 authentication failed (unknown option \"colour\")", func() (bool, error) {
		return h.logs.contains(`unknown option \"colour\"`), nil
	})
}
