//go:build e2e

// Package e2e drives the manager binary against a real API server and the local libvirt
// host (hack/libvirt-host.sh): a Proxy becomes a guest VM that carries traffic, survives
// the manager being killed mid-create, is replaced on a spec change and leaves nothing
// behind when deleted. Run it with `make test-e2e`.
package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

// imageKey is the catalogue key of the guest image in the test's providers config; its
// cached copy in the pool is removed before and after the test, so every run downloads it.
const imageKey = "e2e-guest"

// noNftImageKey is the catalogue key of the same image without nft (fence_test.go).
const noNftImageKey = "e2e-guest-no-nft"

// percent finds the percentage in a progress message such as "... 12.0 MiB of 121.2 MiB (10%)".
var percent = regexp.MustCompile(`\((\d+)%\)$`)

// samplePath is the Proxy (and its basic-auth Secret) users apply, under the repository's
// root; the test applies it with only the image, the bridge subnet and the namespace
// changed.
var samplePath = filepath.Join("config", "samples", "proxy_kvm2.yaml")

func sampleProxy(t *testing.T, h framework.HostEnv, namespace string) (*v1alpha1.Proxy, *corev1.Secret) {
	t.Helper()
	px, sec := readSample(t) // auth_test.go
	px.Namespace, sec.Namespace = namespace, namespace
	px.Spec.Placement.Image = imageKey
	for i, r := range px.Spec.Proxy.AllowedSourceRanges {
		if r == sampleSubnet {
			px.Spec.Proxy.AllowedSourceRanges[i] = v1alpha1.CIDR(h.BridgeSubnet)
		}
	}
	return px, sec
}

// timings are the moments of one incarnation of the VM, for the test log.
type timings struct {
	label                  string
	from, running, ready   time.Time
	domStart, agentAddress time.Time
	answered               time.Time // the guest's proxy first served a request (answerWatch)
}

func (tm timings) log(t *testing.T) {
	t.Helper()
	t.Logf("TIMING %s: ->Running %s, ->Ready %s; guest boot (domain start -> agent address) %s; "+
		"operator before the domain started %s; agent address -> Running %s; Running -> Ready %s",
		tm.label, span(tm.from, tm.running, time.Second), span(tm.from, tm.ready, time.Second),
		span(tm.domStart, tm.agentAddress, time.Second), span(tm.from, tm.domStart, time.Second),
		span(tm.agentAddress, tm.running, 100*time.Millisecond), span(tm.running, tm.ready, 100*time.Millisecond))
	if !tm.answered.IsZero() {
		t.Logf("TIMING %s: Running -> the guest's proxy answers %s (the guest); the proxy answers -> Ready %s (the operator's probe)",
			tm.label, span(tm.running, tm.answered, 100*time.Millisecond), span(tm.answered, tm.ready, 100*time.Millisecond))
	}
}

// span is to - from, rounded, or says which end was not seen: a moment never recorded
// must not print as a duration (a zero time subtracted is some 292 years).
func span(from, to time.Time, round time.Duration) string {
	switch {
	case from.IsZero() && to.IsZero():
		return "not measured (neither end seen)"
	case from.IsZero():
		return "not measured (start not seen)"
	case to.IsZero():
		return "not measured (end not seen)"
	}
	return to.Sub(from).Round(round).String()
}

