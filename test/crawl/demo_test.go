//go:build integration

package crawl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// TestDemoExternal runs the VM-less demo as a user does (hack/demo.sh up-external, what
// make demo-external runs) on ports of its own, in a state directory of its own: first
// with one of its ports held, which must fail before anything starts, naming the port and
// the holder; then for real, ending with discovery handing out the three External
// Proxies and a request through the gateway; then every curl example of the docs against
// it; then hack/demo.sh down, after
// which none of the processes it started is left.
func TestDemoExternal(t *testing.T) {
	for _, tool := range []string{"tinyproxy", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (hack/crawl-deps.sh installs it): %v", tool, err)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	port := func(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }
	disc, metrics := testutil.FreeAddr(t), testutil.FreeAddr(t)
	env := append(os.Environ(), "DEMO_STATE="+state, "DEMO_TIMEOUT=120",
		"DEMO_METRICS_PORT="+port(metrics), "DEMO_HEALTH_PORT="+port(testutil.FreeAddr(t)),
		"DEMO_DISCOVERY_PORT="+port(disc), "DEMO_PROXY_PORT="+freeProxyPort(t),
		"DEMO_GATEWAY_PORT="+port(testutil.FreeAddr(t)), "DEMO_GATEWAY_SOCKS_PORT="+port(testutil.FreeAddr(t)),
		"DEMO_GATEWAY_HEALTH_PORT="+port(testutil.FreeAddr(t)))
	demo := func(ctx context.Context, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(root, "hack/demo.sh"), args...)
		cmd.Dir, cmd.Env = root, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	t.Run("a port held", func(t *testing.T) {
		ln, err := net.Listen("tcp", disc)
		if err != nil {
			t.Fatal(err)
		}
		out, err := demo(ctx, "up-external")
		_ = ln.Close()
		if err == nil {
			t.Fatalf("up-external succeeded with %s held:\n%s", disc, out)
		}
		self, _ := os.Executable()
		want := fmt.Sprintf("discovery (DEMO_DISCOVERY_PORT): %s is taken (address already in use); held by pid %d (%s", disc, os.Getpid(), self)
		if !strings.Contains(out, want) {
			t.Errorf("the demo's output does not say %q:\n%s", want, out)
		}
		for _, f := range []string{"controlplane.pid", "manager.pid", "tinyproxy-crawler-1.pid"} {
			if _, err := os.Stat(filepath.Join(state, f)); err == nil {
				t.Errorf("%s exists: the demo started something before checking its ports", f)
			}
		}
	})
	if t.Failed() {
		return
	}

	start := time.Now()
	out, err := demo(ctx, "up-external")
	t.Cleanup(func() {
		if out, err := demo(context.Background(), "down"); err != nil {
			t.Errorf("hack/demo.sh down: %v\n%s", err, out)
		}
	})
	if err != nil {
		t.Fatalf("hack/demo.sh up-external: %v\n%s", err, out)
	}
	t.Logf("hack/demo.sh up-external took %s", time.Since(start).Round(100*time.Millisecond))
	// It ends with a request through the gateway, which names the exit it took: one of
	// the three External Proxies, whose tinyproxy answered with its own address.
	for _, want := range []string{"export API=http://" + disc, "discovery-token", "make demo-down",
		"through the gateway", "HTTP/1.1 200 OK", "X-Egress-Proxy: crawl/crawler-"} {
		if !strings.Contains(out, want) {
			t.Errorf("the demo's closing words do not say %q:\n%s", want, out)
		}
	}
	tok, err := os.ReadFile(filepath.Join(state, "discovery-token"))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tok))
	pids := map[string]int{}
	for _, f := range []string{"manager.pid", "gateway.pid", "controlplane.pid", "controlplane/etcd.pid", "controlplane/kube-apiserver.pid",
		"tinyproxy-crawler-1.pid", "tinyproxy-crawler-2.pid", "tinyproxy-crawler-3.pid"} {
		b, err := os.ReadFile(filepath.Join(state, f))
		if err != nil {
			t.Fatal(err)
		}
		pids[f], _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}

	// What make demo met with another program on its metrics port: the manager exits in
	// its first second, and the wait for /readyz ends then, with the manager's error.
	t.Run("a manager that exits early", func(t *testing.T) {
		logFile := filepath.Join(t.TempDir(), "manager.log")
		f, err := os.Create(logFile)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		health := testutil.FreeAddr(t)
		mgr := exec.Command(filepath.Join(root, "bin/manager"), "--providers-config=", "--kubeconfig="+filepath.Join(state, "controlplane/kubeconfig"),
			"--metrics-bind-address="+metrics, "--metrics-secure=false", "--health-probe-bind-address="+health, "--discovery-bind-address=0")
		mgr.Stdout, mgr.Stderr = f, f
		if err := mgr.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = mgr.Wait(); close(exited) }()
		defer func() { _ = mgr.Process.Kill(); <-exited }()
		start := time.Now()
		out, err := exec.Command(filepath.Join(root, "bin/democtl"), "wait-ready", "--url", "http://"+health+"/readyz",
			"--pid", strconv.Itoa(mgr.Process.Pid), "--log", logFile, "--timeout", "120s").CombinedOutput()
		took := time.Since(start)
		if err == nil {
			t.Fatalf("wait-ready succeeded for a manager whose metrics port %s is held:\n%s", metrics, out)
		}
		want := "listen tcp " + metrics + ": bind: address already in use"
		if !strings.Contains(string(out), "exited before it was ready") || !strings.Contains(string(out), want) {
			t.Errorf("wait-ready does not say the manager exited, with %q:\n%s", want, out)
		}
		if took > time.Minute { // the timeout is 120 s; the manager exits in about a second
			t.Errorf("wait-ready took %s", took)
		}
		t.Logf("wait-ready ended %s after the start: %s", took.Round(10*time.Millisecond), strings.TrimSpace(string(out)))
	})

	t.Run("docs curl examples", func(t *testing.T) { runDocsExamples(t, root, "http://"+disc, token) })

	start = time.Now()
	if out, err := demo(ctx, "down"); err != nil {
		t.Fatalf("hack/demo.sh down: %v\n%s", err, out)
	}
	t.Logf("hack/demo.sh down took %s", time.Since(start).Round(100*time.Millisecond))
	for f, pid := range pids {
		if syscall.Kill(pid, 0) == nil {
			if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !bytes.Contains(stat, []byte(") Z ")) {
				t.Errorf("%s (pid %d) still runs after down", f, pid)
			}
		}
	}
}

