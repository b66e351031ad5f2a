package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
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
	// The same exit as the other benchmarks: a Go forward proxy in this process.
	b.Run("exit=go", func(b *testing.B) {
		exit := startTestExit(b, "crawlers", "a", "127.0.0.113")
		keepAliveRequests(b, exit.Exit, newHarness(b, []*testExit{exit}, nil))
	})
	// What a proxy VM runs: Debian's tinyproxy, which closes the client's connection
	// after each request, direct or from the gateway.
	b.Run("exit=tinyproxy", func(b *testing.B) {
		exit := startTinyproxy(b, "tp-bench", "127.0.0.114")
		h := newHarness(b, nil, nil)
		h.chooser.exits = []Exit{exit}
		keepAliveRequests(b, exit, h)
	})
}

// keepAliveRequests times small GETs of one site, alternating a client that keeps its
// connection to exit alive and one that keeps its connection to the gateway alive.
func keepAliveRequests(b *testing.B, exit Exit, h *harness) {
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
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("GET %s: %s", s.url, resp.Status)
		}
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
func connectAcceptor(tb testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
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

// openTunnels opens n CONNECT tunnels to addr with the given credentials.
func openTunnels(tb testing.TB, addr, user, password string, n int) []net.Conn {
	conns := make([]net.Conn, 0, n)
	req := fmt.Sprintf("CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\nProxy-Authorization: %s\r\n\r\n", basicAuth(user, password))
	buf := make([]byte, 512)
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			tb.Fatalf("tunnel %d of %d: %v", len(conns), n, err)
		}
		io.WriteString(c, req)
		if k, err := c.Read(buf); err != nil || k < 12 || string(buf[9:12]) != "200" {
			tb.Fatalf("tunnel %d of %d: %q %v", len(conns), n, buf[:k], err)
		}
		conns = append(conns, c)
	}
	return conns
}

// TestIdleTunnelHelperProcess is the other side of BenchmarkIdleTunnelMemory, run in a
// process of its own (so that its sockets count against its own descriptor limit): an
// exit that accepts every CONNECT and the clients that open the tunnels. It does nothing
// in a normal test run.
func TestIdleTunnelHelperProcess(t *testing.T) {
	if os.Getenv("GATEWAY_BENCH_HELPER") != "1" {
		return
	}
	raiseNoFile()
	fmt.Printf("exit %s\n", connectAcceptor(t))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var addr, user, password string
		var n int
		if _, err := fmt.Sscan(in.Text(), &addr, &n, &user, &password); err != nil {
			t.Fatalf("helper: %q: %v", in.Text(), err)
		}
		conns := openTunnels(t, addr, user, password, n)
		fmt.Printf("opened %d\n", len(conns))
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
	}
}

// raiseNoFile raises the soft descriptor limit as far as the hard one allows (and the
// hard one too where the process may) and returns the soft limit.
func raiseNoFile() uint64 {
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	want := syscall.Rlimit{Cur: 1 << 17, Max: max(lim.Max, 1<<17)}
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want) != nil {
		lim.Cur = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	return lim.Cur
}

// BenchmarkIdleTunnelMemory: the gateway's memory for each of many open idle tunnels
// (GATEWAY_BENCH_TUNNELS, default 10000, fewer when the descriptor limit, which needs two
// per tunnel in the gateway's process, does not allow that many): the growth of the
// heap and goroutine stacks of the gateway's process, whose clients and exit run in
// another process, divided by the count. Kernel socket buffers are not in it.
func BenchmarkIdleTunnelMemory(b *testing.B) {
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("GATEWAY_BENCH_TUNNELS")); err == nil && v > 0 {
		n = v
	}
	if limit := raiseNoFile(); uint64(2*n+200) > limit {
		b.Logf("RLIMIT_NOFILE is %d here and cannot be raised: measuring %d tunnels, not %d", limit, (limit-200)/2, n)
		n = int(limit-200) / 2
	}
	helper := exec.Command(os.Args[0], "-test.run=^TestIdleTunnelHelperProcess$", "-test.v=false")
	helper.Env = append(os.Environ(), "GATEWAY_BENCH_HELPER=1")
	helper.Stderr = os.Stderr
	stdin, _ := helper.StdinPipe()
	stdout, _ := helper.StdoutPipe()
	if err := helper.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); helper.Wait() }()
	out := bufio.NewScanner(stdout)
	var exitAddr string
	if !out.Scan() {
		b.Fatalf("the helper process said nothing: %v", out.Err())
	}
	fmt.Sscanf(out.Text(), "exit %s", &exitAddr)
	h := newHarness(b, nil, nil)
	h.chooser.exits = []Exit{{Namespace: "crawlers", Name: "acceptor", Address: exitAddr, EgressIP: "127.0.0.114"}}
	for i := 0; i < b.N; i++ {
		before := liveBytes()
		fmt.Fprintf(stdin, "%s %d crawler %s\n", h.httpAddr, n, tokenCrawlers)
		if !out.Scan() || out.Text() != fmt.Sprintf("opened %d", n) {
			b.Fatalf("the helper process: %q %v", out.Text(), out.Err())
		}
		if open := counterValue(b, h.reg, "proxy_operator_gateway_tunnels_open", "", ""); int(open) != n*(i+1) {
			b.Fatalf("tunnels open = %v, want %d", open, n*(i+1))
		}
		per := float64(int64(liveBytes())-int64(before)) / float64(n)
		b.ReportMetric(float64(n), "tunnels")
		b.ReportMetric(per/1024, "gateway-KiB/tunnel")
		b.ReportMetric(per/(32*1024), "ratio-to-32KiB")
		if i+1 < b.N {
			b.Fatal("run with -benchtime=1x: each round keeps its tunnels open")
		}
	}
}
