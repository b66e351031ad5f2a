package framework

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// fatalT is a testing.TB whose Fatal and Fatalf record the message and end the calling
// function, as the real ones end the test.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Helper()                        {}
func (f *fatalT) Logf(string, ...any)            {}
func (f *fatalT) Fatal(args ...any)              { f.msg = fmt.Sprint(args...); panic(f) }
func (f *fatalT) Fatalf(format string, a ...any) { f.Fatal(fmt.Sprintf(format, a...)) }

// fails runs fn with a fatalT and returns the failure's message, "" if none.
func fails(t *testing.T, fn func(testing.TB)) (msg string) {
	f := &fatalT{TB: t}
	defer func() {
		if p := recover(); p != nil {
			if p != f {
				panic(p)
			}
			msg = f.msg
		}
	}()
	fn(f)
	return ""
}

func TestLoadHostEnvNamesTheMissingVariable(t *testing.T) {
	for _, name := range []string{"KVM2_TEST_ADDRESS", "KVM2_TEST_USER", "KVM2_TEST_KEY", "KVM2_TEST_KNOWN_HOSTS", "KVM2_TEST_SOCKET",
		"KVM2_TEST_POOL", "KVM2_TEST_POOL_PATH", "KVM2_TEST_BRIDGE", "KVM2_TEST_BRIDGE_IP", "KVM2_TEST_BRIDGE_SUBNET", "KVM2_TEST_DOMAIN_TYPE"} {
		t.Setenv(name, "value-of-"+name)
	}
	var h HostEnv
	if msg := fails(t, func(tb testing.TB) { h = LoadHostEnv(tb, "run make x") }); msg != "" {
		t.Fatalf("every variable set, yet: %s", msg)
	}
	if h.PoolPath != "value-of-KVM2_TEST_POOL_PATH" || h.BridgeSubnet != "value-of-KVM2_TEST_BRIDGE_SUBNET" || h.DomainType != "value-of-KVM2_TEST_DOMAIN_TYPE" {
		t.Errorf("read %+v", h)
	}
	t.Setenv("KVM2_TEST_BRIDGE_IP", "")
	if msg := fails(t, func(tb testing.TB) { LoadHostEnv(tb, "run make x") }); msg != "KVM2_TEST_BRIDGE_IP is not set: run make x" {
		t.Errorf("one variable unset: %q", msg)
	}
}

