package gateway

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// runClient runs a client that contains none of the gateway's code and returns its
// output.
func runClient(t *testing.T, name string, args ...string) string {
	t.Helper()
	needTool(t, name, func() error { _, err := exec.LookPath(name); return err })
	ctx, cancel := context.WithTimeout(context.Background(), testutil.WaitLong)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// curl with the options in the proxy URL's user name as they are (no percent-encoding):
// plain HTTP, a tunnel (--proxytunnel) and SOCKS5 with the name resolved by the gateway
// (--socks5-hostname); and curl shown the 407's body.
func TestCurl(t *testing.T) {
	exit := startTestExit(t, "crawlers", "a", "127.0.0.131")
	s := startSite(t)
	h := newHarness(t, []*testExit{exit}, nil)
	proxy := "http://crawler+ns=crawlers+session=c1+sesstime=90s:" + tokenCrawlers + "@" + h.httpAddr
	_, port, _ := net.SplitHostPort(s.addr)
	local := "http://localhost:" + port + "/"

	if out := runClient(t, "curl", "-sS", "-x", proxy, s.url); out != "hello 127.0.0.131" {
		t.Errorf("curl -x: %q", out)
	}
	out := runClient(t, "curl", "-sS", "-i", "-p", "-x", proxy, s.url)
	if !strings.Contains(out, "X-Egress-Proxy: crawlers/a") || !strings.HasSuffix(out, "hello 127.0.0.131") {
		t.Errorf("curl --proxytunnel: %q", out)
	}
	if out := runClient(t, "curl", "-sS", "--socks5-hostname", h.socksAddr, "-U", "crawler+ns=crawlers:"+tokenCrawlers, local); out != "hello 127.0.0.131" {
		t.Errorf("curl --socks5-hostname: %q", out)
	}
	out = runClient(t, "curl", "-sS", "-w", "%{http_code}", "-x", "http://crawler+colour=red:"+tokenCrawlers+"@"+h.httpAddr, s.url)
	if !strings.Contains(out, `unknown option "colour"`) || !strings.HasSuffix(out, "407") {
		t.Errorf("curl with a bad option: %q", out)
	}
}

// Python requests, which reads the user name out of the proxy URL with its own parser.
func TestPythonRequests(t *testing.T) {
	needTool(t, "python3 with requests", exec.Command("python3", "-c", "import requests").Run)
	exit := startTestExit(t, "crawlers", "a", "127.0.0.132")
	s := startSite(t)
	h := newHarness(t, []*testExit{exit}, nil)
	proxy := "http://crawler+session=p~1.x_y-z+strict:" + tokenCrawlers + "@" + h.httpAddr
	script := `import sys, requests
r = requests.get(sys.argv[1], proxies={"http": sys.argv[2]}, timeout=20)
print(r.status_code, r.headers.get("X-Egress-Proxy"), r.text)`
	out := runClient(t, "python3", "-c", script, s.url, proxy)
	if want := "200 crawlers/a hello 127.0.0.132\n"; out != want {
		t.Errorf("python requests: %q, want %q", out, want)
	}
	if n := counterValue(t, h.reg, "proxy_operator_gateway_sessions_live", "", ""); n != 1 {
		t.Errorf("sessions live = %v, want the session p~1.x_y-z", n)
	}
}

// needTool skips the test when a client it drives is missing, or fails it when the run
// must test everything (make test-unit sets testenv.RequireVar; hack/deps.sh installs
// curl, tinyproxy and python3-requests for it).
func needTool(t testing.TB, what string, check func() error) {
	t.Helper()
	if err := check(); err != nil {
		if os.Getenv(testenv.RequireVar) != "" {
			t.Fatalf("%s is needed (%v): hack/deps.sh installs it", what, err)
		}
		t.Skipf("%s is not installed here (%v): hack/deps.sh installs it", what, err)
	}
}
