package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The benchmarks compare the gateway with a direct connection to the same exit, on
// loopback, alternating the two so both see the same load; each reports both figures and
// their ratio (gateway/direct, or the gateway's extra for setup time).

// streamServer writes an endless stream to every connection.
func streamServer(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	buf := make([]byte, 256<<10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// directConnect opens a tunnel to target straight through the exit, with its credentials.
func directConnect(b *testing.B, e Exit, target string) (net.Conn, *bufio.Reader) {
	c, br, resp := rawConnect(b, e.Address, target, e.User, e.Password)
	if resp.StatusCode != 200 {
		b.Fatalf("direct CONNECT: %s", resp.Status)
	}
	return c, br
}

func gatewayConnect(b *testing.B, h *harness, target string) (net.Conn, *bufio.Reader) {
	c, br, resp := rawConnect(b, h.httpAddr, target, "crawler", tokenCrawlers)
	if resp.StatusCode != 200 {
		b.Fatalf("gateway CONNECT: %s", resp.Status)
	}
	return c, br
}

// BenchmarkTunnelThroughput: bulk bytes from a site through one tunnel.
func BenchmarkTunnelThroughput(b *testing.B) {
	exit := startTestExit(b, "crawlers", "a", "127.0.0.111")
	h := newHarness(b, []*testExit{exit}, nil)
	target := streamServer(b)
	dc, dbr := directConnect(b, exit.Exit, target)
	gc, gbr := gatewayConnect(b, h, target)
	defer dc.Close()
	defer gc.Close()
	const chunk = 8 << 20
	var direct, gateway time.Duration
	read := func(c net.Conn, r io.Reader) time.Duration {
		c.SetDeadline(time.Now().Add(time.Minute))
		start := time.Now()
		if _, err := io.CopyN(io.Discard, r, chunk); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	b.SetBytes(chunk)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct += read(dc, dbr)
		gateway += read(gc, gbr)
	}
	b.StopTimer()
	mbps := func(d time.Duration) float64 { return float64(chunk) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(direct), "direct-MB/s")
	b.ReportMetric(mbps(gateway), "gateway-MB/s")
	b.ReportMetric(mbps(gateway)/mbps(direct), "ratio")
}

// BenchmarkTunnelSetup: from dialing to the CONNECT 200, direct and through the gateway
// (whose time includes its own CONNECT to the exit).
func BenchmarkTunnelSetup(b *testing.B) {
	exit := startTestExit(b, "crawlers", "a", "127.0.0.112")
	h := newHarness(b, []*testExit{exit}, nil)
	target := echoServer(b)
	var direct, gateway []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		c, _ := directConnect(b, exit.Exit, target)
		direct = append(direct, time.Since(start))
		c.Close()
		start = time.Now()
		c, _ = gatewayConnect(b, h, target)
		gateway = append(gateway, time.Since(start))
		c.Close()
	}
	b.StopTimer()
	dm, gm := median(direct), median(gateway)
	b.ReportMetric(float64(dm.Microseconds()), "direct-µs-median")
	b.ReportMetric(float64(gm.Microseconds()), "gateway-µs-median")
	b.ReportMetric(float64((gm - dm).Microseconds()), "extra-µs-median")
	b.ReportMetric(float64(gm)/float64(dm), "ratio")
}

func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}

// BenchmarkKeepAliveRequests: small GETs over one kept-alive client connection.
func BenchmarkKeepAliveRequests(b *testing.B) {
	exit := startTestExit(b, "crawlers", "a", "127.0.0.113")
	h := newHarness(b, []*testExit{exit}, nil)
	s := startSite(b)
	direct := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: exit.Address,
		User: url.UserPassword(exit.User, exit.Password)})}}
	gw := h.client("crawler", tokenCrawlers)
	get := func(c *http.Client) time.Duration {
		start := time.Now()
		resp, err := c.Get(s.url)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return time.Since(start)
	}
	get(direct)
	get(gw)
	var dt, gt time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dt += get(direct)
		gt += get(gw)
	}
	b.StopTimer()
	rps := func(d time.Duration) float64 { return float64(b.N) / d.Seconds() }
	b.ReportMetric(rps(dt), "direct-req/s")
	b.ReportMetric(rps(gt), "gateway-req/s")
	b.ReportMetric(rps(gt)/rps(dt), "ratio")
}

// connectAcceptor is an exit that answers every CONNECT with 200 and then holds the
// connection, reading; for counting what idle tunnels cost.
func connectAcceptor(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReaderSize(c, 512)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n")
				var one [1]byte
				c.Read(one[:])
			}()
		}
	}()
	return ln.Addr().String()
}

func liveBytes() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// BenchmarkIdleTunnelMemory: the gateway's memory for each of many open idle tunnels
// (GATEWAY_BENCH_TUNNELS, default 10000): the process's heap and stacks with the tunnels
// open through the gateway, less the same count opened straight to the exit (the client's
// and the exit's share, which are in this process too), divided by the count. Kernel
// socket buffers are not in it.
func BenchmarkIdleTunnelMemory(b *testing.B) {
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("GATEWAY_BENCH_TUNNELS")); err == nil && v > 0 {
		n = v
	}
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	if need := uint64(6*n + 1000); lim.Cur < need {
		lim.Cur, lim.Max = need, max(lim.Max, need)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
			n = int(lim.Cur-1000) / 6
			b.Logf("could not raise RLIMIT_NOFILE (%v): measuring %d tunnels", err, n)
		}
	}
	exitAddr := connectAcceptor(b)
	exit := Exit{Namespace: "crawlers", Name: "acceptor", Address: exitAddr, EgressIP: "127.0.0.114"}
	h := newHarness(b, nil, nil)
	h.chooser.exits = []Exit{exit}
	open := func(addr, user, password string) []net.Conn {
		conns := make([]net.Conn, 0, n)
		req := fmt.Sprintf("CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nProxy-Authorization: %s\r\n\r\n", basicAuth(user, password))
		buf := make([]byte, 512)
		for range n {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatalf("tunnel %d of %d: %v", len(conns), n, err)
			}
			io.WriteString(c, req)
			if k, err := c.Read(buf); err != nil || string(buf[9:12]) != "200" {
				b.Fatalf("tunnel %d of %d: %q %v", len(conns), n, buf[:k], err)
			}
			conns = append(conns, c)
		}
		return conns
	}
	closeAll := func(conns []net.Conn) {
		for _, c := range conns {
			c.Close()
		}
	}
	for i := 0; i < b.N; i++ {
		base := liveBytes()
		direct := open(exitAddr, "", "")
		directCost := liveBytes() - base
		closeAll(direct)

		base = liveBytes()
		through := open(h.httpAddr, "crawler", tokenCrawlers)
		gatewayCost := liveBytes() - base
		if n := counterValue(b, h.reg, "proxy_operator_gateway_tunnels_open", "", ""); int(n) != len(through) {
			b.Fatalf("tunnels open = %v, want %d", n, len(through))
		}
		closeAll(through)
		per := float64(int64(gatewayCost)-int64(directCost)) / float64(n)
		b.ReportMetric(float64(n), "tunnels")
		b.ReportMetric(per/1024, "gateway-KiB/tunnel")
		b.ReportMetric(per/(32*1024), "ratio-to-32KiB")
	}
}
