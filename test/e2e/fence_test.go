//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

// fenceTargets are the servers the fence check asks the guest's proxy for.
type fenceTargets struct {
	host, private, internet          *framework.Whoami
	hostURL, privateURL, internetURL string
}

func newFenceTargets(s *story, h framework.HostEnv, e *edge) *fenceTargets {
	ft := &fenceTargets{host: &framework.Whoami{}, private: &framework.Whoami{}, internet: &framework.Whoami{}}
	ft.hostURL = framework.Serve(s.t, h.BridgeIP, ft.host)
	ft.privateURL = e.serve(s.t, e.refused, ft.private)
	ft.internetURL = e.serve(s.t, internetAddr, ft.internet)
	return ft
}

// checkFence checks the guest's egress fence through its proxy (proxyURL, with the
// credentials): the host (the bridge's gateway) and a second private address on the
// bridge are refused (tinyproxy answers 500, its connection having been reset by the
// fence, and the targets see nothing), while the internet stand-in answers from the
// guest's address. checkServing has shown the address in allowedDestinations works.
func (s *story) checkFence(proxyURL *url.URL, ft *fenceTargets) {
	t := s.t
	ip := s.mustProxy().Status.IP
	through := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL), DisableKeepAlives: true}}
	for _, tc := range []struct {
		name string
		url  string
		who  *framework.Whoami
	}{
		{"the host (the bridge's gateway)", ft.hostURL, ft.host},
		{"a second private address on the bridge", ft.privateURL, ft.private},
	} {
		start := time.Now()
		resp, err := through.Get(tc.url + "/fenced")
		if err != nil {
			t.Errorf("a request to %s (%s) through the proxy: %v, want tinyproxy's answer that it could not connect", tc.name, tc.url, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError || !strings.Contains(string(body), "Unable to connect") {
			t.Errorf("a request to %s (%s) through the proxy: %s %q, want 500 Unable to connect (the fence refused the connection)",
				tc.name, tc.url, resp.Status, firstLine(body))
		}
		if n := tc.who.From(ip); n != 0 {
			t.Errorf("%s (%s) saw %d requests from the guest's address %s: the fence let them through", tc.name, tc.url, n, ip)
		}
		t.Logf("fence: a request to %s (%s) through the proxy was refused: %s in %s (tinyproxy's error page: %q)",
			tc.name, tc.url, resp.Status, time.Since(start).Round(time.Millisecond), firstLine(body))
	}
	// The route to the stand-in comes from the test's cloud-init, by networkd: long in
	// place by now, yet waited for rather than assumed.
	var body string
	s.waitFor("a request through the proxy to the internet stand-in "+ft.internetURL+" to answer", shortDeadline, time.Second, func() (bool, error) {
		var err error
		body, err = framework.Get(through, ft.internetURL+"/internet")
		return err == nil, err
	})
	if !strings.Contains(body, `"`+ip+`"`) || ft.internet.From(ip) == 0 {
		t.Fatalf("the internet stand-in answered %q; want the request to come from the guest's address %s", body, ip)
	}
	t.Logf("fence: a request through the proxy to the internet stand-in %s was answered from %s", ft.internetURL, ip)
}

func firstLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); strings.Contains(l, "Unable") || strings.HasPrefix(l, "<title>") {
			return l
		}
	}
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// failClosed is a second Proxy whose guest cannot load the fence: it boots the test
// image without nft (noNftImageKey), as a stock image whose nftables install failed, so
// neither the image's early start from the seed nor cloud-init's start can load the
// fence, and runcmd's install fails too (the bridge has no route to a package mirror).
// startFailClosed creates it, so that its guest boots while the first Proxy's replacement
// does (each TCG guest keeps one core busy; one after the other, the second core idled
// through both boots); check then waits for it.
type failClosed struct {
	s     *story // the Proxy without the fence
	start time.Time
}

func (s *story) startFailClosed(ctx context.Context, template *v1alpha1.Proxy) *failClosed {
	t := s.t
	px := &v1alpha1.Proxy{}
	px.Namespace, px.Name = template.Namespace, "e2e-no-fence"
	px.Spec = *template.Spec.DeepCopy()
	px.Spec.Placement.Image = noNftImageKey
	ns := &story{t: t, c: s.c, host: s.host, mgr: s.mgr, key: client.ObjectKeyFromObject(px), vm: px.InstanceName()}
	ns.host.RemoveInstance(ns.vm)
	t.Cleanup(func() { ns.host.RemoveInstance(ns.vm) })
	start := time.Now()
	if err := s.c.Create(ctx, px); err != nil {
		t.Fatalf("creating Proxy %s: %v", ns.key, err)
	}
	return &failClosed{s: ns, start: start}
}

