// Package imagejobs measures the real ProxyReconciler driving the kvm2 provider over the
// in-process SSH server and libvirt fake while a base image download is in flight: the
// download runs as the provider's background job, so it holds no reconcile worker.
package imagejobs

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/sshtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// TEST_LOG=1 shows the controllers' log lines.
func TestMain(m *testing.M) {
	logOut := io.Discard
	if os.Getenv("TEST_LOG") != "" {
		logOut = os.Stderr
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logOut), zap.UseDevMode(true)))
	os.Exit(m.Run())
}

// pacedServer serves one image; while paced it sends chunk bytes every tick, so a
// download takes size/chunk ticks. It records the GETs and when the paced one ended.
type pacedServer struct {
	*httptest.Server
	body  []byte
	paced atomic.Bool
	gets  atomic.Int32

	mu         sync.Mutex
	pacedStart time.Time
	pacedEnd   time.Time
}

const (
	imageSize = 24 << 20
	chunk     = 256 << 10
	tick      = 100 * time.Millisecond // 2.5 MiB/s: about 10 s for the image
)

func newPacedServer(t *testing.T) *pacedServer {
	s := &pacedServer{body: make([]byte, imageSize)}
	copy(s.body, "QFI\xfb\x00\x00\x00\x03")
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(s.body)))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return
		}
		s.gets.Add(1)
		if !s.paced.Load() {
			w.Write(s.body)
			return
		}
		s.mu.Lock()
		s.pacedStart = time.Now()
		s.mu.Unlock()
		t := time.NewTicker(tick)
		defer t.Stop()
		for off := 0; off < len(s.body); off += chunk {
			select {
			case <-r.Context().Done():
				return
			case <-t.C:
			}
			w.Write(s.body[off:min(off+chunk, len(s.body))])
			w.(http.Flusher).Flush()
		}
		s.mu.Lock()
		s.pacedEnd = time.Now()
		s.mu.Unlock()
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *pacedServer) window() (start, end time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pacedStart, s.pacedEnd
}

