//go:build deploy

// Package deploy is make test-deploy: the operator installed as a user installs it, from
// its image and config/default, on a real one-node cluster (hack/cluster.sh), driving a
// real guest VM on the local libvirt host (hack/libvirt-host.sh).
package deploy

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

const (
	namespace   = "egress-proxies-operator-system"
	managerName = "egress-proxies-operator-controller-manager" // the Deployment and the Service
	leaseName   = "egress-proxies-operator.egress.hrajfrisbee.cz"
	image       = "egress-proxies-operator:test-deploy"
	overlay     = "test/deploy/overlay"
	proxyNS     = "default"
	proxyName   = "proxy-kvm2-sample"
	// A TCG guest boots in 30-110 s, after the image is fetched and uploaded.
	readyDeadline = 25 * time.Minute
)

// stopwatch records each step's wall time and prints them all at the end.
type stopwatch struct {
	t     *testing.T
	names []string
	took  []time.Duration
	extra []string
}

func (s *stopwatch) step(name string, f func()) {
	s.t.Helper()
	s.t.Logf("step: %s", name)
	start := time.Now()
	f()
	s.names = append(s.names, name)
	s.took = append(s.took, time.Since(start))
	s.t.Logf("step done in %s: %s", time.Since(start).Round(100*time.Millisecond), name)
}

func (s *stopwatch) note(format string, args ...any) {
	s.extra = append(s.extra, fmt.Sprintf(format, args...))
}

func (s *stopwatch) report() {
	var b strings.Builder
	var total time.Duration
	for i, n := range s.names {
		fmt.Fprintf(&b, "\n  %8s  %s", s.took[i].Round(100*time.Millisecond), n)
		total += s.took[i]
	}
	fmt.Fprintf(&b, "\n  %8s  total", total.Round(100*time.Millisecond))
	for _, e := range s.extra {
		fmt.Fprintf(&b, "\n  %s", e)
	}
	s.t.Logf("timings:%s", b.String())
}

