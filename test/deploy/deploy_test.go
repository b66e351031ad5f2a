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
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

const (
	namespace   = "egress-proxies-operator-system"
	managerName = "egress-proxies-operator-controller-manager" // the Deployment and the Service
	leaseName   = "egress-proxies-operator.egress.hrajfrisbee.cz"
	image       = "egress-proxies-operator:test-deploy"
	release     = "egress-proxies-operator"
	chart       = "charts/egress-proxies-operator"
	values      = "test/deploy/values.yaml" // the tier's values file
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

	who := &framework.Whoami{}
	probeURL := framework.Serve(t, e.BridgeIP, who)
	probeAddr := strings.TrimPrefix(probeURL, "http://")
	imagePath, imageSHA := framework.GuestImage(t)
	// The pods reach the host at the pod bridge's gateway; an answer from the libvirt
	// bridge's address would not leave for them (the host's guard keeps that address on
	// its bridge).
	imageURL := framework.Serve(t, e.gateway, fileServer(imagePath))

	sw.step("build the manager image (make image-tar) and the crawler Pod's (hack/imagebuild), import them into the node's containerd", func() {
		e.mustRun(t, "make", "image-tar", "IMG="+image)
		e.mustRun(t, "hack/cluster.sh", "import", "bin/image/manager.tar", buildCrawlerImage(t, e))
	})

	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: proxyNS, Name: proxyName}}
	installed := false
	t.Cleanup(func() { cleanUp(t, e, c, px, installed) })
	token := fmt.Sprintf("deploy-test-%d", time.Now().UnixNano())

	sw.step("helm install (the chart with the tier's values, the test's providers config and probe target), make kvm-ssh-secret, make discovery-token-secret", func() {
		runValues := writeRunValues(t, e, imageURL+"/guest.qcow2", imageSHA, probeURL+"/v1/whoami")
		installed = true
		e.mustRun(t, e.helm, "install", release, chart, "-n", namespace, "--create-namespace", "-f", values, "-f", runValues)
		e.mustRun(t, "make", "kvm-ssh-secret", "KVM_SSH_KEY="+e.Key, "KVM_KNOWN_HOSTS="+e.knownHostsForPods(t))
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
		testutil.WaitFor(t, 5*time.Minute, "the discovery token Secret to reach both pods (the kubelet syncs the optional volume), and the Service to reach them (kube-proxy programs it a moment after the pods are ready)", func() (bool, error) {
			for _, p := range pods {
				if code, body := framework.GetStatus(http.DefaultClient, "http://"+p.Status.PodIP+":8082/v1/proxies", token); code != http.StatusOK {
					return false, fmt.Errorf("pod %s: %d %s", p.Name, code, body)
				}
			}
			if code, body := framework.GetStatus(http.DefaultClient, discovery+"/v1/proxies", token); code != http.StatusOK {
				return false, fmt.Errorf("the Service %s: %d %s", discovery, code, body)
			}
			return true, nil
		}, testutil.Every(time.Second))
		for _, tok := range []string{"", "not-" + token} {
			if code, body := framework.GetStatus(http.DefaultClient, discovery+"/v1/proxies", tok); code != http.StatusUnauthorized {
				t.Errorf("discovery with token %q: %d %s, want 401", tok, code, body)
			}
		}
	})

	var metricsToken string
	var prom *prometheus
	sw.step("metrics refused without a token and to a ServiceAccount without metrics-reader, served to one with it", func() {
		metricsToken = checkMetrics(t, e, c, "https://"+serviceIP(t, c)+":8443/metrics")
	})

	sw.step("a Prometheus of the test's own scrapes both manager pods with the metrics-reader token, and both gateway pods", func() {
		prom = startPrometheus(t, e, pods, gatewayPods(t, c), metricsToken)
	})

	sw.step("the NetworkPolicy sample passes the API server's validation (kubectl apply --dry-run=server)", func() {
		e.mustRun(t, e.kubectl, "apply", "-k", "config/network-policy", "--dry-run=server")
	})

	var ready *v1alpha1.Proxy
	sw.step("the sample Proxy Ready with a real guest VM (image fetched, guest booted under "+e.DomainType+")", func() {
		e.mustRun(t, e.kubectl, "apply", "-n", proxyNS, "-f", sampleAllowing(t, e, probeAddr))
		ready = framework.WaitProxy(t, c, client.ObjectKeyFromObject(px), "Ready and healthy (probed through the guest's proxy)", readyDeadline, framework.IsReady, testutil.Every(time.Second))
		if who.From(ready.Status.IP) == 0 {
			t.Fatalf("Ready, but the probe target never saw the guest's address %s", ready.Status.IP)
		}
		// The Ready condition is there for kubectl wait (and kstatus readers).
		e.mustRun(t, e.kubectl, "wait", "-n", proxyNS, "--for=condition=Ready", "proxy/"+proxyName, "--timeout=60s")
	})
	want := fmt.Sprintf("http://%s:%d", ready.Status.IP, ready.Spec.Port)

	sw.step("discovery lists the proxy through the Service and through each pod; a request through the proxy works with the credentials discovery hands out, and gets 407 without", func() {
		for _, base := range append([]string{discovery}, "http://"+pods[0].Status.PodIP+":8082", "http://"+pods[1].Status.PodIP+":8082") {
			testutil.WaitFor(t, 2*time.Minute, base+" to list "+want, func() (bool, error) {
				code, body := framework.GetStatus(http.DefaultClient, base+"/v1/proxies?format=text", token)
				return code == http.StatusOK && strings.TrimSpace(body) == want, fmt.Errorf("%d %q", code, body)
			}, testutil.Every(time.Second))
		}
		// The sample's Proxy has basic auth: ?credentials=true hands out the URL with them.
		var withCreds *url.URL
		testutil.WaitFor(t, 2*time.Minute, discovery+" to hand out "+want+" with credentials", func() (bool, error) {
			code, body := framework.GetStatus(http.DefaultClient, discovery+"/v1/proxies?format=text&credentials=true", token)
			u, err := url.Parse(strings.TrimSpace(body))
			if code != http.StatusOK || err != nil || u.User == nil || "http://"+u.Host != want {
				return false, fmt.Errorf("%d, not a URL of %s with credentials", code, want)
			}
			withCreds = u
			return true, nil
		}, testutil.Every(time.Second))
		target := probeURL + "/through-the-proxy"
		framework.Through(t, withCreds, target, who, ready.Status.IP)
		if code, err := framework.StatusThrough(&url.URL{Scheme: "http", Host: withCreds.Host}, target); code != http.StatusProxyAuthRequired {
			t.Fatalf("GET %s through %s without credentials: %d (%v), want 407", target, want, code, err)
		}
		if doms, err := e.host.DomainsMatching(string(ready.UID)); err != nil || len(doms) != 1 || doms[0] != ready.InstanceName() {
			t.Fatalf("domains carrying the Proxy's UID: %v (%v), want [%s]", doms, err, ready.InstanceName())
		}
	})

	sw.step("crawler Pods with their own projected ServiceAccount tokens: the proxy's namespace's lists and picks its proxy, without credentials; another namespace's gets none", func() {
		checkCrawlerPods(t, e, c, discovery, want)
	})

	sw.step("the gateway Deployment ready; a crawler Pod reaches the test's site through it by HTTP_PROXY with its own ServiceAccount token, through the Proxy; another namespace's is refused the Proxy's", func() {
		checkGateway(t, e, c, who, probeURL, ready)
	})

	sw.step("a real Prometheus: every dashboard query and alert expression evaluates, the Proxies panels return series while the Proxy is Ready, and the Gateway panels of what the gateway carried", func() {
		panels, err := framework.DashboardQueries(filepath.Join(e.root, "config", "grafana", "egress-proxies-operator.json"))
		if err != nil {
			t.Fatal(err)
		}
		alerts, err := framework.AlertRules(filepath.Join(e.root, "config", "prometheus", "rules.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		prom.checkRules(t, alerts)
		evaluated, withSeries := prom.checkQueries(t, panels, alerts)
		sw.note("prometheus: %d expressions evaluated (%d dashboard queries, %d alerts), %d returned series", evaluated, len(panels), len(alerts), withSeries)
	})

	sw.step("leader Pod deleted: the other replica takes the lease, the Proxy stays Ready, one domain, discovery answers", func() {
		leader = failover(t, e, c, sw, who, pods, leader, discovery, token, want, ready)
	})

	sw.step("leader Pod deleted twice more: each takeover timed", func() {
		for run := 2; run <= 3; run++ {
			pods = waitAvailable(t, c, "")
			leader = waitLeader(t, c, pods, "")
			_, lease, err := holder(c)
			if err != nil {
				t.Fatal(err)
			}
			leader, _ = takeover(t, c, sw, pods, leader, time.Duration(*lease.Spec.LeaseDurationSeconds)*time.Second, run)
		}
		pods = waitAvailable(t, c, "")
	})

	sw.step("the Proxy deleted: no domain, volume or NVRAM file left", func() {
		e.mustRun(t, e.kubectl, "delete", "-n", proxyNS, "proxy", proxyName, "--wait=false")
		testutil.WaitFor(t, 10*time.Minute, "the Proxy to be gone (its finalizer removes the VM)", func() (bool, error) {
			err := c.Get(ctx, client.ObjectKeyFromObject(px), &v1alpha1.Proxy{})
			return apierrors.IsNotFound(err), err
		}, testutil.Every(time.Second))
		if left := e.host.Leftovers(ready.InstanceName()); len(left) != 0 {
			t.Fatalf("left on the host after the Proxy went: %v", left)
		}
	})

	sw.step("helm uninstall, then the namespace and the CRDs, removes the rest", func() {
		uninstall(t, e)
		installed = false
		checkRemoved(t, c)
	})
}

// sampleAllowing writes config/samples/proxy_kvm2.yaml with the probe target's address
// (host:port) as spec.proxy.allowedDestinations in place of the demo's, as a user whose
// probe target is on a private network must: the guest's egress fence refuses it
// otherwise. It returns the file's path.
func sampleAllowing(t *testing.T, e env, probeAddr string) string {
	t.Helper()
	host, _, err := net.SplitHostPort(probeAddr)
	if err != nil {
		t.Fatalf("probe target %q: %v", probeAddr, err)
	}
	data, err := os.ReadFile(filepath.Join(e.root, "config", "samples", "proxy_kvm2.yaml"))
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

// writeRunValues writes the values file the test adds to the tier's: the providers config
// for the local libvirt host, as the pods reach it, and the probe target's URL. It returns
// the file's path.
func writeRunValues(t *testing.T, e env, imageURL, imageSHA, probeURL string) string {
	t.Helper()
	// The names are those config/samples/proxy_kvm2.yaml asks for; the key and known_hosts
	// paths are the chart's kvm-ssh mount, as in its default providersConfig.
	cfg := provider.Config{Providers: []provider.ProviderConfig{{Name: "kvm2-home", Type: "kvm2", KVM2: &provider.KVMConfig{
		SSHKeyFile:     "/etc/proxy-operator/kvm/id_ed25519",
		KnownHostsFile: "/etc/proxy-operator/kvm/known_hosts",
		DiskSizeGb:     2,
		Images:         map[string]provider.KVMImage{"debian-12": {URL: imageURL, SHA256: imageSHA, Format: "qcow2", Firmware: "uefi"}},
		MachineTypes:   map[string]provider.KVMMachineType{"small": {VCPUs: 2, MemoryMiB: 1024}},
		Hosts: []provider.KVMHost{{Name: "local", Address: e.podHostAddress(t), User: e.User, Socket: e.Socket,
			Pool: e.Pool, Bridge: e.Bridge, DomainType: e.DomainType}},
	}}}}
	providers, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.ParseConfig(providers); err != nil {
		t.Fatalf("the test's providers config: %v\n%s", err, providers)
	}
	data, err := yaml.Marshal(map[string]any{
		"providersConfig": string(providers),
		"extraArgs":       []string{"--proxy-probe-url=" + probeURL},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "run-values.yaml")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
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
	testutil.WaitFor(t, 10*time.Minute, "Deployment "+managerName+" Available with 2 ready replicas (readiness: the manager's /readyz)", func() (bool, error) {
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
	}, testutil.Every(time.Second))
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
	testutil.WaitFor(t, 3*time.Minute, "one of the pods to hold lease "+leaseName, func() (bool, error) {
		h, _, err := holder(c)
		name = h
		for _, p := range pods {
			if p.Name == h && h != not {
				return true, nil
			}
		}
		return false, fmt.Errorf("held by %q (%v)", h, err)
	}, testutil.Every(100*time.Millisecond))
	return name
}

// failover deletes the leader's pod and measures how long another replica takes to hold
// the lease (takeover 1); meanwhile and until the new leader has probed twice, the Proxy
// must stay Ready, discovery through the Service must keep listing it, and the VM must
// stay the only one. It returns the new leader.
func failover(t *testing.T, e env, c client.Client, sw *stopwatch, who *framework.Whoami, pods []corev1.Pod, leader, discovery, token, want string, ready *v1alpha1.Proxy) string {
	t.Helper()
	ctx := context.Background()
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
				code, body := framework.GetStatus(&http.Client{Timeout: 300 * time.Millisecond}, discovery+"/v1/proxies?format=text", token)
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

	start := time.Now()
	next, _ := takeover(t, c, sw, pods, leader, leaseDuration, 1)
	// The Deployment replaces the deleted pod; then two probes by the new leader (only the
	// leader probes), seen where they land: the probe target, reached through the guest.
	atTakeover := who.From(ready.Status.IP)
	waitAvailable(t, c, leader)
	testutil.WaitFor(t, 3*time.Minute, "two probes through the guest by the new leader", func() (bool, error) {
		n := who.From(ready.Status.IP) - atTakeover
		return n >= 2, fmt.Errorf("%d probes since the takeover", n)
	}, testutil.Every(time.Second))
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
	if doms, err := e.host.DomainsMatching(string(ready.UID)); err != nil || len(doms) != 1 || doms[0] != ready.InstanceName() {
		t.Fatalf("domains carrying the Proxy's UID after the failover: %v (%v), want [%s]", doms, err, ready.InstanceName())
	}
	px := &v1alpha1.Proxy{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ready), px); err != nil {
		t.Fatal(err)
	}
	if px.Status.ProviderID != ready.Status.ProviderID || px.Status.IP != ready.Status.IP {
		t.Errorf("after the failover the Proxy is instance %s at %s, before %s at %s", px.Status.ProviderID, px.Status.IP, ready.Status.ProviderID, ready.Status.IP)
	}
	return next
}

// maxTakeover bounds a takeover after the leader's pod is deleted: the going leader
// releases its lease on shutdown (LeaderElectionReleaseOnCancel), so the standby, which
// retries every 2 s, takes it at once, not after the lease duration (15 s).
const maxTakeover = 5 * time.Second

// takeover deletes the leader's pod and measures how long until another live replica
// holds the lease: the standby, or the pod the ReplicaSet starts in the deleted one's
// place, whichever asks first. run numbers the measurement in the notes.
func takeover(t *testing.T, c client.Client, sw *stopwatch, pods []corev1.Pod, leader string, leaseDuration time.Duration, run int) (string, time.Duration) {
	t.Helper()
	ctx := context.Background()
	var other string
	for _, p := range pods {
		if p.Name != leader {
			other = p.Name
		}
	}
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: leader}}); err != nil {
		t.Fatal(err)
	}
	var next string
	took := testutil.WaitFor(t, 2*leaseDuration+time.Minute, "another replica to take lease "+leaseName, func() (bool, error) {
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
	}, testutil.Every(50*time.Millisecond))
	which := "the replacement pod"
	if next == other {
		which = "the standby replica"
	}
	sw.note("takeover %d: %s (%s) took the lease %s after the leader's pod %s was deleted (lease duration %s)",
		run, next, which, took.Round(10*time.Millisecond), leader, leaseDuration)
	t.Logf("takeover %d took %s, to %s", run, took, which)
	if took > maxTakeover {
		t.Errorf("takeover %d: the other replica took the lease after %s, more than %s (the lease duration is %s: was the lease released?)", run, took, maxTakeover, leaseDuration)
	}
	return next, took
}

