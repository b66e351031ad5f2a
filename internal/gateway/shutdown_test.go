package gateway

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// echoServer echoes every connection's bytes back.
func echoServer(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func echoOnce(t *testing.T, c net.Conn, r io.Reader, msg string) {
	t.Helper()
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("writing into the tunnel: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(r, got); err != nil || string(got) != msg {
		t.Fatalf("echo through the tunnel: %q, %v", got, err)
	}
}

// Shutdown stops accepting at once, lets an open tunnel carry bytes until its client
// closes it, then returns; the log says so. The tunnels-open gauge follows.
func TestShutdownDrainsTunnels(t *testing.T) {
	exit := startTestExit(t, "crawlers", "a", "127.0.0.95")
	h := newHarness(t, []*testExit{exit}, nil)
	c, br, resp := rawConnect(t, h.httpAddr, echoServer(t), "crawler", tokenCrawlers)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	echoOnce(t, c, br, "before")
	if n := counterValue(t, h.reg, "proxy_operator_gateway_tunnels_open", "", ""); n != 1 {
		t.Errorf("tunnels open = %v, want 1", n)
	}

	done := make(chan error, 1)
	go func() { done <- h.g.Shutdown(context.Background()) }()
	testutil.WaitFor(t, testutil.WaitLong, "the gateway to refuse new connections", func() (bool, error) {
		nc, err := net.DialTimeout("tcp", h.httpAddr, time.Second)
		if err != nil {
			return true, nil
		}
		nc.Close()
		return false, errors.New("a new connection was accepted")
	})
	echoOnce(t, c, br, "while draining")
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with a tunnel open", err)
	default:
	}
	c.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Shutdown = %v, want nil once the tunnel closed", err)
		}
	case <-time.After(testutil.WaitLong):
		t.Fatal("Shutdown did not return after the last tunnel closed")
	}
	if !h.logs.contains("gateway draining") || !h.logs.contains("gateway drained") {
		t.Errorf("the log does not tell the drain: %q", h.logs.lines)
	}
	if n := counterValue(t, h.reg, "proxy_operator_gateway_tunnels_open", "", ""); n != 0 {
		t.Errorf("tunnels open = %v after the drain, want 0", n)
	}
	if up := counterValue(t, h.reg, "proxy_operator_gateway_bytes_total", "direction", "upstream"); up != float64(len("before")+len("while draining")) {
		t.Errorf("upstream bytes = %v, want %d", up, len("before")+len("while draining"))
	}
}

// When the grace period ends first, Shutdown closes the tunnels still open and returns
// the context's error.
func TestShutdownGraceOver(t *testing.T) {
	exit := startTestExit(t, "crawlers", "a", "127.0.0.96")
	h := newHarness(t, []*testExit{exit}, nil)
	c, br, resp := rawConnect(t, h.httpAddr, echoServer(t), "crawler", tokenCrawlers)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	echoOnce(t, c, br, "hello")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := h.g.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown = %v, want the deadline's error", err)
	}
	if _, err := io.ReadAll(br); err != nil {
		t.Errorf("the client's tunnel did not end cleanly: %v", err)
	}
	if !h.logs.contains("grace period over") {
		t.Errorf("the log does not say the grace period ended: %q", h.logs.lines)
	}
}