func TestDeployedOperator(t *testing.T) {
	e := loadEnv(t)
	c := newClient(t, e)
	ctx := context.Background()
	sw := &stopwatch{t: t}
	defer sw.report()

	who := &callers{}
	probeAddr := serveOn(t, e.bridgeIP, who)
	imagePath, imageSHA := guestImage(t)
	// The pods reach the host at the pod bridge's gateway; an answer from the libvirt
	// bridge's address would not leave for them (the host's guard keeps that address on
	// its bridge).
	imageAddr := serveOn(t, e.gateway, fileServer(imagePath))

	sw.step("build the manager image (make image-tar) and import it into the node's containerd", func() {
		e.mustRun(t, "make", "image-tar", "IMG="+image)
		e.mustRun(t, "hack/cluster.sh", "import", "bin/image/manager.tar")
	})

	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: proxyNS, Name: proxyName}}
	installed := false
	t.Cleanup(func() { cleanUp(t, e, c, px, installed) })
	token := fmt.Sprintf("deploy-test-%d", time.Now().UnixNano())

	sw.step("kubectl apply -k (config/default with the test's image and providers config), make kvm-ssh-secret, make discovery-token-secret", func() {
		writeOverlay(t, e, "http://"+imageAddr+"/guest.qcow2", imageSHA, "http://"+probeAddr+"/v1/whoami")
		installed = true
		e.mustRun(t, e.kubectl, "apply", "-k", overlay)
		e.mustRun(t, "make", "kvm-ssh-secret", "KVM_SSH_KEY="+e.hostKey, "KVM_KNOWN_HOSTS="+e.knownHostsForPods(t))
		e.mustRun(t, "make", "discovery-token-secret", "DISCOVERY_TOKEN_FILE="+tokenFile(t, token))
	})

	var pods []corev1.Pod
	var leader string
	sw.step("the Deployment Available with 2 ready replicas, one of them leader", func() {
		pods = waitAvailable(t, c, "")
		leader = waitLeader(t, c, pods, "")
		t.Logf("pods %s and %s, leader %s", pods[0].Name, pods[1].Name, leader)
	})

	discovery := "http://" + serviceIP(t, c) + ":8082"
	sw.step("the discovery API refuses a caller without the bearer token, and a wrong one", func() {
		waitFor(t, "the discovery token Secret to reach both pods (the kubelet syncs the optional volume)", 5*time.Minute, 2*time.Second, func() (bool, error) {
			for _, p := range pods {
				if code, body := httpGet(http.DefaultClient, "http://"+p.Status.PodIP+":8082/v1/proxies", token); code != http.StatusOK {
					return false, fmt.Errorf("pod %s: %d %s", p.Name, code, body)
				}
			}
			return true, nil
		})
		for _, tok := range []string{"", "not-" + token} {
			if code, body := httpGet(http.DefaultClient, discovery+"/v1/proxies", tok); code != http.StatusUnauthorized {
				t.Errorf("discovery with token %q: %d %s, want 401", tok, code, body)
			}
		}
	})

	sw.step("metrics refused without a token and to a ServiceAccount without metrics-reader, served to one with it", func() {
		checkMetrics(t, e, c, "https://"+serviceIP(t, c)+":8443/metrics")
	})

	sw.step("the NetworkPolicy sample passes the API server's validation (kubectl apply --dry-run=server)", func() {
		e.mustRun(t, e.kubectl, "apply", "-k", "config/network-policy", "--dry-run=server")
	})

	var ready *v1alpha1.Proxy
	sw.step("the sample Proxy Ready with a real guest VM (image fetched, guest booted under "+e.domainType+")", func() {
		e.mustRun(t, e.kubectl, "apply", "-n", proxyNS, "-f", sampleAllowing(t, probeAddr))
		ready = waitProxy(t, c, "Ready and healthy (probed through the guest's proxy)", readyDeadline, isReady)
		if who.from(ready.Status.IP) == 0 {
			t.Fatalf("Ready, but the probe target never saw the guest's address %s", ready.Status.IP)
		}
		// The Ready condition is there for kubectl wait (and kstatus readers).
		e.mustRun(t, e.kubectl, "wait", "-n", proxyNS, "--for=condition=Ready", "proxy/"+proxyName, "--timeout=60s")
	})
	want := fmt.Sprintf("http://%s:%d", ready.Status.IP, ready.Spec.Port)

	sw.step("discovery lists the proxy through the Service and through each pod; a request through the proxy works with the credentials discovery hands out, and gets 407 without", func() {
		for _, base := range append([]string{discovery}, "http://"+pods[0].Status.PodIP+":8082", "http://"+pods[1].Status.PodIP+":8082") {
			waitFor(t, base+" to list "+want, 2*time.Minute, time.Second, func() (bool, error) {
				code, body := httpGet(http.DefaultClient, base+"/v1/proxies?format=text", token)
				return code == http.StatusOK && strings.TrimSpace(body) == want, fmt.Errorf("%d %q", code, body)
			})
		}
		// The sample's Proxy has basic auth: ?credentials=true hands out the URL with them.
		var withCreds *url.URL
		waitFor(t, discovery+" to hand out "+want+" with credentials", 2*time.Minute, time.Second, func() (bool, error) {
			code, body := httpGet(http.DefaultClient, discovery+"/v1/proxies?format=text&credentials=true", token)
			u, err := url.Parse(strings.TrimSpace(body))
			if code != http.StatusOK || err != nil || u.User == nil || "http://"+u.Host != want {
				return false, fmt.Errorf("%d, not a URL of %s with credentials", code, want)
			}
			withCreds = u
			return true, nil
		})
		target := "http://" + probeAddr + "/through-the-proxy"
		through(t, withCreds.String(), target, who, ready.Status.IP)
		if code := statusThrough(t, want, target); code != http.StatusProxyAuthRequired {
			t.Fatalf("GET %s through %s without credentials: %d, want 407", target, want, code)
		}
		if doms := domainsCarrying(t, string(ready.UID)); len(doms) != 1 || doms[0] != ready.InstanceName() {
			t.Fatalf("domains carrying the Proxy's UID: %v, want [%s]", doms, ready.InstanceName())
		}
	})

	sw.step("leader Pod deleted: the other replica takes the lease, the Proxy stays Ready, one domain, discovery answers", func() {
		failover(t, c, sw, who, pods, leader, discovery, token, want, ready)
	})

	sw.step("the Proxy deleted: no domain, volume or NVRAM file left", func() {
		e.mustRun(t, e.kubectl, "delete", "-n", proxyNS, "proxy", proxyName, "--wait=false")
		waitFor(t, "the Proxy to be gone (its finalizer removes the VM)", 10*time.Minute, time.Second, func() (bool, error) {
			err := c.Get(ctx, client.ObjectKeyFromObject(px), &v1alpha1.Proxy{})
			return apierrors.IsNotFound(err), err
		})
		if left := leftovers(t, e, ready.InstanceName()); len(left) != 0 {
			t.Fatalf("left on the host after the Proxy went: %v", left)
		}
	})

	sw.step("kubectl delete -k removes the rest", func() {
		e.mustRun(t, e.kubectl, "delete", "-k", overlay, "--wait=true", "--timeout=5m")
		installed = false
		checkRemoved(t, c)
	})
}