// freeProxyPort is a port free on 127.0.0.2, .3 and .4, where the demo's tinyproxies
// listen.
func freeProxyPort(t *testing.T) string {
	t.Helper()
	for range 20 {
		_, p, _ := net.SplitHostPort(testutil.FreeAddr(t))
		free := true
		for _, ip := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
			ln, err := net.Listen("tcp", net.JoinHostPort(ip, p))
			if err != nil {
				free = false
				break
			}
			_ = ln.Close()
		}
		if free {
			return p
		}
	}
	t.Fatal("no port free on 127.0.0.2-4")
	return ""
}

// docExample is one `$ curl` command of a doc against the discovery API, with the answer
// the doc shows for it.
type docExample struct {
	where string // file:line
	cmd   string
	want  string
}

// The addresses the docs write the discovery API at.
var docAPIs = []string{"http://egress-proxies-operator-controller-manager.egress-proxies-operator-system.svc:8082", "http://proxy-operator:8082"}

var promptRE = regexp.MustCompile(`^(\s*)\$ (curl\b.*)$`)

// docsExamples extracts every `$ curl` example naming the discovery API from docs/*.md,
// the READMEs of the project and of its clients, in file order: the command with its continuation lines (until it is a
// complete shell command), and the lines after it in the same indented block, up to the
// next `$` or `#` line, as the answer shown.
func docsExamples(t *testing.T, root string) []docExample {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	more, _ := filepath.Glob(filepath.Join(root, "clients", "*", "README.md"))
	files = append(append(files, more...), filepath.Join(root, "README.md"), filepath.Join(root, "pkg", "client", "README.md"))
	var out []docExample
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(data), "\n")
		for i := 0; i < len(lines); i++ {
			m := promptRE.FindStringSubmatch(lines[i])
			if m == nil {
				continue
			}
			indent, cmd, first := len(m[1]), m[2], i
			for !completeCommand(cmd) {
				i++
				if i >= len(lines) {
					t.Fatalf("%s:%d: the command never ends", f, first+1)
				}
				cmd += "\n" + strings.TrimSpace(lines[i])
			}
			var want []string
			for i+1 < len(lines) {
				l := lines[i+1]
				trimmed := strings.TrimSpace(l)
				if trimmed != "" && (len(l)-len(strings.TrimLeft(l, " ")) < indent || strings.HasPrefix(trimmed, "$ ") || strings.HasPrefix(trimmed, "# ")) {
					break
				}
				i++
				if trimmed == "" {
					want = append(want, "")
				} else {
					want = append(want, l[indent:])
				}
			}
			if !strings.Contains(cmd, docAPIs[0]) && !strings.Contains(cmd, docAPIs[1]) {
				continue
			}
			rel, _ := filepath.Rel(root, f)
			out = append(out, docExample{where: fmt.Sprintf("%s:%d", rel, first+1), cmd: cmd, want: strings.TrimRight(strings.Join(want, "\n"), "\n")})
		}
	}
	return out
}