// addresses gives every domain of the fakes an agent address once it is defined, as a
// booted guest would report one.
func addresses(ctx context.Context, fakes ...*libvirtfake.Fake) {
	seen := map[string]bool{}
	for {
		for _, f := range fakes {
			for _, d := range f.Domains() {
				if seen[d.Name] {
					continue
				}
				seen[d.Name] = true
				ip := "192.168.50." + strconv.Itoa(len(seen)) + "/24"
				_ = f.SetInterfaceAddresses(d.Name, libvirt.DomainInterfaceAddressesSrcAgent,
					[]libvirt.DomainInterface{libvirtfake.Interface("eth0", "52:54:00:00:00:01", ip)}, nil)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestImageDownloadHoldsNoWorker: 10 Proxies on host A need an image A has not cached,
// while 5 Proxies on host B (image cached) are created and one on B is deleted. With the
// default 3 workers, B's Proxies reach Running and the delete finishes while A's download
// is still in flight, and A's 10 Proxies cause exactly one download.
func TestImageDownloadHoldsNoWorker(t *testing.T) {
	testEnv := testenv.StartT(t)
	ctx := testenv.Context(t)
	fakeA, fakeB := libvirtfake.New(), libvirtfake.New()
	sshA := sshtest.NewEnv(t, fakeA.ServeConn)
	sshB := sshA.AddHost(t, fakeB.ServeConn)
	img := newPacedServer(t)
	cfg := provider.KVMConfig{
		SSHKeyFile: sshA.KeyFile, KnownHostsFile: sshA.KnownHostsFile, DiskSizeGb: 1,
		Hosts: []provider.KVMHost{
			{Name: "host-a", Address: sshA.Addr, User: sshA.User, Socket: sshA.Socket, Bridge: "br0"},
			{Name: "host-b", Address: sshB.Addr(), User: sshA.User, Socket: sshA.Socket, Bridge: "br0"},
		},
		Images:       map[string]provider.KVMImage{"debian-13": {URL: img.URL + "/debian-13.qcow2"}},
		MachineTypes: map[string]provider.KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 512}},
	}
	cfg = cfg.WithDefaults()
	p, err := kvm2.New(provider.ProviderConfig{Name: "kvm2-home", Type: provider.TypeKVM2, KVM2: &cfg}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	go addresses(ctx, fakeA, fakeB)

	// Host B caches the image first, unpaced.
	warm := provider.CreateRequest{Name: "proxy-00000000000000b0", UID: "warm", Port: 3128, CloudInit: []byte("#cloud-config\n"),
		Placement: provider.Placement{Zone: "host-b", MachineType: "small", Image: "debian-13"}}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := providertest.CreateSettled(wctx, p, warm, 10*time.Millisecond); err != nil {
		t.Fatalf("warming host-b: %v", err)
	}
	warmGets := img.gets.Load()

	ns := testEnv.Namespace(t, ctx, "jobs")
	mgr := testEnv.NewManager(t, ns, nil)
	r := &proxy.ProxyReconciler{
		Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: mgr.GetEventRecorder("proxy-controller"),
		Providers:    map[string]provider.Provider{"kvm2-home": provider.Observe("kvm2-home", provider.TypeKVM2, p)},
		PendingRetry: 500 * time.Millisecond, PollInterval: 200 * time.Millisecond, QuotaRetry: time.Hour,
	}
	if err := r.SetupWithManager(mgr, 3); err != nil {
		t.Fatal(err)
	}
	testenv.StartManager(t, ctx, mgr)
	c := testEnv.Client
	newProxy := func(name, zone string) *v1alpha1.Proxy {
		px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1alpha1.ProxySpec{Provider: "kvm2-home", CloudInit: "#cloud-config\n",
				Placement: v1alpha1.ProxyPlacement{Zone: zone, MachineType: "small", Image: "debian-13"}}}
		if err := c.Create(ctx, px); err != nil {
			t.Fatalf("creating proxy %s: %v", name, err)
		}
		return px
	}
	phase := func(name string) v1alpha1.ProxyPhase {
		px := &v1alpha1.Proxy{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, px); err != nil {
			return ""
		}
		return px.Status.Phase
	}
	// The Proxy to delete on B, Running before the measured part starts.
	newProxy("b-delete", "host-b")
	testutil.WaitFor(t, time.Minute, "b-delete to run", func() (bool, error) {
		ph := phase("b-delete")
		return ph == v1alpha1.PhaseRunning, fmt.Errorf("phase %q", ph)
	})

	img.paced.Store(true)
	start := time.Now()
	for i := range 10 {
		newProxy("a-"+strconv.Itoa(i), "host-a")
	}
	for i := range 5 {
		newProxy("b-"+strconv.Itoa(i), "host-b")
	}
	del := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "b-delete", Namespace: ns}}
	if err := c.Delete(ctx, del); err != nil {
		t.Fatal(err)
	}
	var bRunning, deleted time.Duration
	testutil.WaitFor(t, 2*time.Minute, "B's Proxies to run and the delete to finish", func() (bool, error) {
		n := 0
		if bRunning == 0 {
			for i := range 5 {
				if phase("b-"+strconv.Itoa(i)) == v1alpha1.PhaseRunning {
					n++
				}
			}
			if n == 5 {
				bRunning = time.Since(start)
			}
		}
		if deleted == 0 {
			err := c.Get(ctx, client.ObjectKeyFromObject(del), &v1alpha1.Proxy{})
			if apierrors.IsNotFound(err) {
				deleted = time.Since(start)
			}
		}
		return bRunning > 0 && deleted > 0, fmt.Errorf("%d of B's 5 Proxies Running (or all, after %s), deleted after %s", n, bRunning, deleted)
	})
	bDone := time.Now()
	if _, end := img.window(); !end.IsZero() && end.Before(bDone) {
		t.Fatalf("A's download ended %s before B was done; it must still be in flight", bDone.Sub(end))
	}
	// A's Proxies show the job's progress meanwhile.
	px := &v1alpha1.Proxy{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "a-0"}, px); err != nil {
		t.Fatal(err)
	}
	if px.Status.Phase != v1alpha1.PhaseProvisioning {
		t.Fatalf("a-0 is %s while its image downloads, want Provisioning", px.Status.Phase)
	}
	testutil.WaitFor(t, 2*time.Minute, "A's Proxies to run", func() (bool, error) {
		for i := range 10 {
			if ph := phase("a-" + strconv.Itoa(i)); ph != v1alpha1.PhaseRunning {
				return false, fmt.Errorf("a-%d is %q", i, ph)
			}
		}
		return true, nil
	})
	aRunning := time.Since(start)
	dlStart, dlEnd := img.window()
	if got := img.gets.Load() - warmGets; got != 1 {
		t.Fatalf("A's 10 Proxies caused %d downloads, want 1", got)
	}
	t.Logf("B's 5 Proxies Running after %s; B's delete done after %s; A's download took %s (ended %s after start); "+
		"A's 10 Proxies Running after %s; downloads for A: 1",
		bRunning.Round(time.Millisecond), deleted.Round(time.Millisecond), dlEnd.Sub(dlStart).Round(time.Millisecond),
		dlEnd.Sub(start).Round(time.Millisecond), aRunning.Round(time.Millisecond))
}