// sampleAllowing writes config/samples/proxy_kvm2.yaml with the probe target's address
// (host:port) as spec.proxy.allowedDestinations in place of the demo's, as a user whose
// probe target is on a private network must: the guest's egress fence refuses it
// otherwise. It returns the file's path.
func sampleAllowing(t *testing.T, probeAddr string) string {
	t.Helper()
	host, _, err := net.SplitHostPort(probeAddr)
	if err != nil {
		t.Fatalf("probe target %q: %v", probeAddr, err)
	}
	data, err := os.ReadFile(filepath.Join(repoRoot, "config", "samples", "proxy_kvm2.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const allowed = "    allowedDestinations: [10.123.0.1/32]\n"
	if !strings.Contains(string(data), allowed) {
		t.Fatalf("config/samples/proxy_kvm2.yaml no longer has the line %q the test replaces", allowed)
	}
	out := strings.Replace(string(data), allowed, "    allowedDestinations: ["+host+"/32]\n", 1)
	p := filepath.Join(t.TempDir(), "proxy_kvm2.yaml")
	if err := os.WriteFile(p, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeOverlay writes the two files the test overlay names: the providers config for the
// local libvirt host, as the pods reach it, and the probe target's URL.
func writeOverlay(t *testing.T, e env, imageURL, imageSHA, probeURL string) {
	t.Helper()
	// The names are those config/samples/proxy_kvm2.yaml asks for; the key and known_hosts
	// paths are config/default's kvm-ssh mount, as in config/manager/providers_config.yaml.
	cfg := provider.Config{Providers: []provider.ProviderConfig{{Name: "kvm2-home", Type: "kvm2", KVM2: &provider.KVMConfig{
		SSHKeyFile:     "/etc/proxy-operator/kvm/id_ed25519",
		KnownHostsFile: "/etc/proxy-operator/kvm/known_hosts",
		DiskSizeGb:     2,
		Images:         map[string]provider.KVMImage{"debian-12": {URL: imageURL, SHA256: imageSHA, Format: "qcow2", Firmware: "uefi"}},
		MachineTypes:   map[string]provider.KVMMachineType{"small": {VCPUs: 2, MemoryMiB: 1024}},
		Hosts: []provider.KVMHost{{Name: "local", Address: e.podHostAddress(t), User: e.hostUser, Socket: e.socket,
			Pool: e.pool, Bridge: e.bridge, DomainType: e.domainType}},
	}}}}
	providers, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.ParseConfig(providers); err != nil {
		t.Fatalf("the test's providers config: %v\n%s", err, providers)
	}
	patch := fmt.Sprintf("- op: add\n  path: /spec/template/spec/containers/0/args/-\n  value: --proxy-probe-url=%s\n", probeURL)
	dir := filepath.Join(repoRoot, overlay)
	for name, content := range map[string]string{"providers.yaml": string(providers), "probe-url.yaml": patch} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// tokenFile holds the discovery token for make discovery-token-secret.
func tokenFile(t *testing.T, token string) string {
	p := filepath.Join(t.TempDir(), "discovery-token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func serviceIP(t *testing.T, c client.Client) string {
	t.Helper()
	var svc corev1.Service
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: managerName}, &svc); err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// waitAvailable waits for the Deployment to be Available with two ready, updated replicas
// and returns their pods, none of them named not.
func waitAvailable(t *testing.T, c client.Client, not string) []corev1.Pod {
	t.Helper()
	ctx := context.Background()
	var pods []corev1.Pod
	waitFor(t, "Deployment "+managerName+" Available with 2 ready replicas (readiness: the manager's /readyz)", 10*time.Minute, time.Second, func() (bool, error) {
		var d appsv1.Deployment
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: managerName}, &d); err != nil {
			return false, err
		}
		available := false
		for _, cond := range d.Status.Conditions {
			available = available || (cond.Type == appsv1.DeploymentAvailable && cond.Status == corev1.ConditionTrue)
		}
		if !available || d.Status.ReadyReplicas != 2 || d.Status.UpdatedReplicas != 2 || d.Status.Replicas != 2 {
			return false, fmt.Errorf("available %v, replicas %d, ready %d, updated %d", available, d.Status.Replicas, d.Status.ReadyReplicas, d.Status.UpdatedReplicas)
		}
		var list corev1.PodList
		if err := c.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabels{"control-plane": "controller-manager"}); err != nil {
			return false, err
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && p.Name != not && podReady(p) {
				pods = append(pods, p)
			}
		}
		return len(pods) == 2, fmt.Errorf("%d ready pods", len(pods))
	})
	return pods
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// holder is the pod named by the leader election lease, "" when none.
func holder(c client.Client) (string, *coordinationv1.Lease, error) {
	var l coordinationv1.Lease
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: leaseName}, &l); err != nil {
		return "", nil, err
	}
	if l.Spec.HolderIdentity == nil {
		return "", &l, nil
	}
	pod, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_") // controller-runtime: <hostname>_<uuid>
	return pod, &l, nil
}

// waitLeader waits until the lease is held by one of pods other than not.
func waitLeader(t *testing.T, c client.Client, pods []corev1.Pod, not string) string {
	t.Helper()
	var name string
	waitFor(t, "one of the pods to hold lease "+leaseName, 3*time.Minute, 100*time.Millisecond, func() (bool, error) {
		h, _, err := holder(c)
		name = h
		for _, p := range pods {
			if p.Name == h && h != not {
				return true, nil
			}
		}
		return false, fmt.Errorf("held by %q (%v)", h, err)
	})
	return name
}

func isReady(px *v1alpha1.Proxy) bool {
	return px.Status.Phase == v1alpha1.PhaseReady && px.Status.Healthy && px.Status.IP != ""
}

// waitProxy waits for the sample Proxy to satisfy ok, logging each phase change.
func waitProxy(t *testing.T, c client.Client, what string, timeout time.Duration, ok func(*v1alpha1.Proxy) bool) *v1alpha1.Proxy {
	t.Helper()
	var got *v1alpha1.Proxy
	last := ""
	waitFor(t, "Proxy "+proxyName+" "+what, timeout, time.Second, func() (bool, error) {
		px := &v1alpha1.Proxy{}
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: proxyNS, Name: proxyName}, px); err != nil {
			return false, err
		}
		if line := fmt.Sprintf("%s healthy=%v ip=%s: %s", px.Status.Phase, px.Status.Healthy, px.Status.IP, px.Status.Message); line != last {
			t.Logf("proxy: %s", line)
			last = line
		}
		got = px
		return ok(px), fmt.Errorf("%s", last)
	})
	return got
}

