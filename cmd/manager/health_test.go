package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/health/healthtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/statusapply"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// startProbingManager starts the manager binary with the discovery API behind the token
// t0ken, probing every second with its own /v1/whoami as the target, plus extra flags;
// it returns the manager and the discovery API's address.
func startProbingManager(t *testing.T, env *testenv.Env, extra ...string) (*managerProc, string) {
	t.Helper()
	providers := writeFile(t, "providers.yaml", fmt.Sprintf(goodConfig, t.TempDir()))
	token := writeFile(t, "token", "t0ken\n")
	probe, disc := freeAddr(t), freeAddr(t)
	return startManager(t, env, append([]string{"--providers-config", providers,
		"--health-probe-bind-address", probe, "--metrics-bind-address", "0",
		"--discovery-bind-address", disc, "--discovery-token-file", token,
		"--proxy-probe-url", "http://" + disc + "/v1/whoami", "--proxy-check-interval", "1s"}, extra...)...), disc
}

// discoveryGet GETs path from the discovery API at disc, with the bearer token tok
// unless it is empty, and returns the status code and the body (or the error).
func discoveryGet(disc, path, tok string) (int, string) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+disc+path, nil)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// The manager binary end to end for the health side: an External Proxy in front of a
// forward proxy on loopback is probed through it (the probe target being the manager's
// own /v1/whoami), becomes Ready with its egress IP, and the discovery API, behind a
// bearer token, hands it out from the cache; the ProviderHealth object appears.
func TestManagerHealthAndDiscovery(t *testing.T) {
	t.Parallel()
	env := testenv.StartT(t)
	c := env.Client
	fp := healthtest.New(t, "127.0.0.9")

	mgr, disc := startProbingManager(t, env, "--provider-check-interval", "1s", "--provider-check-timeout", "500ms")

	ctx := context.Background()
	px := testbuild.Proxy("default", "edge", testbuild.WithLabel("pool", "crawl"), testbuild.External(fp.Host), testbuild.WithPort(fp.Port))
	if err := c.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	mgr.waitUntil("the External Proxy to be Ready with egress IP 127.0.0.9", func() (bool, error) {
		got := &v1alpha1.Proxy{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(px), got); err != nil {
			return false, err
		}
		st := got.Status
		return st.Phase == v1alpha1.PhaseReady && st.Healthy && st.EgressIP == "127.0.0.9",
			fmt.Errorf("phase %q, healthy %v, egress IP %q", st.Phase, st.Healthy, st.EgressIP)
	})

	get := func(path, tok string) (int, string) { return discoveryGet(disc, path, tok) }
	if code, _ := get("/v1/proxies", ""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", code)
	}
	want := fmt.Sprintf("http://%s:%d\n", fp.Host, fp.Port)
	mgr.waitUntil("the discovery API to list the healthy proxy", func() (bool, error) {
		code, body := get("/v1/proxies?format=text&labelSelector=pool%3Dcrawl", "t0ken")
		return code == http.StatusOK && body == want, fmt.Errorf("%d %q", code, body)
	})
	code, body := get("/v1/proxies/pick?key=session-1", "t0ken")
	var picked struct{ Name, URL, EgressIP string }
	if err := json.Unmarshal([]byte(body), &picked); code != http.StatusOK || err != nil || picked.Name != "edge" || picked.EgressIP != "127.0.0.9" {
		t.Errorf("pick: %d %s", code, body)
	}

	// A ban reported to discovery lands in status.cooldowns, and the ban controller counts
	// the site in status.coolingSites. Then every status field has one owner, written by
	// server-side apply: the reconciler, the health engine, the feedback recorder and the
	// ban controller each own theirs.
	req, _ := http.NewRequest(http.MethodPost, "http://"+disc+"/v1/feedback",
		strings.NewReader(`{"reports":[{"proxy":"default/edge","domain":"shop.example.com","outcome":"banned"}]}`))
	req.Header.Set("Authorization", "Bearer t0ken")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/feedback: %d", res.StatusCode)
	}
	settled := &v1alpha1.Proxy{}
	mgr.waitUntil("the ban to be in status.cooldowns", func() (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(px), settled); err != nil {
			return false, err
		}
		return len(settled.Status.Cooldowns) == 1 && settled.Status.CoolingSites == 1,
			fmt.Errorf("cooldowns %+v, coolingSites %d", settled.Status.Cooldowns, settled.Status.CoolingSites)
	})
	for _, fault := range testenv.StatusOwnership(settled, statusapply.ProxyController, statusapply.ProxyHealth, bans.FieldManager, statusapply.ProxyBans) {
		t.Errorf("status ownership: %s", fault)
	}
	if owners := testenv.StatusManagers(settled); len(owners) != 4 {
		t.Errorf("status managers %v, want the reconciler, the health engine, the feedback recorder and the ban controller", owners)
	}

	mgr.waitUntil("ProviderHealth kvm2-home with one target per host", func() (bool, error) {
		ph := &v1alpha1.ProviderHealth{}
		if err := c.Get(ctx, client.ObjectKey{Name: "kvm2-home"}, ph); err != nil {
			return false, err
		}
		st := ph.Status
		return st.TotalTargets >= 1 && st.LastChecked != nil && strings.Contains(st.Ready, "/"),
			fmt.Errorf("%d targets, ready %q, last checked %v", st.TotalTargets, st.Ready, st.LastChecked)
	})

	// The proxy goes away: after three failed probes discovery stops handing it out.
	fp.SetMode(healthtest.Fail)
	mgr.waitUntil("discovery to stop listing the failing proxy", func() (bool, error) {
		code, body := get("/v1/proxies?format=text", "t0ken")
		return code == http.StatusOK && body == "", fmt.Errorf("%d %q", code, body)
	})
	if code, _ := get("/v1/proxies/pick?key=session-1", "t0ken"); code != http.StatusServiceUnavailable {
		t.Errorf("pick with nothing healthy: %d, want 503", code)
	}

	mgr.stop()
}