// completeCommand: no trailing backslash and bash parses it (no open quote).
func completeCommand(cmd string) bool {
	if strings.HasSuffix(strings.TrimSpace(cmd), `\`) {
		return false
	}
	return exec.Command("bash", "-n", "-c", cmd).Run() == nil
}

// runDocsExamples runs each example with bash, the API's address and the demo's proxies'
// addresses in place of the doc's, and TOKEN set, and checks the answer: exit 0 (pipefail),
// each HTTP status 2xx unless the doc shows an error, and the output matching the one
// shown, the proxies' egress addresses and the seconds of a cooldown aside ("..." in the
// doc stands for anything). A GET
// is tried again for up to 30 s, since feedback takes a moment to reach discovery.
func runDocsExamples(t *testing.T, root, api, token string) {
	examples := docsExamples(t, root)
	if len(examples) < 15 {
		t.Fatalf("only %d curl examples found in the docs", len(examples))
	}
	// The doc's proxies by address, to the demo's.
	subst := []string{"https://example.com/", api + "/v1/whoami"}
	for i, name := range []string{"crawler-1", "crawler-2", "crawler-3"} {
		subst = append(subst, fmt.Sprintf("192.168.1.%d:3128", 73+i), demoProxyAddr(t, api, token, name))
	}
	for _, a := range docAPIs {
		subst = append(subst, a, api)
	}
	repl := strings.NewReplacer(subst...)
	for _, ex := range examples {
		script := "curl() { command curl -w '%{stderr}HTTP_STATUS %{http_code}\\n' \"$@\"; }\n" + repl.Replace(ex.cmd)
		var got, stderr string
		var problem error
		deadline := time.Now().Add(30 * time.Second)
		for {
			cmd := exec.Command("bash", "-o", "pipefail", "-c", script)
			cmd.Env = append(os.Environ(), "TOKEN="+token)
			var o, e bytes.Buffer
			cmd.Stdout, cmd.Stderr = &o, &e
			err := cmd.Run()
			got, stderr = o.String(), e.String()
			problem = checkExample(repl.Replace(ex.want), got, stderr, err)
			if problem == nil || strings.Contains(ex.cmd, "-X POST") || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if problem != nil {
			t.Errorf("%s: %v\n$ %s\nwant:\n%s\ngot:\n%s\nstderr:\n%s", ex.where, problem, ex.cmd, ex.want, got, stderr)
		}
	}
	t.Logf("ran %d curl examples of the docs", len(examples))
}

// demoProxyAddr is host:port of the demo's Proxy crawl/name, from the API.
func demoProxyAddr(t *testing.T, api, token, name string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, api+"/v1/proxies?namespace=crawl", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var l struct {
		Proxies []struct{ Name, URL string }
	}
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	for _, p := range l.Proxies {
		if p.Name == name {
			return strings.TrimPrefix(p.URL, "http://")
		}
	}
	t.Fatalf("no proxy %s in %s", name, b)
	return ""
}

var (
	statusRE     = regexp.MustCompile(`HTTP_STATUS (\d+)`)
	errorShownRE = regexp.MustCompile(`(?m)^HTTP/\S+ [45]\d\d|"error"`)
	// an egress address, or whoami's answer in either format
	callerIPRE = regexp.MustCompile(`(?m)("egressIP":"|"ip":"|^)(?:\d{1,3}\.){3}\d{1,3}("|$)`)
	secondsRE  = regexp.MustCompile(`(Retry-After: |retry in )\d+`)
)

// normalize stands placeholders for what differs between the doc (its proxies'
// addresses already replaced by the demo's) and the demo: the addresses requests come
// from, and the seconds left of a cooldown.
func normalize(s string) string {
	s = callerIPRE.ReplaceAllString(strings.ReplaceAll(s, "\r", ""), "${1}<ip>${2}")
	return strings.TrimSpace(secondsRE.ReplaceAllString(s, "${1}<n>"))
}

func checkExample(want, got, stderr string, runErr error) error {
	if runErr != nil {
		return fmt.Errorf("exit: %v", runErr)
	}
	errorShown := errorShownRE.MatchString(want)
	for _, m := range statusRE.FindAllStringSubmatch(stderr, -1) {
		if code, _ := strconv.Atoi(m[1]); (code < 200 || code > 299) && !errorShown {
			return fmt.Errorf("HTTP status %d, and the doc shows no error", code)
		}
	}
	if want == "" {
		return nil // the doc shows no answer
	}
	w, g := normalize(want), normalize(got)
	if strings.HasPrefix(w, "HTTP/") {
		wHead, wBody, _ := strings.Cut(w, "\n\n")
		gHead, gBody, _ := strings.Cut(g, "\n\n")
		wLines, gLines := strings.Split(wHead, "\n"), strings.Split(gHead, "\n")
		if wLines[0] != gLines[0] {
			return fmt.Errorf("status line %q, the doc shows %q", gLines[0], wLines[0])
		}
		for _, h := range wLines[1:] {
			if !containsFold(gLines[1:], h) {
				return fmt.Errorf("no header %q", h)
			}
		}
		w, g = strings.TrimSpace(wBody), strings.TrimSpace(gBody)
	}
	if strings.HasPrefix(w, "{") { // JSON wrapped over lines in the doc
		parts := strings.Split(w, "\n")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		w = strings.Join(parts, "")
	}
	var wv, gv any
	if !strings.Contains(w, "...") && json.Unmarshal([]byte(w), &wv) == nil && json.Unmarshal([]byte(g), &gv) == nil {
		wj, _ := json.Marshal(wv)
		gj, _ := json.Marshal(gv)
		if !bytes.Equal(wj, gj) {
			return fmt.Errorf("the JSON differs from the doc's")
		}
		return nil
	}
	re := "(?s)^" + strings.ReplaceAll(regexp.QuoteMeta(w), `\.\.\.`, ".*") + "$"
	if !regexp.MustCompile(re).MatchString(g) {
		return fmt.Errorf("the answer differs from the doc's")
	}
	return nil
}

func containsFold(lines []string, want string) bool {
	for _, l := range lines {
		if strings.EqualFold(strings.TrimSpace(l), strings.TrimSpace(want)) {
			return true
		}
	}
	return false
}