// through sends a request through the proxy at proxyURL to target, and checks that it
// arrived from the guest's address.
func through(t *testing.T, proxyURL, target string, who *callers, ip string) {
	t.Helper()
	u, err := url.Parse(proxyURL)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(u)}}
	before := who.from(ip)
	code, body := httpGet(c, target, "")
	if code != http.StatusOK || !strings.Contains(body, `"`+ip+`"`) || who.from(ip) <= before {
		t.Fatalf("GET %s through %s: %d %q; want it to come from the guest's address %s", target, u.Redacted(), code, body, ip)
	}
	t.Logf("a request through %s reached %s from %s", u.Redacted(), target, ip)
}

// statusThrough is the status of GET target through the proxy at proxyURL.
func statusThrough(t *testing.T, proxyURL, target string) int {
	t.Helper()
	u, err := url.Parse(proxyURL)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(u)}}
	code, _ := httpGet(c, target, "")
	return code
}

// failover deletes the leader's pod and measures how long another replica takes to hold
// the lease; meanwhile and until the new leader has probed twice, the Proxy must stay Ready,
// discovery through the Service must keep listing it, and the VM must stay the only one.
func failover(t *testing.T, c client.Client, sw *stopwatch, who *callers, pods []corev1.Pod, leader, discovery, token, want string, ready *v1alpha1.Proxy) {
	t.Helper()
	ctx := context.Background()
	var other string
	for _, p := range pods {
		if p.Name != leader {
			other = p.Name
		}
	}
	_, lease, err := holder(c)
	if err != nil {
		t.Fatal(err)
	}
	leaseDuration := time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second

	// Watch the Proxy and discovery once a second from the deletion on.
	stop := make(chan struct{})
	type sample struct {
		at        time.Time
		phase     v1alpha1.ProxyPhase
		healthy   bool
		discovery string
	}
	samples := make(chan []sample, 1)
	go func() {
		var got []sample
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			s := sample{at: time.Now()}
			px := &v1alpha1.Proxy{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(ready), px); err == nil {
				s.phase, s.healthy = px.Status.Phase, px.Status.Healthy
			}
			// Up to three tries within the second: a connection may land on the going pod
			// before kube-proxy drops its endpoint.
			for try := 0; try < 3; try++ {
				code, body := httpGet(&http.Client{Timeout: 300 * time.Millisecond}, discovery+"/v1/proxies?format=text", token)
				s.discovery = fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
				if code == http.StatusOK && strings.TrimSpace(body) == want {
					s.discovery = "ok"
					break
				}
			}
			got = append(got, s)
			select {
			case <-stop:
				samples <- got
				return
			case <-tick.C:
			}
		}
	}()

	// The going leader releases the lease on SIGTERM (LeaderElectionReleaseOnCancel), so
	// whichever live replica asks first takes it: the standby, retrying every 2 s, or the
	// pod the ReplicaSet starts in the deleted one's place.
	start := time.Now()
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: leader}}); err != nil {
		t.Fatal(err)
	}
	var next string
	took := waitFor(t, "another replica to take lease "+leaseName, 2*leaseDuration+time.Minute, 50*time.Millisecond, func() (bool, error) {
		h, _, err := holder(c)
		if h == "" || h == leader {
			return false, fmt.Errorf("held by %q (%v)", h, err)
		}
		var p corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: h}, &p); err != nil || p.DeletionTimestamp != nil {
			return false, fmt.Errorf("held by %q, not a live pod (%v)", h, err)
		}
		next = h
		return true, nil
	})
	which := "the replacement pod"
	if next == other {
		which = "the standby replica"
	}
	sw.note("failover: %s (%s) took the lease %s after the leader's pod %s was deleted (lease duration %s)",
		next, which, took.Round(10*time.Millisecond), leader, leaseDuration)
	t.Logf("failover took %s, to %s", took, which)
	if took > leaseDuration {
		t.Errorf("the other replica took the lease after %s, more than the lease duration %s", took, leaseDuration)
	}
	// The Deployment replaces the deleted pod; then two probes by the new leader (only the
	// leader probes), seen where they land: the probe target, reached through the guest.
	atTakeover := who.from(ready.Status.IP)
	waitAvailable(t, c, leader)
	waitFor(t, "two probes through the guest by the new leader", 3*time.Minute, time.Second, func() (bool, error) {
		n := who.from(ready.Status.IP) - atTakeover
		return n >= 2, fmt.Errorf("%d probes since the takeover", n)
	})
	close(stop)
	got := <-samples
	bad := 0
	for _, s := range got {
		if s.phase != v1alpha1.PhaseReady || !s.healthy || s.discovery != "ok" {
			bad++
			t.Errorf("at +%s: phase %s healthy %v, discovery %q", s.at.Sub(start).Round(100*time.Millisecond), s.phase, s.healthy, s.discovery)
		}
	}
	sw.note("after the failover: %d samples over %s, %d with the Proxy not Ready or discovery not listing it", len(got), time.Since(start).Round(time.Second), bad)
	if doms := domainsCarrying(t, string(ready.UID)); len(doms) != 1 || doms[0] != ready.InstanceName() {
		t.Fatalf("domains carrying the Proxy's UID after the failover: %v, want [%s]", doms, ready.InstanceName())
	}
	px := &v1alpha1.Proxy{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ready), px); err != nil {
		t.Fatal(err)
	}
	if px.Status.ProviderID != ready.Status.ProviderID || px.Status.IP != ready.Status.IP {
		t.Errorf("after the failover the Proxy is instance %s at %s, before %s at %s", px.Status.ProviderID, px.Status.IP, ready.Status.ProviderID, ready.Status.IP)
	}
}