// The manager gives the health engine and the discovery API the Proxies' basic-auth
// Secrets: an External Proxy whose proxy demands credentials becomes Ready, discovery
// with the token and ?credentials=true hands out a URL that works as a proxy URL as it
// is, and a rotated Secret is probed and handed out at once.
func TestManagerProbesAndHandsOutCredentials(t *testing.T) {
	t.Parallel()
	env := testenv.StartT(t)
	c := env.Client
	fp := healthtest.New(t, "127.0.0.10")
	fp.RequireAuth(&healthtest.Auth{Username: "crawler", Password: "Pw-one.1"})

	mgr, disc := startProbingManager(t, env, "--proxy-status-heartbeat", "1s", "--provider-check-interval", "1m")

	ctx := context.Background()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "edge-auth", Namespace: "default",
		Labels: map[string]string{v1alpha1.CredentialsLabel: "true"}},
		Data: map[string][]byte{"username": []byte("crawler"), "password": []byte("Pw-one.1")}}
	if err := c.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	px := testbuild.Proxy("default", "authed", testbuild.External(fp.Host), testbuild.WithPort(fp.Port), testbuild.WithBasicAuth("edge-auth"))
	if err := c.Create(ctx, px); err != nil {
		t.Fatal(err)
	}
	mgr.waitUntil("the Proxy behind basic auth to be Ready", func() (bool, error) {
		got := &v1alpha1.Proxy{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(px), got); err != nil {
			return false, err
		}
		return got.Status.Phase == v1alpha1.PhaseReady && got.Status.EgressIP == "127.0.0.10",
			fmt.Errorf("phase %s, egress IP %q, message %q", got.Status.Phase, got.Status.EgressIP, got.Status.Message)
	})

	get := func(path string) (int, string) { return discoveryGet(disc, path, "t0ken") }
	if code, body := get("/v1/proxies?format=text&namespace=default"); code != http.StatusOK || strings.Contains(body, "crawler") {
		t.Errorf("without credentials=true: %d %q, want the URL without credentials", code, body)
	}
	// through asks for /v1/whoami through the proxy URL as discovery handed it out.
	through := func(proxyURL string) (int, error) {
		u, err := url.Parse(strings.TrimSpace(proxyURL))
		if err != nil {
			return 0, err
		}
		hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u)}, Timeout: 10 * time.Second}
		res, err := hc.Get("http://" + disc + "/v1/whoami")
		if err != nil {
			return 0, err
		}
		res.Body.Close()
		return res.StatusCode, nil
	}
	for _, pw := range []string{"Pw-one.1", "Pw-two.2"} {
		if pw != "Pw-one.1" { // a rotation: the Secret and the proxy change together
			sec.Data["password"] = []byte(pw)
			if err := c.Update(ctx, sec); err != nil {
				t.Fatal(err)
			}
			fp.RequireAuth(&healthtest.Auth{Username: "crawler", Password: pw})
		}
		want := fmt.Sprintf("http://crawler:%s@%s:%d\n", pw, fp.Host, fp.Port)
		var body string
		mgr.waitUntil("discovery to hand out the URL with password "+pw, func() (bool, error) {
			var code int
			code, body = get("/v1/proxies?format=text&namespace=default&credentials=true")
			return code == http.StatusOK && body == want, fmt.Errorf("%d %q", code, body)
		})
		if code, err := through(body); err != nil || code != http.StatusOK {
			t.Errorf("a request through the handed-out URL: %d %v", code, err)
		}
	}
	if code, err := through(fmt.Sprintf("http://%s:%d", fp.Host, fp.Port)); err != nil || code != http.StatusProxyAuthRequired {
		t.Errorf("a request without credentials: %d %v, want 407", code, err)
	}
	// The probe goes with the rotated password: a successful probe after the rotation.
	rotated := time.Now().Add(time.Second) // lastProbeTime has whole seconds
	mgr.waitUntil("a successful probe with the rotated password", func() (bool, error) {
		got := &v1alpha1.Proxy{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(px), got); err != nil {
			return false, err
		}
		return got.Status.Phase == v1alpha1.PhaseReady && got.Status.ConsecutiveProbeFailures == 0 &&
				got.Status.LastProbeTime != nil && got.Status.LastProbeTime.After(rotated),
			fmt.Errorf("phase %s, %d consecutive failures, last probe %v", got.Status.Phase, got.Status.ConsecutiveProbeFailures, got.Status.LastProbeTime)
	})
	if strings.Contains(mgr.stderr.String(), "Pw-") {
		t.Errorf("the manager logged a password:\n%s", mgr.stderr.String())
	}
	mgr.stop()
}

