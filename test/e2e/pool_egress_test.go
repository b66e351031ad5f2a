//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

// The pool test's manager probes every 5 s (--proxy-check-interval), so a probe times
// out after 5 s (the engine's timeout is at most the interval), and 3 failed probes in a
// row (the engine's default threshold) take a child out of rotation.
const (
	poolCheckInterval    = 5 * time.Second
	poolFailureThreshold = 3
)

// egressCheck checks the pool's WireGuard egress: each child leaves through the exit its
// assigned Secret names, and the internet stand-in (who, at target) sees it from that
// exit's address.
type egressCheck struct {
	p         *poolStory
	exits     []*wgExit
	who       *framework.Whoami
	target    string
	discovery string
	user      string
}

// exitOf is the exit whose Secret the child was assigned.
func (eg *egressCheck) exitOf(px *v1alpha1.Proxy) *wgExit {
	eg.p.t.Helper()
	name, field := px.WireGuardRef()
	for _, x := range eg.exits {
		if name == fmt.Sprintf("e2e-exit-%d", x.n) && field == "spec.proxy.egress.wireguard.assignedSecretRef" {
			return x
		}
	}
	eg.p.t.Fatalf("child %s holds WireGuard Secret %q (%s), none of the exits'", px.Name, name, field)
	return nil
}

func proxyURL(px *v1alpha1.Proxy, user, pass string) *url.URL {
	return &url.URL{Scheme: "http", Host: fmt.Sprintf("%s:%d", px.Status.IP, px.Spec.Port), User: url.UserPassword(user, pass)}
}

// check: the children (2, Ready) hold distinct exits; each one's status.egressIP is its
// exit's address; the pool counts 2 distinct egress IPs and says EgressShared=False;
// discovery with distinctEgress=true lists both; and a request through each reaches the
// internet stand-in from its exit's address.
func (eg *egressCheck) check(which string, kids []v1alpha1.Proxy, pass string) {
	p, t := eg.p, eg.p.t
	t.Helper()
	want := map[string]*wgExit{}
	for i := range kids {
		x := eg.exitOf(&kids[i])
		for other, ox := range want {
			if ox == x {
				t.Fatalf("%s: children %s and %s hold one exit's Secret (exit %d)", which, other, kids[i].Name, x.n)
			}
		}
		want[kids[i].Name] = x
	}
	start := time.Now()
	p.wait(which+": each child's status.egressIP its exit's, the pool's distinctEgressIPs 2 and EgressShared False", shortDeadline, func() (bool, error) {
		cur, err := p.children()
		if err != nil {
			return false, err
		}
		for _, px := range cur {
			if x := want[px.Name]; x != nil && px.Status.EgressIP != x.egress {
				return false, fmt.Errorf("%s: egressIP %q, want %s (exit %d)", px.Name, px.Status.EgressIP, x.egress, x.n)
			}
		}
		var pool v1alpha1.ProxyPool
		if err := p.c.Get(context.Background(), p.key, &pool); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(pool.Status.Conditions, v1alpha1.PoolConditionEgressShared)
		if pool.Status.DistinctEgressIPs != 2 || c == nil || c.Status != "False" {
			return false, fmt.Errorf("distinctEgressIPs %d, EgressShared %+v", pool.Status.DistinctEgressIPs, c)
		}
		return true, nil
	})
	var listed []string
	p.wait(which+": discovery with distinctEgress=true to list both children", shortDeadline, func() (bool, error) {
		body, err := framework.Get(discoveryClient, eg.discovery+"/v1/proxies?format=text&distinctEgress=true&pool="+url.QueryEscape(p.key.Name))
		listed = strings.Fields(body)
		return err == nil && len(listed) == 2, fmt.Errorf("listed %v: %v", listed, err)
	})
	for i := range kids {
		px, x := &kids[i], want[kids[i].Name]
		if !slices.Contains(listed, fmt.Sprintf("http://%s:%d", px.Status.IP, px.Spec.Port)) {
			eg.p.checks.Errorf("%s: discovery with distinctEgress=true listed %v, not child %s (%s:%d)", which, listed, px.Name, px.Status.IP, px.Spec.Port)
		}
		before := eg.who.From(x.egress)
		body, err := framework.Get(framework.ThroughClient(proxyURL(px, eg.user, pass)), eg.target+"/egress")
		if err != nil || !strings.Contains(body, `"`+x.egress+`"`) || eg.who.From(x.egress) <= before {
			t.Fatalf("%s: a request through child %s (%s) answered %q, %v; want it seen from exit %d's address %s",
				which, px.Name, px.Status.IP, body, err, x.n, x.egress)
		}
		t.Logf("%s: child %s (%s, Secret %s) leaves through exit %d: the internet stand-in saw it from %s",
			which, px.Name, px.Status.IP, px.Spec.Proxy.Egress.WireGuard.AssignedSecretRef.Name, x.n, x.egress)
	}
	t.Logf("%s: distinctEgressIPs 2, EgressShared False, discovery (distinctEgress=true) lists %d, within %s of both Ready",
		which, len(listed), time.Since(start).Round(100*time.Millisecond))
}