// checkMetrics: refused without a token (401) and to a ServiceAccount not bound to the
// metrics-reader ClusterRole (403), served to one bound to it, whose token it returns.
func checkMetrics(t *testing.T, e env, c client.Client, metricsURL string) string {
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
	testutil.WaitFor(t, 2*time.Minute, "metrics served to the authorised ServiceAccount through the Service", func() (bool, error) {
		code, body := framework.GetStatus(hc, metricsURL, allowed)
		return code == http.StatusOK && strings.Contains(body, "go_goroutines"), fmt.Errorf("%d %.200s", code, body)
	}, testutil.Every(time.Second))
	if code, body := framework.GetStatus(hc, metricsURL, ""); code != http.StatusUnauthorized {
		t.Errorf("metrics without a token: %d %.200s, want 401", code, body)
	}
	if code, body := framework.GetStatus(hc, metricsURL, denied); code != http.StatusForbidden {
		t.Errorf("metrics to a ServiceAccount without metrics-reader: %d %.200s, want 403", code, body)
	}
	if code, body := framework.GetStatus(http.DefaultClient, strings.Replace(metricsURL, "https://", "http://", 1), allowed); code == http.StatusOK {
		t.Errorf("metrics over plain HTTP: %d %.200s", code, body)
	}
	return allowed
}