func TestProxyLifecycle(t *testing.T) {
	testStart := time.Now()
	h := loadHostEnv(t)
	host := framework.DialHost(t, h)
	c, kubeconfig := controlPlane(t)
	bin := buildManager(t)

	guestImage, guestSHA := framework.GuestImage(t)
	images := newImageServer(t, guestImage, durationEnv("E2E_IMAGE_SECONDS", 15*time.Second))
	imageURL := framework.Serve(t, h.BridgeIP, images) + "/guest.qcow2"
	noNft, noNftSHA := framework.NoNftImage(t, guestImage)
	noNftURL := framework.Serve(t, h.BridgeIP, newImageServer(t, noNft, time.Second)) + "/guest-no-nft.qcow2"
	// The probe target is on a private address of the bridge, which the guest's egress
	// fence refuses unless the Proxy allows it (allowedDestinations), as a user with an
	// in-cluster probe target would.
	edge := newEdge(t, h)
	who := &framework.Whoami{}
	whoURL := edge.serve(t, edge.allowed, who)
	// The target of the test's own requests watching for the guest's proxy to answer.
	answersURL := edge.serve(t, edge.allowed, &framework.Whoami{}) + "/answers"
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "providers.yaml")
	if err := os.WriteFile(cfgPath, []byte(providersConfig(h, imageURL, guestSHA, catalogueImage(noNftImageKey, noNftURL, noNftSHA))), 0o600); err != nil {
		t.Fatal(err)
	}
	discovery := "http://" + freeAddr(t, "127.0.0.1")
	mgr := &manager{t: t, bin: bin, logPath: filepath.Join(dir, "manager.log"), args: []string{
		"--providers-config=" + cfgPath, "--kubeconfig=" + kubeconfig,
		"--metrics-bind-address=0", "--health-probe-bind-address=" + freeAddr(t, "127.0.0.1"),
		"--discovery-bind-address=" + strings.TrimPrefix(discovery, "http://"),
		"--discovery-token-file=" + writeDiscoveryToken(t, dir),
		"--proxy-probe-url=" + whoURL + "/probe", "--proxy-check-interval=5s",
		"--provider-check-interval=10s", "--provider-check-timeout=30s",
		"--deletion-drain=" + e2eDeletionDrain.String(),
		// Other tiers share this host: never collect what this cluster does not know.
		"--gc-interval=1h", "--gc-grace=24h",
	}}

	// A fixed namespace gives a fixed instance name, so a run cut short (a go test
	// timeout skips clean-ups) is cleaned up by the next one.
	ns := "e2e"
	px, sec := sampleProxy(t, h, ns)
	px.Spec.Proxy.AllowedDestinations = []v1alpha1.CIDR{v1alpha1.CIDR(edge.allowed + "/32")}
	px.Spec.CloudInit = edge.routeCloudInit()
	px.Spec.Remediation = &v1alpha1.ProxyRemediation{UnhealthyTimeout: &metav1.Duration{Duration: e2eUnhealthyTimeout}}
	s := &story{t: t, c: c, host: host, mgr: mgr, key: client.ObjectKeyFromObject(px), vm: px.InstanceName()}
	host.RemoveInstance(s.vm)
	host.RemoveBaseImage(imageKey)
	host.RemoveBaseImage(noNftImageKey)
	t.Cleanup(func() {
		mgr.kill(syscall.SIGTERM)
		host.RemoveInstance(s.vm)
		host.RemoveBaseImage(imageKey)
		host.RemoveBaseImage(noNftImageKey)
		if t.Failed() {
			keep := filepath.Join(os.TempDir(), fmt.Sprintf("e2e-manager-%s.log", time.Now().Format("20060102-150405")))
			if data, err := os.ReadFile(mgr.logPath); err == nil && os.WriteFile(keep, data, 0o644) == nil {
				t.Logf("the manager's whole log is kept in %s", keep)
			}
		}
		t.Logf("total %s", time.Since(testStart).Round(time.Second))
	})
	t.Logf("instance %s, image %s served at %s (%d MiB at %d MiB/s)", s.vm, guestImage, imageURL, images.size>>20, images.rate>>20)

	ctx := ctxFor(t, time.Hour)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, sec); err != nil {
		t.Fatalf("creating the sample's Secret: %v", err)
	}
	mgr.start()
	watch := watchBoots(host, s.vm)
	t.Cleanup(watch.close)

	first := s.createSurvivingKills(ctx, px, images)
	creds := s.credentials(sec)
	answers := watchAnswers(s.mustProxy().Status.IP, px.Spec.Port, creds, answersURL)
	ip, readyAt := s.checkServing(px, who, discovery, whoURL)
	first.ready, first.answered = readyAt, answers.close()
	s.checkAuth(px, sec, discovery, whoURL)
	fenced := newFenceTargets(s, h, edge)
	s.checkFence(&url.URL{Scheme: "http", Host: fmt.Sprintf("%s:%d", ip, px.Spec.Port), User: creds}, fenced)
	s.checkOneStart()
	s.checkProviderHealth()
	uuid := s.uuid()
	seen := watch.get(uuid)
	first.domStart, first.agentAddress = seen.running, seen.address
	first.log(t)

	// The guest that cannot load the fence boots beside the replacement.
	noFence := s.startFailClosed(ctx, px)
	second := s.replace(ctx, uuid, watch)
	answers = watchAnswers(s.mustProxy().Status.IP, px.Spec.Port, creds, answersURL)
	_, second.ready = s.checkServing(px, who, discovery, whoURL)
	second.answered = answers.close()
	second.log(t)
	t.Logf("first IP %s, after replacement %s", ip, s.mustProxy().Status.IP)

	// The guest whose network breaks is mended while the other guest is checked.
	s.mendsBrokenNetwork(ctx, func() { noFence.check(ctx) })

	s.deleteLeavesNothing(ctx, discovery, creds, who, whoURL)
}