// checkExitDown stops the exit of the first of kids: within the failure threshold its
// child turns unhealthy and leaves discovery, and a request through it fails (it has no
// other way out), while the other child keeps working through its own exit.
func (eg *egressCheck) checkExitDown(kids []v1alpha1.Proxy, pass string) {
	p, t := eg.p, eg.p.t
	t.Helper()
	victim, other := kids[0], kids[1]
	vx, ox := eg.exitOf(&victim), eg.exitOf(&other)
	stopped := time.Now()
	vx.stop()
	t.Logf("exit %d (%s) stopped: wireguard-go ended; child %s leaves through it", vx.n, vx.egress, victim.Name)
	otherURL := fmt.Sprintf("http://%s:%d", other.Status.IP, other.Spec.Port)
	var last v1alpha1.Proxy
	p.wait("child "+victim.Name+" to turn unhealthy and discovery to list only "+other.Name, shortDeadline, func() (bool, error) {
		cur, err := p.children()
		if err != nil {
			return false, err
		}
		for _, px := range cur {
			if px.Name == victim.Name {
				last = px
			}
		}
		if last.Status.Healthy {
			return false, fmt.Errorf("%s healthy, %d failed probes", victim.Name, last.Status.ConsecutiveProbeFailures)
		}
		body, err := framework.Get(discoveryClient, eg.discovery+"/v1/proxies?format=text&pool="+url.QueryEscape(p.key.Name))
		listed := strings.Fields(body)
		return err == nil && len(listed) == 1 && listed[0] == otherURL, fmt.Errorf("discovery lists %v: %v", listed, err)
	})
	took := time.Since(stopped)
	c := meta.FindStatusCondition(last.Status.Conditions, v1alpha1.ConditionHealthy)
	t.Logf("TIMING exit down: exit %d stopped -> child %s unhealthy and out of discovery in %s (%d failed probes, Healthy %+v)",
		vx.n, victim.Name, took.Round(100*time.Millisecond), last.Status.ConsecutiveProbeFailures, c)
	// The threshold's probes fall in the rounds after the stop: up to one interval until
	// the first, the threshold's intervals, the last probe's timeout (at most an interval),
	// and some slack for the status write and discovery's cache.
	if bound := (poolFailureThreshold+2)*poolCheckInterval + 10*time.Second; took > bound {
		eg.p.checks.Errorf("child %s took %s to leave discovery after its exit stopped, want at most %s (%d probes every %s)",
			victim.Name, took.Round(100*time.Millisecond), bound, poolFailureThreshold, poolCheckInterval)
	}
	if last.Status.ConsecutiveProbeFailures < poolFailureThreshold {
		eg.p.checks.Errorf("child %s is unhealthy after %d failed probes, want %d", victim.Name, last.Status.ConsecutiveProbeFailures, poolFailureThreshold)
	}
	hc := framework.ThroughClient(proxyURL(&victim, eg.user, pass))
	hc.Timeout = 20 * time.Second
	start := time.Now()
	if resp, err := hc.Get(eg.target + "/exit-down"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			eg.p.checks.Errorf("a request through child %s, whose exit is stopped, was answered %s", victim.Name, resp.Status)
		} else {
			t.Logf("a request through child %s, whose exit is stopped, failed: %s after %s", victim.Name, resp.Status, time.Since(start).Round(100*time.Millisecond))
		}
	} else {
		t.Logf("a request through child %s, whose exit is stopped, failed: %v", victim.Name, err)
	}
	before := eg.who.From(ox.egress)
	body, err := framework.Get(framework.ThroughClient(proxyURL(&other, eg.user, pass)), eg.target+"/other-exit")
	if err != nil || !strings.Contains(body, `"`+ox.egress+`"`) || eg.who.From(ox.egress) <= before {
		eg.p.checks.Errorf("a request through child %s, whose exit %d still runs, answered %q, %v; want it seen from %s", other.Name, ox.n, body, err, ox.egress)
	} else {
		t.Logf("child %s still leaves through exit %d (%s)", other.Name, ox.n, ox.egress)
	}
}

// checkNoLeak: every request the internet stand-in saw in the whole test came from an
// exit's address.
func (eg *egressCheck) checkNoLeak() {
	t := eg.p.t
	t.Helper()
	exitAddrs := map[string]bool{}
	for _, x := range eg.exits {
		exitAddrs[x.egress] = true
	}
	callers := eg.who.Callers()
	for ip, n := range callers {
		if !exitAddrs[ip] {
			eg.p.checks.Errorf("the internet stand-in saw %d requests from %s, not an exit's address: traffic that bypassed the tunnel", n, ip)
		}
	}
	t.Logf("the internet stand-in saw requests from %v during the whole test (the exits: %v)", callers, slices.Sorted(maps.Keys(exitAddrs)))
}
