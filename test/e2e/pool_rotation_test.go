//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// poolInstall is the install identity of the manager in the pool test: its VMs carry it
// in their mark, so a run cut short is cleaned up by the next one (the children's names,
// and so their instance names, are random).
const poolInstall = "e2e-pool"

// poolMachine is the small machine type the pool's guests run on: three run at once
// (two children and the surge), each with one vCPU, so that they share the host's
// cores instead of contending for them.
const poolMachine = "small: {vcpus: 1, memoryMiB: 512}"

var poolSamplePath = filepath.Join(repoRoot, "config", "samples", "proxypool.yaml")

// samplePool is config/samples/proxypool.yaml with two replicas on the one local host:
// no spread, the test image, the bridge subnet allowed, no rotation (the test turns it
// on), children available as soon as they are Ready, no Service.
func samplePool(t *testing.T, h hostEnv, namespace string) *v1alpha1.ProxyPool {
	t.Helper()
	data, err := os.ReadFile(poolSamplePath)
	if err != nil {
		t.Fatal(err)
	}
	var pool v1alpha1.ProxyPool
	if err := yaml.UnmarshalStrict(data, &pool); err != nil {
		t.Fatalf("%s: %v", poolSamplePath, err)
	}
	tmpl := &pool.Spec.Template.Spec
	if tmpl.Proxy == nil || !slices.Equal(tmpl.Proxy.AllowedSourceRanges, []v1alpha1.CIDR{"10.123.0.0/24"}) {
		t.Fatalf("%s: spec.template.spec.proxy no longer allows just the bridge subnet 10.123.0.0/24", poolSamplePath)
	}
	tmpl.Proxy.AllowedSourceRanges = []v1alpha1.CIDR{v1alpha1.CIDR(h.BridgeSubnet)}
	// The probe target is the host's bridge address, a private one the guest's egress
	// fence refuses unless it is allowed, as a user with an in-cluster probe target would.
	tmpl.Proxy.AllowedDestinations = []v1alpha1.CIDR{v1alpha1.CIDR(h.BridgeIP + "/32")}
	tmpl.Placement.Image = imageKey
	replicas := int32(2)
	pool.Namespace, pool.Spec.Replicas = namespace, &replicas
	pool.Spec.Spread, pool.Spec.Service, pool.Spec.MinReadySeconds = nil, nil, 0
	pool.Spec.Rotation = v1alpha1.PoolRotation{}
	return &pool
}

// poolSample is what the sampler saw of the pool at one moment.
type poolSample struct {
	at            time.Time
	ready         int // children Ready and healthy, not being deleted
	children      int // every child, being deleted or not
	statusReady   int32
	originalsLeft int
	err           error
}

// poolSampler reads the pool and its children every second.
type poolSampler struct {
	mu      sync.Mutex
	samples []poolSample
	stop    chan struct{}
	done    chan struct{}
}