func (s *story) mustProxy() *v1alpha1.Proxy {
	s.t.Helper()
	px, err := s.proxy()
	if err != nil {
		s.t.Fatalf("reading Proxy %s: %v", s.key, err)
	}
	return px
}

func (s *story) uuid() string {
	s.t.Helper()
	out, err := s.host.Virsh("domuuid " + s.vm)
	if err != nil {
		s.t.Fatalf("domain %s: %v", s.vm, err)
	}
	return strings.TrimSpace(out)
}

// createSurvivingKills applies the Proxy, watches the image download's progress on its
// status, kills the manager with SIGKILL while the image downloads and again once the
// domain is defined, restarting it each time, and waits for the Proxy to run with an
// address on exactly one VM.
func (s *story) createSurvivingKills(ctx context.Context, px *v1alpha1.Proxy, images *imageServer) timings {
	t := s.t
	tm := timings{label: "first create (image download, two manager kills)", from: time.Now()}
	if err := s.c.Create(ctx, px); err != nil {
		t.Fatalf("creating Proxy %s: %v", s.key, err)
	}
	var progress []string
	s.waitFor("the Provisioned condition to show the image download moving (reason ImageDownloading, above 0%)", shortDeadline, 200*time.Millisecond, func() (bool, error) {
		p, err := s.proxy()
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionProvisioned)
		if c == nil || c.Reason != v1alpha1.ReasonImageDownloading {
			return false, nil
		}
		if line := fmt.Sprintf("phase %s, %q", p.Status.Phase, c.Message); len(progress) == 0 || progress[len(progress)-1] != line {
			progress = append(progress, line)
		}
		m := percent.FindStringSubmatch(c.Message)
		return m != nil && m[1] != "0", nil
	})
	if images.complete.Load() != 0 {
		t.Fatalf("the download progress (%s) was seen only after the image server had sent the whole image", progress)
	}
	t.Logf("seen while the image downloads: %s", strings.Join(progress, "; "))
	t.Logf("killing the manager (SIGKILL) mid-download, %d of %d MiB sent", images.sent.Load()>>20, images.size>>20)
	s.mgr.kill(syscall.SIGKILL)
	s.mgr.start()

	s.waitFor("domain "+s.vm+" to be defined", bootDeadline, 200*time.Millisecond, func() (bool, error) {
		doms, err := s.host.Domains()
		for _, d := range doms {
			if d == s.vm {
				return true, nil
			}
		}
		return false, err
	})
	s.mgr.kill(syscall.SIGKILL)
	state, _ := s.host.Virsh("domstate " + s.vm)
	t.Logf("killed the manager (SIGKILL) once domain %s was defined (state then: %s); restarting it", s.vm, strings.TrimSpace(state))
	s.mgr.start()

	s.waitProxy("phase Running with an IP", bootDeadline, framework.IsRunning)
	tm.running = time.Now()
	s.exactlyOneVM(string(s.mustProxy().UID))
	t.Logf("image server: %d requests, %d complete downloads", images.requests.Load(), images.complete.Load())
	return tm
}

