package pool

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud/hcloudfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/kvm2test"
)

const hcloudProvider = "hetzner-eu"

// moveBounds follows a pool's children through a watch, so that it sees every state the
// API server went through, and keeps the fewest available (Ready, not deleting) and the
// most children (deleting ones included) it saw.
type moveBounds struct {
	mu           sync.Mutex
	kids         map[string]*v1alpha1.Proxy
	minAvailable int
	maxTotal     int
	events       int
	// atMin shows the children when available was fewest.
	atMin string
}

func (b *moveBounds) observe(px *v1alpha1.Proxy, deleted bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if deleted {
		delete(b.kids, px.Name)
	} else {
		b.kids[px.Name] = px
	}
	b.events++
	available := 0
	for _, k := range b.kids {
		if k.Status.Phase == v1alpha1.PhaseReady && k.DeletionTimestamp.IsZero() {
			available++
		}
	}
	if available < b.minAvailable {
		var parts []string
		for _, k := range b.kids {
			parts = append(parts, fmt.Sprintf("%s(%s,%s,healthy=%t,deleting=%t)", k.Name, k.Spec.Provider, k.Status.Phase, k.Status.Healthy, !k.DeletionTimestamp.IsZero()))
		}
		b.minAvailable, b.atMin = available, strings.Join(parts, " ")
	}
	b.maxTotal = max(b.maxTotal, len(b.kids))
}

// onHCloud says whether the watch's view is n children, all Ready on the hcloud provider.
func (b *moveBounds) onHCloud(n int) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var parts []string
	ok := len(b.kids) == n
	for _, k := range b.kids {
		parts = append(parts, fmt.Sprintf("%s(%s,%s)", k.Name, k.Spec.Provider, k.Status.Phase))
		ok = ok && k.Spec.Provider == hcloudProvider && k.Status.Phase == v1alpha1.PhaseReady
	}
	return ok, fmt.Errorf("the watch sees %v", parts)
}