// The manager binary never sends the values of a Secret without the opt-in label: an
// External Proxy naming one (a deploy bot's credentials, its address a listener of the
// author's) waits in Pending with CredentialsUnavailable and a message saying which label
// to add, the listener never sees a request (so no Proxy-Authorization), and discovery's
// ?credentials=true lists it not, while a labelled Proxy beside it is probed and listed
// as usual (the probe rounds ran). Labelling the Secret is what lets it through.
func TestManagerNeverSendsAnUnlabelledSecret(t *testing.T) {
	t.Parallel()
	env := testenv.StartT(t)
	c := env.Client
	fp := healthtest.New(t, "127.0.0.11")
	var mu sync.Mutex
	var seen []string // the Proxy-Authorization of every request the listener got
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Proxy-Authorization"))
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	listenerRequests := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
	_, portStr, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(portStr)

	mgr, disc := startProbingManager(t, env, "--provider-check-interval", "1m")
	ctx := context.Background()
	bot := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "deploy-bot", Namespace: "default"},
		Type: corev1.SecretTypeBasicAuth,
		Data: map[string][]byte{"username": []byte("deploy-bot"), "password": []byte("Bot-Secret.77")}}
	if err := c.Create(ctx, bot); err != nil {
		t.Fatal(err)
	}
	nosy := testbuild.Proxy("default", "nosy", testbuild.External("127.0.0.1"), testbuild.WithPort(int32(port)), testbuild.WithBasicAuth("deploy-bot"))
	plain := testbuild.Proxy("default", "plain", testbuild.External(fp.Host), testbuild.WithPort(fp.Port))
	for _, px := range []*v1alpha1.Proxy{nosy, plain} {
		if err := c.Create(ctx, px); err != nil {
			t.Fatal(err)
		}
	}
	want := `secret default/deploy-bot (spec.proxy.basicAuth.secretRef) lacks the label egress.hrajfrisbee.cz/proxy-credentials: "true"`
	mgr.waitUntil("the Proxy naming the unlabelled Secret to say why it waits", func() (bool, error) {
		got := &v1alpha1.Proxy{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(nosy), got); err != nil {
			return false, err
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionProvisioned)
		return got.Status.Phase == v1alpha1.PhasePending && cond != nil && cond.Status == metav1.ConditionFalse &&
				cond.Reason == v1alpha1.ReasonCredentialsUnavailable && strings.Contains(cond.Message, want) && got.Status.IP == "",
			fmt.Errorf("phase %s, ip %q, Provisioned %+v", got.Status.Phase, got.Status.IP, cond)
	})
	// The rounds run: the Proxy beside it is probed to Ready, then a few rounds more.
	var readyAt time.Time
	mgr.waitUntil("the plain External Proxy to be Ready and probed three rounds after", func() (bool, error) {
		got := &v1alpha1.Proxy{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(plain), got); err != nil {
			return false, err
		}
		if got.Status.Phase == v1alpha1.PhaseReady && readyAt.IsZero() {
			readyAt = time.Now()
		}
		return !readyAt.IsZero() && time.Since(readyAt) > 3*time.Second, fmt.Errorf("phase %s", got.Status.Phase)
	})
	code, body := discoveryGet(disc, "/v1/proxies?namespace=default&healthy=any&credentials=true", "t0ken")
	if code != http.StatusOK || strings.Contains(body, "nosy") || !strings.Contains(body, `"name":"plain"`) || strings.Contains(body, "Bot-Secret") {
		t.Errorf("discovery with credentials: %d %s, want plain alone", code, body)
	}
	if reqs := listenerRequests(); len(reqs) != 0 {
		t.Fatalf("the listener behind the unlabelled Secret's Proxy got %d requests (Proxy-Authorization %q)", len(reqs), reqs)
	}
	evs := &eventsv1.EventList{}
	if err := c.List(ctx, evs, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	warnings := 0
	for _, ev := range evs.Items {
		if ev.Regarding.Name == "nosy" && ev.Type == corev1.EventTypeWarning && ev.Reason == v1alpha1.ReasonCredentialsUnavailable {
			warnings++
		}
	}
	if warnings != 1 {
		t.Errorf("%d CredentialsUnavailable Warning events on the Proxy, want one", warnings)
	}

	// Opted in: the Secret is the Proxy's to use, and the probe sends it.
	bot.Labels = map[string]string{v1alpha1.CredentialsLabel: "true"}
	if err := c.Update(ctx, bot); err != nil {
		t.Fatal(err)
	}
	wantAuth := "Basic " + base64.StdEncoding.EncodeToString([]byte("deploy-bot:Bot-Secret.77"))
	mgr.waitUntil("the probe to go through the labelled Secret's Proxy with its credentials", func() (bool, error) {
		reqs := listenerRequests()
		return len(reqs) > 0 && reqs[0] == wantAuth, fmt.Errorf("%d requests", len(reqs))
	})
	if strings.Contains(mgr.stderr.String(), "Bot-Secret") {
		t.Errorf("the manager logged the password")
	}
	mgr.stop()
}