func TestRepoRootHoldsGoMod(t *testing.T) {
	if _, err := os.Stat(filepath.Join(RepoRoot(t), "go.mod")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	if msg := fails(t, func(tb testing.TB) { RepoRoot(tb) }); !strings.Contains(msg, "no go.mod") {
		t.Errorf("outside the module: %q", msg)
	}
}

// TestFileSHA256: the sum file hack/guest-image.sh writes is used when there, else the
// file is hashed; an empty sum file is an error naming it.
func TestFileSHA256(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "guest.qcow2")
	if err := os.WriteFile(img, []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	const abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if got, err := fileSHA256(img); err != nil || got != abc {
		t.Errorf("hashed: %q, %v; want %s", got, err, abc)
	}
	if err := os.WriteFile(img+".sha256", []byte("0123  guest.qcow2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := fileSHA256(img); err != nil || got != "0123" {
		t.Errorf("from the sum file: %q, %v", got, err)
	}
	if err := os.WriteFile(img+".sha256", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := fileSHA256(img); err == nil || !strings.Contains(err.Error(), "guest.qcow2.sha256 is empty") {
		t.Errorf("an empty sum file: %v", err)
	}
	if _, err := fileSHA256(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing image hashed")
	}
}

// fakeHost answers each command from a table, "" for one not listed.
func fakeHost(t *testing.T, pool, poolPath string, answers map[string]string, failing ...string) *Host {
	return &Host{Env: HostEnv{Pool: pool, PoolPath: poolPath}, run: func(cmd string) (string, error) {
		for _, f := range failing {
			if strings.Contains(cmd, f) {
				return "", errors.New("refused: " + f)
			}
		}
		return answers[cmd], nil
	}}
}

func TestLeftoversListsWhatRemains(t *testing.T) {
	h := fakeHost(t, "default", "/pool", map[string]string{
		"virsh -q -c qemu:///system list --all --name":       "other\nvm-1\n",
		"virsh -q -c qemu:///system vol-list --pool default": " vm-1.qcow2   /pool/vm-1.qcow2\n base-x.qcow2 /pool/base-x.qcow2\n",
		"ls -1 /pool": "vm-1-seed.iso\nbase-x.qcow2\n",
	})
	got := strings.Join(h.Leftovers("vm-1"), "; ")
	if want := "domain vm-1; volume vm-1.qcow2; file /pool/vm-1-seed.iso"; got != want {
		t.Errorf("leftovers %q, want %q", got, want)
	}
	if left := h.Leftovers("vm-2"); len(left) != 0 {
		t.Errorf("an instance never made left %v", left)
	}
	broken := fakeHost(t, "default", "/pool", nil, "list --all", "vol-list", "ls -1")
	got = strings.Join(broken.Leftovers("vm-1"), "; ")
	for _, want := range []string{"listing domains: refused", "listing volumes: refused", "listing the pool directory: refused"} {
		if !strings.Contains(got, want) {
			t.Errorf("a host that cannot be read: %q lacks %q", got, want)
		}
	}
}

// TestDiskWrites: the write count is vda's, wherever it sits among the domain's disks;
// a domain without vda, or one virsh cannot read, is an error.
func TestDiskWrites(t *testing.T) {
	const stats = "virsh -q -c qemu:///system domstats --block "
	h := fakeHost(t, "default", "/pool", map[string]string{
		stats + "vm-1": "Domain: 'vm-1'\n  block.count=2\n  block.0.name=sda\n  block.0.wr.reqs=7\n" +
			"  block.1.name=vda\n  block.1.rd.reqs=68\n  block.1.wr.reqs=0\n",
		stats + "vm-2": "Domain: 'vm-2'\n  block.count=1\n  block.0.name=vda\n  block.0.wr.reqs=1204\n",
		stats + "vm-3": "Domain: 'vm-3'\n  block.count=1\n  block.0.name=sda\n  block.0.wr.reqs=3\n",
	}, "vm-4")
	for vm, want := range map[string]int{"vm-1": 0, "vm-2": 1204} {
		if n, err := h.DiskWrites(vm); err != nil || n != want {
			t.Errorf("%s: %d, %v; want %d", vm, n, err, want)
		}
	}
	if _, err := h.DiskWrites("vm-3"); err == nil || !strings.Contains(err.Error(), "no write count of vda") {
		t.Errorf("a domain without vda: %v", err)
	}
	if _, err := h.DiskWrites("vm-4"); err == nil {
		t.Error("a domain virsh cannot read gave a count")
	}
}

func TestLocalHostRunsAndReportsFailures(t *testing.T) {
	h := LocalHost(HostEnv{})
	if out, err := h.Run("echo one; echo two"); err != nil || out != "one\ntwo\n" {
		t.Errorf("Run: %q, %v", out, err)
	}
	if _, err := h.Run("echo broken >&2; exit 3"); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Errorf("a failing command: %v, want its stderr in the error", err)
	}
}

// TestWhoamiAndThrough: the answer names the caller and the count goes up (From, Callers); Through passes
// for a request through a forwarding proxy that arrives from the address wanted, and
// fails naming the target and the address otherwise; StatusThrough gives the proxy's
// own refusal.
func TestWhoamiAndThrough(t *testing.T) {
	who := &Whoami{}
	target := Serve(t, "127.0.0.1", who)
	if body, err := Get(http.DefaultClient, target+"/direct"); err != nil || body != "{\"ip\":\"127.0.0.1\"}\n" {
		t.Fatalf("direct: %q, %v", body, err)
	}
	if n := who.From("127.0.0.1"); n != 1 {
		t.Fatalf("From = %d after one request", n)
	}
	if c := who.Callers(); len(c) != 1 || c["127.0.0.1"] != 1 {
		t.Fatalf("Callers = %v after one request from 127.0.0.1", c)
	}
	forward := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") == "" {
			w.WriteHeader(http.StatusProxyAuthRequired)
			return
		}
		resp, err := http.Get(r.URL.String())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(forward.Close)
	withCreds, _ := url.Parse(forward.URL)
	withCreds.User = url.UserPassword("u", "p")
	Through(t, withCreds, target+"/through", who, "127.0.0.1")
	if n := who.From("127.0.0.1"); n != 2 {
		t.Errorf("From = %d after a request through the proxy", n)
	}
	if msg := fails(t, func(tb testing.TB) { Through(tb, withCreds, target+"/elsewhere", who, "10.0.0.9") }); !strings.Contains(msg, "want it to come from the guest's address 10.0.0.9") || !strings.Contains(msg, "/elsewhere") {
		t.Errorf("from another address: %q", msg)
	}
	bare, _ := url.Parse(forward.URL)
	if code, err := StatusThrough(bare, target); err != nil || code != http.StatusProxyAuthRequired {
		t.Errorf("without credentials: %d %v, want 407", code, err)
	}
	if code, body := GetStatus(http.DefaultClient, "http://127.0.0.1:1/", ""); code != 0 || body == "" {
		t.Errorf("a refused connection: %d %q, want 0 and the error", code, body)
	}
	if _, err := Get(http.DefaultClient, forward.URL+"/x"); err == nil || !strings.Contains(err.Error(), "407") {
		t.Errorf("Get of a 407: %v, want an error naming the status", err)
	}
}

func TestGetStatusSendsTheToken(t *testing.T) {
	srv := Serve(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	if code, _ := GetStatus(http.DefaultClient, srv, "s3cret"); code != http.StatusOK {
		t.Errorf("with the token: %d", code)
	}
	if code, _ := GetStatus(http.DefaultClient, srv, ""); code != http.StatusUnauthorized {
		t.Errorf("without: %d", code)
	}
}

func TestIsReadyAndIsRunning(t *testing.T) {
	healthy := []metav1.Condition{{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue}}
	for _, tc := range []struct {
		name           string
		st             v1alpha1.ProxyStatus
		ready, running bool
	}{
		{"Ready, healthy, with an address", v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, Healthy: true, IP: "10.0.0.2", Conditions: healthy}, true, true},
		{"Ready without the Healthy condition", v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, Healthy: true, IP: "10.0.0.2"}, false, true},
		{"Ready without an address", v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, Healthy: true, Conditions: healthy}, false, false},
		{"Running", v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseRunning, IP: "10.0.0.2"}, false, true},
		{"Provisioning", v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseProvisioning}, false, false},
	} {
		px := &v1alpha1.Proxy{Status: tc.st}
		if IsReady(px) != tc.ready || IsRunning(px) != tc.running {
			t.Errorf("%s: IsReady %v IsRunning %v, want %v %v", tc.name, IsReady(px), IsRunning(px), tc.ready, tc.running)
		}
	}
}