// uninstallSteps are what a user runs to remove the operator installed by helm: helm
// uninstall, which leaves the namespace it did not make (--create-namespace) and the CRDs
// of the chart's crds/ (Helm never deletes those), then both of them.
func uninstallSteps(e env) [][]string {
	return [][]string{
		{e.helm, "uninstall", release, "-n", namespace, "--wait", "--timeout=5m", "--ignore-not-found"},
		{e.kubectl, "delete", "namespace", namespace, "--ignore-not-found", "--wait=true", "--timeout=5m"},
		{e.kubectl, "delete", "-f", chart + "/crds", "--ignore-not-found", "--wait=true", "--timeout=5m"},
	}
}

func uninstall(t *testing.T, e env) {
	t.Helper()
	for _, args := range uninstallSteps(e) {
		e.mustRun(t, args[0], args[1:]...)
	}
}

// checkRemoved: after the uninstall, none of what the chart made is left.
func checkRemoved(t *testing.T, c client.Client) {
	t.Helper()
	ctx := context.Background()
	testutil.WaitFor(t, 5*time.Minute, "namespace "+namespace+" to be gone", func() (bool, error) {
		err := c.Get(ctx, client.ObjectKey{Name: namespace}, &corev1.Namespace{})
		return apierrors.IsNotFound(err), err
	}, testutil.Every(time.Second))
	var px v1alpha1.ProxyList
	if err := c.List(ctx, &px); err == nil {
		t.Errorf("the Proxy CRD is still served (%d Proxies)", len(px.Items))
	}
	for _, name := range []string{"manager-role", "metrics-auth-role", "metrics-reader", "crawler", "credentials", "gateway-role"} {
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
	for _, args := range uninstallSteps(e) {
		if out, err := e.run(ctx, args[0], args[1:]...); err != nil {
			t.Logf("cleanup: %v %s", err, out)
		}
	}
	if vm != "" {
		if left := e.host.Leftovers(vm); len(left) > 0 {
			t.Logf("cleanup: removing what the Proxy left: %v", left)
			e.host.RemoveInstance(vm)
		}
	}
}