// watchChildren follows the children of pool from now until the test ends.
func watchChildren(t *testing.T, e *controllertest.PoolEnv, pool string) *moveBounds {
	t.Helper()
	wc, err := client.NewWithWatch(e.Env.Config, client.Options{Scheme: e.Env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	list := &v1alpha1.ProxyList{}
	sel := client.MatchingLabels{v1alpha1.PoolLabel: pool}
	if err := wc.List(e.Ctx, list, client.InNamespace(e.NS), sel); err != nil {
		t.Fatal(err)
	}
	b := &moveBounds{kids: map[string]*v1alpha1.Proxy{}, minAvailable: len(list.Items) + 1}
	for i := range list.Items[1:] {
		b.kids[list.Items[i+1].Name] = &list.Items[i+1]
	}
	if len(list.Items) > 0 {
		b.observe(&list.Items[0], false) // the bounds of the whole list
	}
	b.events = 0 // only the watch's events count
	w, err := wc.Watch(e.Ctx, &v1alpha1.ProxyList{}, client.InNamespace(e.NS), sel,
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		t.Fatal(err)
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			px, ok := ev.Object.(*v1alpha1.Proxy)
			if !ok {
				select {
				case <-stopped:
					return // the test's end
				default:
				}
				t.Errorf("the watch of pool %s's children ended: %+v", pool, ev.Object)
				return
			}
			b.observe(px, ev.Type == "DELETED")
		}
	}()
	t.Cleanup(func() { close(stopped); w.Stop(); <-done })
	return b
}

// TestPoolMovesFromKVM2ToHCloud: a pool of three children on the real kvm2 provider
// (go-libvirt through an in-process SSH server into the libvirt fake, kvm2test) whose
// template is edited to the hcloud provider, over the in-process Hetzner Cloud API
// through the official client, rolls surge-first with maxSurge 1 and maxUnavailable 0: a
// watch of the children sees never fewer than three available and never more than four
// children; every child ends on hcloud with status.ip and status.ipv6, three servers run
// in the fake, and the old domains are gone from the libvirt fake with their disks.
func TestPoolMovesFromKVM2ToHCloud(t *testing.T) {
	t.Parallel()
	const kvm2Provider = "kvm2-home"
	kp := kvm2test.New(t, kvm2Provider, kvm2.WithInstallID("install-pool-move"))
	fake := hcloudfake.New()
	t.Cleanup(fake.Close)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(hcloudfake.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	hp, err := hcloud.New(provider.ProviderConfig{Name: hcloudProvider, Type: provider.TypeHCloud, HCloud: &provider.HCloudConfig{
		TokenFile: tokenFile, Locations: []string{"fsn1"}, ServerTypes: []string{"cx23"}, Images: []string{"ubuntu-24.04"},
		Endpoint: fake.URL,
	}}, logr.Discard(), hcloud.WithInstallID("install-pool-move"), hcloud.WithPollInterval(time.Millisecond, 20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hp.Close() })
	zones := maps.Clone(controllertest.PoolZones)
	zones[kvm2Provider] = []string{kp.Host}
	zones[hcloudProvider] = []string{"fsn1"}

	e := controllertest.NewPoolEnv(t, shared.Env(t), 20*time.Millisecond, nil, func(mgr ctrl.Manager, e *controllertest.PoolEnv) {
		pr := &proxy.ProxyReconciler{
			Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorder("proxy-controller"),
			Providers: map[string]provider.Provider{kvm2Provider: kp.Provider, hcloudProvider: hp}, QuotaRetry: time.Hour,
			// A VM just started has no address yet, on either provider: look again soon.
			PollInterval: 50 * time.Millisecond,
		}
		if err := pr.SetupWithManager(mgr, 4); err != nil {
			t.Fatalf("setting up the proxy reconciler: %v", err)
		}
		r := &ProxyPoolReconciler{
			Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorder("proxypool-controller"),
			Zones: zones, Clock: e.Clock,
		}
		if err := r.SetupWithManager(mgr); err != nil {
			t.Fatalf("setting up the pool reconciler: %v", err)
		}
	})

	const replicas = 3
	pool := e.NewPool("move", replicas)
	pool.Spec.Template.Spec.Provider = kvm2Provider
	pool.Spec.Template.Spec.Placement = v1alpha1.ProxyPlacement{Zone: kp.Host, MachineType: kvm2test.MachineType, Image: kvm2test.Image}
	pool.Spec.Strategy.RollingUpdate = v1alpha1.PoolRollingUpdate{
		MaxSurge: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromInt32(0))}
	created := time.Now()
	e.CreateSettled(pool)
	t.Logf("three children available on kvm2 in %s", time.Since(created).Round(time.Millisecond))
	var before []string
	for _, k := range e.Children("move") {
		if k.Spec.Provider != kvm2Provider || !strings.HasPrefix(k.Status.ProviderID, "hosts/"+kp.Host+"/domains/") || k.Status.IP == "" {
			t.Fatalf("child %s before the move: provider %s, providerID %q, ip %q; want a kvm2 domain on %s with an address",
				k.Name, k.Spec.Provider, k.Status.ProviderID, k.Status.IP, kp.Host)
		}
		before = append(before, k.Status.ProviderID)
	}
	if doms := kp.Domains(); len(before) != replicas || len(doms) != replicas {
		t.Fatalf("%d children and domains %v on the kvm2 host before the move, want %d of each", len(before), doms, replicas)
	}

	b := watchChildren(t, e, "move")
	start := time.Now()
	e.Update("move", func(p *v1alpha1.ProxyPool) {
		p.Spec.Template.Spec.Provider = hcloudProvider
		p.Spec.Template.Spec.Placement = v1alpha1.ProxyPlacement{Zone: "fsn1", MachineType: "cx23", Image: "ubuntu-24.04"}
	})
	e.WaitSettled("move", replicas)
	waitFor(t, waitLong, "the watch to see three children Ready on hcloud", func() (bool, error) { return b.onHCloud(replicas) })
	b.mu.Lock()
	minAvailable, maxTotal, events, atMin := b.minAvailable, b.maxTotal, b.events, b.atMin
	b.mu.Unlock()
	t.Logf("moved in %s: %d watch events, fewest available %d, most children %d", time.Since(start).Round(time.Millisecond), events, minAvailable, maxTotal)
	if minAvailable < replicas {
		t.Errorf("available children fell to %d during the move, want never below %d (replicas - maxUnavailable): %s", minAvailable, replicas, atMin)
	}
	if maxTotal > replicas+1 {
		t.Errorf("%d children at once during the move, want at most %d (replicas + maxSurge)", maxTotal, replicas+1)
	}

	kids := e.Children("move")
	for _, k := range kids {
		if k.Spec.Provider != hcloudProvider || !strings.HasPrefix(k.Status.ProviderID, "hcloud://") ||
			k.Status.IP == "" || k.Status.IPv6 == "" {
			t.Errorf("child %s: provider %s, providerID %q, ip %q, ipv6 %q; want an hcloud server with IPv4 and IPv6",
				k.Name, k.Spec.Provider, k.Status.ProviderID, k.Status.IP, k.Status.IPv6)
			continue
		}
		if _, ok := fake.ServerByName(strings.TrimPrefix(k.Status.ProviderID, "hcloud://")); !ok {
			t.Errorf("child %s: no server %s in the fake", k.Name, k.Status.ProviderID)
		}
	}
	if n := len(fake.Servers()); n != replicas {
		t.Errorf("%d servers in the fake, want %d", n, replicas)
	}
	// The old children's Deletes ended before their finalizers went, so what the host
	// holds now is final: no domain, no overlay or seed, only the cached base image.
	if doms, vols := kp.Domains(), kp.Volumes(); len(doms) != 0 || len(vols) != 0 {
		t.Errorf("domains %v and volumes %v left on the kvm2 host, want none (old instances %v)", doms, vols, before)
	}
	for _, id := range before {
		if _, err := kp.Provider.Get(e.Ctx, id); !errors.Is(err, provider.ErrNotFound) {
			t.Errorf("old instance %s: Get says %v, want not found", id, err)
		}
	}
}