// TestPoolRotation: a ProxyPool of 2 on the local libvirt host, its rotation forced by a
// short maxAge once both children are Ready. A sampler reads the pool every second from
// the start of the rotation to its end; the test fails if fewer than 2 children are
// Ready at any sample. The rotation ends when both original children are gone and two
// new ones are Ready. A maxAge short enough to have expired the originals expires the
// new children too, soon after they are Ready, so the pool would rotate for ever: the
// test turns rotation off once the pool has deleted both originals, and the pool settles
// (a third child it may have begun meanwhile is scaled down). maxAge must also leave a
// new child time to become Ready before it expires (see below).
func TestPoolRotation(t *testing.T) {
	testStart := time.Now()
	h := loadHostEnv(t)
	host := dialHost(t, h)
	c, kubeconfig := controlPlane(t)
	bin := buildManager(t)

	// Unpaced: this test is not about the download.
	images := newImageServer(t, h.GuestImage, time.Second)
	imageURL := serve(t, h.BridgeIP, images) + "/guest.qcow2"
	whoURL := serve(t, h.BridgeIP, &whoami{})
	sum, err := os.ReadFile(h.GuestImage + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	cfg := providersConfig(h, imageURL, strings.Fields(string(sum))[0])
	small := "small: {vcpus: 2, memoryMiB: 1024}"
	if !strings.Contains(cfg, small) {
		t.Fatalf("the e2e providers config no longer has the machine type %q this test shrinks", small)
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "providers.yaml")
	if err := os.WriteFile(cfgPath, []byte(strings.Replace(cfg, small, poolMachine, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	mgr := &manager{t: t, bin: bin, logPath: filepath.Join(dir, "manager.log"), args: []string{
		"--providers-config=" + cfgPath, "--kubeconfig=" + kubeconfig, "--install-id=" + poolInstall,
		"--metrics-bind-address=0", "--health-probe-bind-address=" + freeAddr(t, "127.0.0.1"),
		"--discovery-bind-address=0",
		"--proxy-probe-url=" + whoURL + "/probe", "--proxy-check-interval=5s",
		"--provider-check-interval=1m",
		// Other tiers share this host: never collect what this cluster does not know.
		"--gc-interval=1h", "--gc-grace=24h",
	}}

	ns := "e2e-pool"
	pool := samplePool(t, h, ns)
	key := client.ObjectKeyFromObject(pool)
	p := &poolStory{t: t, c: c, host: host, mgr: mgr, key: key, vms: map[string]bool{}}
	p.removeLeftovers()
	host.removeBaseImage(imageKey)
	t.Cleanup(func() {
		mgr.kill(syscall.SIGTERM)
		for vm := range p.seenVMs() {
			host.removeInstance(vm)
		}
		host.removeBaseImage(imageKey)
		if t.Failed() {
			keep := filepath.Join(os.TempDir(), fmt.Sprintf("e2e-pool-manager-%s.log", time.Now().Format("20060102-150405")))
			if data, err := os.ReadFile(mgr.logPath); err == nil && os.WriteFile(keep, data, 0o644) == nil {
				t.Logf("the manager's whole log is kept in %s", keep)
			}
		}
		t.Logf("total %s", time.Since(testStart).Round(time.Second))
	})

	ctx := ctxFor(t, time.Hour)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	mgr.start()
	if err := c.Create(ctx, pool); err != nil {
		t.Fatalf("creating ProxyPool %s: %v", key, err)
	}
	created := time.Now()
	originals := p.waitSettled("2 children Ready", nil)
	t.Logf("TIMING pool: created -> 2 children Ready in %s (%s)", time.Since(created).Round(time.Second), strings.Join(names(originals), ", "))

	// Rotation on, with a maxAge both originals are past. The pool replaces a child past
	// its deadline even while it boots (a booting child is deleted first), so a maxAge
	// shorter than a boot would replace every new child before it is Ready, for ever.
	// So the originals are left to grow half as old again as the pool took to come up,
	// and maxAge is a little under their age: a boot has 1.5 times the time the first
	// two took (at once) before its child expires.
	youngest := func() time.Duration {
		d := time.Duration(1<<63 - 1)
		for _, px := range originals {
			born, err := time.Parse(time.RFC3339Nano, px.Annotations[v1alpha1.BornAnnotation])
			if err != nil {
				t.Fatalf("child %s: born annotation %q: %v", px.Name, px.Annotations[v1alpha1.BornAnnotation], err)
			}
			d = min(d, time.Since(born))
		}
		return d
	}
	for want := youngest() * 3 / 2; youngest() < want; {
		time.Sleep(time.Second) // letting the originals age: nothing to wait for but the clock
	}
	age := youngest()
	maxAge := (age - 5*time.Second).Round(time.Second)
	orig := map[types.UID]bool{}
	for _, px := range originals {
		orig[px.UID] = true
	}
	sampler := p.sample(orig)
	start := time.Now()
	p.patchRotation(ctx, &metav1.Duration{Duration: maxAge})
	t.Logf("rotation on: maxAge %s (the younger original is %s old)", maxAge, age.Round(time.Second))

	p.wait("the pool to delete both original children", bootDeadline, func() (bool, error) {
		kids, err := p.children()
		for _, px := range kids {
			if orig[px.UID] && px.DeletionTimestamp == nil {
				return false, err
			}
		}
		return err == nil, err
	})
	p.patchRotation(ctx, nil)
	t.Logf("rotation off after %s: both originals are being deleted", time.Since(start).Round(time.Second))
	final := p.waitSettled("both originals gone and 2 new children Ready", orig)
	took := time.Since(start)
	samples := sampler.close()

	below, longest := p.report(samples, took)
	t.Logf("TIMING pool rotation: %s wall time for 2 children (%s -> %s); %d samples, %d with fewer than 2 Ready; longest interval with fewer than 2 Ready: %s",
		took.Round(time.Second), strings.Join(names(originals), ", "), strings.Join(names(final), ", "), len(samples), below, longest)
	if below > 0 {
		t.Errorf("fewer than 2 children were Ready at %d of %d samples (longest %s)", below, len(samples), longest)
	}

	p.deleteAll(ctx)
}

// poolStory holds what the steps of the pool test use.
type poolStory struct {
	t    *testing.T
	c    client.Client
	host *libvirtHost
	mgr  *manager
	key  types.NamespacedName

	mu  sync.Mutex
	vms map[string]bool // instance names of every child seen, for the clean-up
}

func (p *poolStory) seenVMs() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.vms)
}

// children lists the pool's child Proxies, oldest first, remembering their instances.
func (p *poolStory) children() ([]v1alpha1.Proxy, error) {
	var list v1alpha1.ProxyList
	err := p.c.List(context.Background(), &list, client.InNamespace(p.key.Namespace), client.MatchingLabels{v1alpha1.PoolLabel: p.key.Name})
	p.mu.Lock()
	for i := range list.Items {
		p.vms[list.Items[i].InstanceName()] = true
	}
	p.mu.Unlock()
	slices.SortFunc(list.Items, func(a, b v1alpha1.Proxy) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	return list.Items, err
}

func readyChild(px *v1alpha1.Proxy) bool {
	return px.DeletionTimestamp == nil && px.Status.Phase == v1alpha1.PhaseReady && px.Status.Healthy
}

func names(pxs []v1alpha1.Proxy) []string {
	out := make([]string, len(pxs))
	for i := range pxs {
		out[i] = pxs[i].Name
	}
	return out
}

// describe is the pool's status and its children's phases, for progress and failures.
func (p *poolStory) describe() string {
	var pool v1alpha1.ProxyPool
	if err := p.c.Get(context.Background(), p.key, &pool); err != nil {
		return fmt.Sprintf("(reading ProxyPool %s: %v)", p.key, err)
	}
	line := fmt.Sprintf("pool: replicas %d ready %d available %d up-to-date %d;", pool.Status.Replicas, pool.Status.ReadyReplicas,
		pool.Status.AvailableReplicas, pool.Status.UpToDateReplicas)
	kids, err := p.children()
	if err != nil {
		return line + " " + err.Error()
	}
	for _, px := range kids {
		line += fmt.Sprintf(" %s=%s(ip %s, healthy %t, deleting %t)", px.Name, px.Status.Phase, px.Status.IP, px.Status.Healthy, px.DeletionTimestamp != nil)
	}
	return line
}

// wait polls cond every second until it holds, logging the pool every 30 s; past
// timeout it fails the test with the pool, the manager's log and the host's domains.
func (p *poolStory) wait(what string, timeout time.Duration, cond func() (bool, error)) {
	p.t.Helper()
	start := time.Now()
	nextLog := start.Add(30 * time.Second)
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		now := time.Now()
		if now.Sub(start) > timeout {
			doms, verr := p.host.virsh("list --all")
			if verr != nil {
				doms += verr.Error()
			}
			p.t.Fatalf("gave up after %s waiting for %s (last error: %v)\n--- %s\n--- manager log (last 40 lines):\n%s\n--- virsh list --all:\n%s",
				timeout, what, last, p.describe(), p.mgr.tail(40), doms)
		}
		if now.After(nextLog) {
			p.t.Logf("still waiting (%s) for %s: %s", now.Sub(start).Round(time.Second), what, p.describe())
			nextLog = now.Add(30 * time.Second)
		}
		time.Sleep(time.Second)
	}
}

// waitSettled waits until the pool has exactly 2 children, none of them in gone (by
// UID) nor being deleted, both Ready, and says so in its status; it returns them.
func (p *poolStory) waitSettled(what string, gone map[types.UID]bool) []v1alpha1.Proxy {
	p.t.Helper()
	var kids []v1alpha1.Proxy
	p.wait(what, bootDeadline, func() (bool, error) {
		var err error
		if kids, err = p.children(); err != nil || len(kids) != 2 {
			return false, err
		}
		for i := range kids {
			if gone[kids[i].UID] || !readyChild(&kids[i]) {
				return false, nil
			}
		}
		var pool v1alpha1.ProxyPool
		if err := p.c.Get(context.Background(), p.key, &pool); err != nil {
			return false, err
		}
		st := pool.Status
		return st.Replicas == 2 && st.ReadyReplicas == 2 && st.UpToDateReplicas == 2 && st.ObservedGeneration == pool.Generation, nil
	})
	return kids
}

func (p *poolStory) patchRotation(ctx context.Context, maxAge *metav1.Duration) {
	p.t.Helper()
	var pool v1alpha1.ProxyPool
	if err := p.c.Get(ctx, p.key, &pool); err != nil {
		p.t.Fatal(err)
	}
	patch := client.MergeFrom(pool.DeepCopy())
	pool.Spec.Rotation.MaxAge = maxAge
	if err := p.c.Patch(ctx, &pool, patch); err != nil {
		p.t.Fatalf("setting rotation.maxAge of %s to %v: %v", p.key, maxAge, err)
	}
}

// sample starts reading the pool every second; originals are the children the rotation
// replaces.
func (p *poolStory) sample(originals map[types.UID]bool) *poolSampler {
	s := &poolSampler{stop: make(chan struct{}), done: make(chan struct{})}
	take := func() {
		smp := poolSample{at: time.Now()}
		kids, err := p.children()
		smp.err = err
		for i := range kids {
			smp.children++
			if readyChild(&kids[i]) {
				smp.ready++
			}
			if originals[kids[i].UID] {
				smp.originalsLeft++
			}
		}
		var pool v1alpha1.ProxyPool
		if err := p.c.Get(context.Background(), p.key, &pool); err == nil {
			smp.statusReady = pool.Status.ReadyReplicas
		} else if smp.err == nil {
			smp.err = err
		}
		s.mu.Lock()
		s.samples = append(s.samples, smp)
		s.mu.Unlock()
	}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			take()
			select {
			case <-s.stop:
				take() // the state the rotation ended in
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *poolSampler) close() []poolSample {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

// report logs each change the samples show and returns how many samples had fewer than
// 2 Ready children and the longest run of such samples (first to last, plus the second
// to the next sample that had 2).
func (p *poolStory) report(samples []poolSample, took time.Duration) (int, time.Duration) {
	var (
		below       int
		longest     time.Duration
		runStart    time.Time
		prev        string
		maxChildren int
		minStatus   int32 = 2
	)
	for i, s := range samples {
		if s.err != nil {
			p.t.Errorf("sample %d (%s): reading the pool: %v", i, s.at.Format(time.TimeOnly), s.err)
			continue
		}
		maxChildren = max(maxChildren, s.children)
		minStatus = min(minStatus, s.statusReady)
		line := fmt.Sprintf("children %d, Ready %d (status.readyReplicas %d), originals left %d", s.children, s.ready, s.statusReady, s.originalsLeft)
		if line != prev {
			p.t.Logf("  %s: %s", s.at.Format("15:04:05"), line)
			prev = line
		}
		switch {
		case s.ready < 2 && runStart.IsZero():
			runStart = s.at
			below++
		case s.ready < 2:
			below++
		case !runStart.IsZero():
			longest = max(longest, s.at.Sub(runStart))
			runStart = time.Time{}
		}
	}
	if !runStart.IsZero() {
		longest = max(longest, samples[len(samples)-1].at.Sub(runStart)+time.Second)
	}
	p.t.Logf("pool rotation: %s, at most %d children at once, status.readyReplicas never below %d", took.Round(time.Second), maxChildren, minStatus)
	return below, longest
}

// deleteAll deletes the pool and its children (envtest runs no garbage collector, which
// would delete the children after their owner), waits for them to be gone and checks
// that nothing of any child's VM is left on the host.
func (p *poolStory) deleteAll(ctx context.Context) {
	t := p.t
	kids, err := p.children()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.c.Delete(ctx, &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: p.key.Namespace, Name: p.key.Name}}); err != nil {
		t.Fatalf("deleting ProxyPool %s: %v", p.key, err)
	}
	start := time.Now()
	for i := range kids {
		if err := p.c.Delete(ctx, &kids[i]); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("deleting child %s: %v", kids[i].Name, err)
		}
	}
	p.wait("every child Proxy to be gone", shortDeadline, func() (bool, error) {
		var list v1alpha1.ProxyList
		err := p.c.List(ctx, &list, client.InNamespace(p.key.Namespace))
		return err == nil && len(list.Items) == 0, err
	})
	t.Logf("pool and children deleted in %s", time.Since(start).Round(100*time.Millisecond))
	for vm := range p.seenVMs() {
		if left := p.host.leftovers(vm); len(left) != 0 {
			t.Errorf("after deleting the pool, %s left behind: %v", vm, left)
		}
	}
}

// removeLeftovers removes every domain (with its volumes) that a manager of this test's
// install made: what a run cut short left behind.
func (p *poolStory) removeLeftovers() {
	out, err := p.host.run(fmt.Sprintf(`for d in $(virsh -q -c qemu:///system list --all --name); do `+
		`virsh -q -c qemu:///system dumpxml "$d" | grep -q 'install>%s<' && echo "$d"; done; true`, poolInstall))
	if err != nil {
		p.t.Fatal(err)
	}
	for _, vm := range strings.Fields(out) {
		p.t.Logf("removing %s, left by an earlier run", vm)
		p.host.removeInstance(vm)
	}
}