// checkMetrics: refused without a token (401) and to a ServiceAccount not bound to the
// metrics-reader ClusterRole (403), served to one bound to it.
func checkMetrics(t *testing.T, e env, c client.Client, metricsURL string) {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "deploy-test-monitoring"}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), ns) })
	for _, sa := range []string{"prometheus", "someone-else"} {
		e.mustRun(t, e.kubectl, "-n", ns.Name, "create", "serviceaccount", sa)
	}
	e.mustRun(t, e.kubectl, "create", "clusterrolebinding", "deploy-test-prometheus-metrics",
		"--clusterrole=egress-proxies-operator-metrics-reader", "--serviceaccount="+ns.Name+":prometheus")
	t.Cleanup(func() {
		_, _ = e.run(context.Background(), e.kubectl, "delete", "clusterrolebinding", "deploy-test-prometheus-metrics", "--ignore-not-found")
	})
	allowed := strings.TrimSpace(e.mustRun(t, e.kubectl, "-n", ns.Name, "create", "token", "prometheus"))
	denied := strings.TrimSpace(e.mustRun(t, e.kubectl, "-n", ns.Name, "create", "token", "someone-else"))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the manager's certificate is self-signed
	}}
	waitFor(t, "metrics served to the authorised ServiceAccount through the Service", 2*time.Minute, time.Second, func() (bool, error) {
		code, body := httpGet(hc, metricsURL, allowed)
		return code == http.StatusOK && strings.Contains(body, "go_goroutines"), fmt.Errorf("%d %.200s", code, body)
	})
	if code, body := httpGet(hc, metricsURL, ""); code != http.StatusUnauthorized {
		t.Errorf("metrics without a token: %d %.200s, want 401", code, body)
	}
	if code, body := httpGet(hc, metricsURL, denied); code != http.StatusForbidden {
		t.Errorf("metrics to a ServiceAccount without metrics-reader: %d %.200s, want 403", code, body)
	}
	if code, body := httpGet(http.DefaultClient, strings.Replace(metricsURL, "https://", "http://", 1), allowed); code == http.StatusOK {
		t.Errorf("metrics over plain HTTP: %d %.200s", code, body)
	}
}