// TestWaitProxy: it returns the Proxy once ok holds; on a timeout the failure names the
// Proxy, what was awaited and its last phase line.
func TestWaitProxy(t *testing.T) {
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
		Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseProvisioning, Message: "creating"}}
	c := testenv.FakeClient(t, interceptor.Funcs{}, px)
	key := types.NamespacedName{Namespace: "ns", Name: "p"}
	got := WaitProxy(t, c, key, "Provisioning", testutil.WaitLong, func(p *v1alpha1.Proxy) bool { return p.Status.Phase == v1alpha1.PhaseProvisioning })
	if got.Status.Message != "creating" {
		t.Errorf("returned %+v", got.Status)
	}
	msg := fails(t, func(tb testing.TB) {
		WaitProxy(tb, c, key, "Ready", 20*time.Millisecond, IsReady, testutil.Every(time.Millisecond))
	})
	for _, want := range []string{"waiting for Proxy ns/p Ready", `phase=Provisioning ip= healthy=false message="creating"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("failure %q lacks %q", msg, want)
		}
	}
	msg = fails(t, func(tb testing.TB) {
		WaitProxy(tb, c, types.NamespacedName{Namespace: "ns", Name: "gone"}, "Ready", 5*time.Millisecond, IsReady)
	})
	if !strings.Contains(msg, "reading Proxy ns/gone") {
		t.Errorf("a missing Proxy: %q", msg)
	}
}

// TestDashboardAndAlertsOfTheProject: the project's dashboard and rules read as the deploy
// tier reads them, each query with its panel and row.
func TestDashboardAndAlertsOfTheProject(t *testing.T) {
	root := RepoRoot(t)
	qs, err := DashboardQueries(filepath.Join(root, "config", "grafana", "egress-proxies-operator.json"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]int{}
	for _, q := range qs {
		if q.Row == "" || q.Panel == "" || q.Expr == "" {
			t.Errorf("query %+v lacks its row, panel or expression", q)
		}
		rows[q.Row]++
	}
	if len(qs) < 10 || rows["Proxies"] == 0 {
		t.Errorf("%d queries, by row %v", len(qs), rows)
	}
	rules, err := AlertRules(filepath.Join(root, "config", "prometheus", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) < 6 {
		t.Errorf("%d alerts: %+v", len(rules), rules)
	}
	for _, r := range rules {
		if r.Expr == "" {
			t.Errorf("alert %s without an expression", r.Alert)
		}
	}
	if _, err := DashboardQueries(filepath.Join(root, "go.mod")); err == nil {
		t.Error("go.mod read as a dashboard")
	}
	if _, err := AlertRules(filepath.Join(root, "missing.yaml")); err == nil {
		t.Error("a missing rules file read")
	}
}

func TestDashboardPanelWithoutQuery(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d.json")
	if err := os.WriteFile(p, []byte(`{"panels":[{"type":"row","title":"R"},{"type":"timeseries","title":"Empty"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := DashboardQueries(p); err == nil || !strings.Contains(err.Error(), `panel "Empty" has no query`) {
		t.Errorf("a panel without a query: %v", err)
	}
}

// recordingT is a testing.TB that keeps what a Checks writes, so its summary can be read.
type recordingT struct {
	testing.TB
	errors, logs []string
	cleanups     []func()
	failed       bool
}

func (r *recordingT) Helper() {}
func (r *recordingT) Error(args ...any) {
	r.failed = true
	r.errors = append(r.errors, fmt.Sprint(args...))
}
func (r *recordingT) Logf(format string, a ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, a...))
}
func (r *recordingT) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recordingT) Failed() bool     { return r.failed }