// exactlyOneVM checks that one domain on the host carries the Proxy's UID and that the
// pool holds exactly its overlay and seed.
func (s *story) exactlyOneVM(uid string) {
	s.t.Helper()
	doms, err := s.host.DomainsMatching(uid)
	if err != nil {
		s.t.Fatal(err)
	}
	if len(doms) != 1 || doms[0] != s.vm {
		s.t.Fatalf("domains carrying the Proxy's UID %s: %v, want exactly [%s]", uid, doms, s.vm)
	}
	vols, err := s.host.Volumes()
	if err != nil {
		s.t.Fatal(err)
	}
	var ours []string
	for _, v := range vols {
		if strings.HasPrefix(v, s.vm) {
			ours = append(ours, v)
		}
	}
	if len(ours) != 2 {
		s.t.Fatalf("volumes of %s: %v, want its overlay and its seed", s.vm, ours)
	}
}

// checkServing waits for Ready (the health engine's probe went through the guest's proxy),
// then checks that the discovery API lists the proxy and that a request through the URL
// it gives reaches a server on the bridge from the guest's address. It returns the IP and
// when Ready was seen.
func (s *story) checkServing(px *v1alpha1.Proxy, who *framework.Whoami, discovery, whoURL string) (string, time.Time) {
	t := s.t
	ready := s.waitProxy("phase Ready and healthy (a probe through the guest's proxy)", bootDeadline, framework.IsReady)
	readyAt := time.Now()
	ip := ready.Status.IP
	if who.From(ip) == 0 {
		t.Fatalf("the Proxy is Ready but the probe target never saw a request from the guest's address %s", ip)
	}
	if ready.Status.EgressIP != ip {
		t.Errorf("status.egressIP = %q, want the guest's address %s", ready.Status.EgressIP, ip)
	}
	want := fmt.Sprintf("http://%s:%d", ip, px.Spec.Port)
	var listed string
	s.waitFor("the discovery API to list "+want, shortDeadline, 500*time.Millisecond, func() (bool, error) {
		body, err := framework.Get(discoveryClient, discovery+"/v1/proxies?format=text")
		listed = body
		return strings.Contains(body, want), err
	})
	// The proxy demands basic auth: the crawler asks for its URL with the credentials.
	picked, err := framework.Get(discoveryClient, discovery+"/v1/proxies/pick?key=crawler-1&format=text&credentials=true")
	proxyURL, perr := url.Parse(strings.TrimSpace(picked))
	if err != nil || perr != nil || proxyURL.User == nil || (&url.URL{Scheme: proxyURL.Scheme, Host: proxyURL.Host}).String() != want {
		t.Fatalf("pick for key crawler-1 with credentials = %d characters (%v, %v), want %s with user:password@", len(picked), err, perr, want)
	}
	t.Logf("discovery lists %q", strings.TrimSpace(listed))
	framework.Through(t, proxyURL, whoURL+"/through-the-proxy", who, ip)
	return ip, readyAt
}

// checkProviderHealth waits for the ProviderHealth object to show the host reachable,
// with the pool's figures.
func (s *story) checkProviderHealth() {
	var target v1alpha1.ProviderTargetStatus
	s.waitFor("ProviderHealth kvm2-home to show host local Reachable with pool figures", shortDeadline, time.Second, func() (bool, error) {
		var ph v1alpha1.ProviderHealth
		if err := s.c.Get(context.Background(), types.NamespacedName{Name: "kvm2-home"}, &ph); err != nil {
			return false, err
		}
		if len(ph.Status.Targets) != 1 {
			return false, fmt.Errorf("targets: %+v", ph.Status.Targets)
		}
		target = ph.Status.Targets[0]
		d := target.Details
		return target.Name == "local" && target.Ready && target.Reason == "Reachable" && ph.Status.Ready == "1/1" &&
			d["poolState"] == "running" && d["poolCapacityGiB"] != "" && d["poolAvailableGiB"] != "", nil
	})
	s.t.Logf("ProviderHealth kvm2-home: target %s %s, %s, pool %s GiB available of %s GiB, latency %s",
		target.Name, target.Reason, target.Message, target.Details["poolAvailableGiB"], target.Details["poolCapacityGiB"], target.Latency.Duration)
}

