package healthtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A killed proxy takes its CONNECT tunnels with it: a tunnel is a hijacked connection,
// which httptest.Server no longer tracks, so closing the server alone left it open and a
// crawler kept a live exit through a proxy the test had killed.
func TestCloseCutsTunnels(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	p := New(t, "")
	c, err := net.Dial("tcp", proxyAddr(p))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %[1]s HTTP/1.1\r\nHost: %[1]s\r\n\r\n", echo.Addr())
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %v %v", res, err)
	}
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("through the tunnel: %q %v", line, err)
	}

	p.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // a generous bound: the cut is at once
	_, _ = io.WriteString(c, "after\n")
	line, err := br.ReadString('\n')
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the tunnel still answers after Close: %q %v", line, err)
	}
}

// A forward still waiting on its target when the proxy is killed ends at once, without
// an answer, and Close does not wait for the target.
func TestCloseCutsForwardsInFlight(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
	}))
	defer target.Close()
	defer close(release)
	p := New(t, "")
	proxyURL := "http://" + proxyAddr(p)
	hc := &http.Client{Transport: &http.Transport{Proxy: func(*http.Request) (*url.URL, error) { return url.Parse(proxyURL) }}}
	errc := make(chan error, 1)
	go func() {
		res, err := hc.Get(target.URL + "/held")
		if err == nil {
			res.Body.Close()
			err = fmt.Errorf("answered %s", res.Status)
		}
		errc <- err
	}()
	<-arrived
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited for the target of a forward in flight")
	}
	if err := <-errc; err == nil || strings.Contains(err.Error(), "answered") {
		t.Fatalf("the forward in flight got %v, want its connection cut", err)
	}
	// A connection made after Close is refused.
	if res, err := hc.Get(target.URL + "/late"); err == nil {
		res.Body.Close()
		t.Fatalf("a request after Close was answered %s", res.Status)
	}
}

func proxyAddr(p *ForwardProxy) string {
	return net.JoinHostPort(p.Host, strconv.Itoa(int(p.Port)))
}

// A hanging proxy never answers, not even when it is killed: a probe in flight then
// fails, as through a real proxy process that died.
func TestCloseOfAHangingProxyAnswersNothing(t *testing.T) {
	for range 20 { // the wrong answer raced the connection's close
		p := New(t, "")
		p.SetMode(Hang)
		hc := &http.Client{Transport: &http.Transport{Proxy: func(*http.Request) (*url.URL, error) {
			return url.Parse("http://" + proxyAddr(p))
		}}}
		errc := make(chan error, 1)
		go func() {
			res, err := hc.Get("http://example.invalid/probe")
			if err == nil {
				res.Body.Close()
				err = fmt.Errorf("answered %s", res.Status)
			}
			errc <- err
		}()
		for deadline := time.Now().Add(30 * time.Second); p.Requests.Load() == 0; runtime.Gosched() {
			if time.Now().After(deadline) {
				t.Fatal("the probe did not reach the hanging proxy within 30 s")
			}
		}
		p.Close()
		if err := <-errc; err == nil || strings.Contains(err.Error(), "answered") {
			t.Fatalf("a probe through a hanging proxy that was killed got %v, want its connection cut", err)
		}
	}
}