func (r *recordingT) runCleanups() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func TestChecksRepeatTheFailuresLast(t *testing.T) {
	r := &recordingT{}
	c := NewChecks(r)
	c.Errorf("fewer than %d children were Ready", 2)
	c.Errorf("child %s left behind", "a")
	if len(r.errors) != 2 || r.errors[0] != "fewer than 2 children were Ready" {
		t.Fatalf("Errorf failed the test with %q, want each message", r.errors)
	}
	r.Cleanup(func() { r.Logf("total 5m") }) // a later cleanup, as a test's own
	r.runCleanups()
	want := []string{"total 5m", "FAILED: 2 check(s):", "  - fewer than 2 children were Ready", "  - child a left behind"}
	if !slices.Equal(r.logs, want) {
		t.Errorf("logs %q, want %q", r.logs, want)
	}
}

func TestChecksSayAFatalStoppedTheTest(t *testing.T) {
	r := &recordingT{}
	NewChecks(r)
	r.failed = true // as t.Fatal would
	r.runCleanups()
	if len(r.logs) != 1 || !strings.Contains(r.logs[0], "fatal error") {
		t.Errorf("logs %q, want one line naming the fatal error", r.logs)
	}
	r = &recordingT{}
	NewChecks(r)
	r.runCleanups()
	if len(r.logs) != 0 {
		t.Errorf("a passing test logged %q", r.logs)
	}
}