// replace changes placement.region and waits for the VM to be replaced by a new domain
// that becomes Ready.
func (s *story) replace(ctx context.Context, oldUUID string, watch *bootWatch) timings {
	t := s.t
	tm := timings{label: "replacement after a spec change", from: time.Now()}
	px := s.mustProxy()
	patch := client.MergeFrom(px.DeepCopy())
	px.Spec.Placement.Region = "e2e-moved"
	if err := s.c.Patch(ctx, px, patch); err != nil {
		t.Fatalf("changing placement.region of %s: %v", s.key, err)
	}
	var newUUID string
	s.waitFor("domain "+s.vm+" to be replaced (a new UUID)", bootDeadline, time.Second, func() (bool, error) {
		out, err := s.host.Virsh("domuuid " + s.vm)
		newUUID = strings.TrimSpace(out)
		return err == nil && newUUID != "" && newUUID != oldUUID, nil
	})
	s.waitProxy("phase Running with an IP on the new VM", bootDeadline, func(p *v1alpha1.Proxy) bool {
		return framework.IsRunning(p) && p.Status.ObservedGeneration == p.Generation
	})
	tm.running = time.Now()
	s.exactlyOneVM(string(px.UID))
	seen := watch.get(newUUID)
	tm.domStart, tm.agentAddress = seen.running, seen.address
	t.Logf("domain %s replaced: UUID %s -> %s", s.vm, oldUUID, newUUID)
	return tm
}

// e2eDeletionDrain is the lifecycle manager's --deletion-drain, longer than the default
// (10 s) so that the request sent through the draining proxy, about a second after the
// deletion, has seconds to spare even when an emulated guest stalls on a loaded machine.
const e2eDeletionDrain = 15 * time.Second

// deleteLeavesNothing deletes the Proxy and checks the deletion drain: discovery stops
// listing it at once, while its VM goes on carrying a request (as one a crawler was
// handed just before would be) until the drain is over; then that its domain, volumes,
// files and NVRAM are gone.
func (s *story) deleteLeavesNothing(ctx context.Context, discovery string, creds *url.Userinfo, who *framework.Whoami, whoURL string) {
	t := s.t
	px := s.mustProxy()
	ip := px.Status.IP
	deleted := time.Now()
	if err := s.c.Delete(ctx, px); err != nil {
		t.Fatalf("deleting Proxy %s: %v", s.key, err)
	}
	s.waitFor("the discovery API to stop listing the deleted proxy", shortDeadline, 200*time.Millisecond, func() (bool, error) {
		body, err := framework.Get(discoveryClient, discovery+"/v1/proxies?format=text")
		return err == nil && !strings.Contains(body, ip+":"), err
	})
	unlisted := time.Since(deleted)
	// Discovery's cache may see the deletion before the reconciler has written Deleting.
	s.waitProxy("phase Deleting, draining for --deletion-drain="+e2eDeletionDrain.String(), shortDeadline, func(cur *v1alpha1.Proxy) bool {
		return cur.Status.Phase == v1alpha1.PhaseDeleting && strings.Contains(cur.Status.Message, "draining until")
	})
	framework.Through(t, &url.URL{Scheme: "http", Host: fmt.Sprintf("%s:%d", ip, px.Spec.Port), User: creds}, whoURL+"/during-the-drain", who, ip)
	answered := time.Since(deleted)
	s.waitFor("Proxy "+s.key.String()+" to be gone", shortDeadline, 500*time.Millisecond, func() (bool, error) {
		_, err := s.proxy()
		return apierrors.IsNotFound(err), nil
	})
	took := time.Since(deleted)
	t.Logf("TIMING delete: out of discovery in %s, a request through the draining proxy answered by %s, Proxy gone in %s (deletion drain %s)",
		unlisted.Round(time.Millisecond), answered.Round(time.Millisecond), took.Round(time.Millisecond), e2eDeletionDrain)
	// The drain counts from the deletion timestamp, which has whole seconds.
	if took < e2eDeletionDrain-time.Second {
		t.Errorf("Proxy gone %s after its deletion, before the deletion drain of %s was over", took.Round(time.Millisecond), e2eDeletionDrain)
	}
	if left := s.host.Leftovers(s.vm); len(left) != 0 {
		t.Fatalf("after deleting the Proxy, %s left behind: %v", s.vm, left)
	}
}