// checkRemoved: after kubectl delete -k, none of what config/default made is left.
func checkRemoved(t *testing.T, c client.Client) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, "namespace "+namespace+" to be gone", 5*time.Minute, time.Second, func() (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Name: namespace}, &corev1.Namespace{})
		return apierrors.IsNotFound(err), err
	})
	var px v1alpha1.ProxyList
	if err := c.List(ctx, &px); err == nil {
		t.Errorf("the Proxy CRD is still served (%d Proxies)", len(px.Items))
	}
	for _, name := range []string{"manager-role", "metrics-auth-role", "metrics-reader"} {
		err := c.Get(ctx, client.ObjectKey{Name: "egress-proxies-operator-" + name}, &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"}})
		if !apierrors.IsNotFound(err) {
			t.Errorf("ClusterRole egress-proxies-operator-%s: %v, want it gone", name, err)
		}
	}
}

// cleanUp, when the test stopped half way: the Proxy is deleted while the manager still
// runs (its finalizer removes the VM), then the install; a VM still left is removed.
func cleanUp(t *testing.T, e env, c client.Client, px *v1alpha1.Proxy, installed bool) {
	if !installed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	vm := ""
	got := &v1alpha1.Proxy{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(px), got); err == nil {
		vm = got.InstanceName()
		_ = c.Delete(ctx, got)
		for ctx.Err() == nil && !apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(px), got)) {
			time.Sleep(2 * time.Second)
		}
	}
	if out, err := e.run(ctx, e.kubectl, "delete", "-k", overlay, "--ignore-not-found", "--wait=true", "--timeout=5m"); err != nil {
		t.Logf("cleanup: %v %s", err, out)
	}
	if vm != "" {
		if left := leftovers(t, e, vm); len(left) > 0 {
			t.Logf("cleanup: removing what the Proxy left: %v", left)
			_, _ = virsh("destroy", vm)
			_, _ = virsh("undefine", "--nvram", "--managed-save", vm)
			for _, v := range []string{vm + ".qcow2", vm + "-seed.iso"} {
				_, _ = virsh("vol-delete", "--pool", e.pool, v)
			}
		}
	}
}