// check waits until the guest's cloud-init has finished (asked through the guest agent),
// checks tinyproxy is not running, and that the Proxy, probed past the failure
// threshold, never became Ready, also for three check intervals after that: not in any
// status read, and no ProbeSucceeded Event ever recorded for it (which also covers the
// time it booted unwatched). Then it deletes it.
func (fc *failClosed) check(ctx context.Context) {
	ns, t, start := fc.s, fc.s.t, fc.start
	everReady := func(p *v1alpha1.Proxy) {
		if framework.IsReady(p) || p.Status.Healthy {
			t.Fatalf("Proxy %s, whose guest could not load the egress fence, became Ready:\n%s", ns.key, ns.describe())
		}
	}
	ns.waitBooted("phase Running with an IP (the guest without nft)", func(p *v1alpha1.Proxy) bool {
		everReady(p)
		return framework.IsRunning(p)
	})
	var status string
	ns.waitFor("the guest's cloud-init to finish (cloud-init status, through the guest agent)", bootDeadline, 3*time.Second, func() (bool, error) {
		px, err := ns.proxy()
		if err != nil {
			return false, err
		}
		everReady(px)
		out, code, err := ns.host.GuestExec(ns.vm, "/usr/bin/cloud-init", "status")
		status = strings.TrimSpace(out)
		return err == nil && (strings.Contains(status, "status: done") || strings.Contains(status, "status: error")), fmt.Errorf("exit %d %q: %v", code, status, err)
	})
	active, _, err := ns.host.GuestExec(ns.vm, "/usr/bin/systemctl", "is-active", "tinyproxy")
	if err != nil {
		t.Fatalf("asking the guest whether tinyproxy runs: %v", err)
	}
	if a := strings.TrimSpace(active); a == "active" || a == "activating" {
		t.Fatalf("tinyproxy is %s on the guest that could not load the fence (cloud-init: %s)", a, status)
	}
	journal, _, _ := ns.host.GuestExec(ns.vm, "/usr/bin/journalctl", "-u", "tinyproxy", "-o", "cat", "--no-pager", "-n", "5")
	// The health engine writes a failing Proxy's status once its failures reach the
	// threshold (3, the default) and then only at heartbeats, so further probes are not
	// seen in the status: the Proxy must be past the threshold, and then stay short of
	// Ready for three more check intervals (5 s each here) after cloud-init finished.
	const failureThreshold, checkInterval = 3, 5 * time.Second
	ns.waitFor("the guest without the fence to be probed past the failure threshold", shortDeadline, time.Second, func() (bool, error) {
		px, err := ns.proxy()
		if err != nil {
			return false, err
		}
		everReady(px)
		return px.Status.ConsecutiveProbeFailures >= failureThreshold, nil
	})
	watchFrom := time.Now()
	ns.waitFor("three check intervals without the guest without the fence becoming Ready", shortDeadline, time.Second, func() (bool, error) {
		px, err := ns.proxy()
		if err != nil {
			return false, err
		}
		everReady(px)
		return time.Since(watchFrom) >= 3*checkInterval, nil
	})
	last := ns.mustProxy()
	c := meta.FindStatusCondition(last.Status.Conditions, v1alpha1.ConditionHealthy)
	if c == nil || c.Status != "False" {
		t.Errorf("Healthy condition %+v, want False", c)
	} else {
		t.Logf("fail-closed: the guest without nft is %s after %s: cloud-init %q, tinyproxy %s, %d failed probes, Healthy=False %s: %s; tinyproxy's journal: %q",
			last.Status.Phase, time.Since(start).Round(time.Second), status, strings.TrimSpace(active),
			last.Status.ConsecutiveProbeFailures, c.Reason, c.Message, strings.TrimSpace(journal))
	}
	var evs eventsv1.EventList
	if err := ns.c.List(ctx, &evs, client.InNamespace(ns.key.Namespace)); err != nil {
		t.Fatalf("listing the Events of namespace %s: %v", ns.key.Namespace, err)
	}
	for _, ev := range evs.Items {
		if ev.Regarding.Name == ns.key.Name && ev.Reason == v1alpha1.ReasonProbeSucceeded {
			t.Errorf("Proxy %s, whose guest could not load the egress fence, was probed healthy at %s: %s",
				ns.key, ev.CreationTimestamp, ev.Note)
		}
	}
	if err := ns.c.Delete(ctx, last); err != nil {
		t.Fatalf("deleting Proxy %s: %v", ns.key, err)
	}
	ns.waitFor("Proxy "+ns.key.String()+" to be gone", shortDeadline, time.Second, func() (bool, error) {
		_, err := ns.proxy()
		return client.IgnoreNotFound(err) == nil && err != nil, nil
	})
}

// checkOneStart checks that tinyproxy started once on the guest: at boot, behind the
// fence, with the rendered configuration, never with the image's own and never restarted,
// started by the test image's seed unit (before cloud-init).
func (s *story) checkOneStart() {
	// With the seed unit and networkd's lease beside it, in the guest's monotonic time: the
	// log then shows how long after the address tinyproxy started and its fence loaded.
	out, _, err := s.host.GuestExec(s.vm, "/usr/bin/journalctl", "-b", "-u", "tinyproxy.service",
		"-u", "egress-proxies-operator-seed-files.service", "-u", "systemd-networkd.service", "-o", "short-monotonic", "--no-pager")
	if err != nil {
		s.t.Fatalf("reading tinyproxy's journal on the guest: %v", err)
	}
	starts := strings.Count(out, "Starting tinyproxy.service")
	if !strings.Contains(out, "seed files: started") {
		s.t.Errorf("the guest's seed unit did not start tinyproxy's path unit; the journal:\n%s", out)
	}
	if starts != 1 {
		s.t.Errorf("tinyproxy.service started %d times on the guest, want once; its journal:\n%s", starts, out)
	}
	s.t.Logf("tinyproxy.service started once on the guest; the journal of it, the seed unit and networkd:\n%s", strings.TrimSpace(out))
}
