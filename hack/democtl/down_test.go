package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

// testProxy is a Proxy as the manager leaves it: with its finalizer and, when deleting is
// set, already being deleted.
func testProxy(ns, name, uid string, deleting bool) *v1alpha1.Proxy {
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: name, UID: types.UID(uid), Finalizers: []string{proxy.Finalizer},
	}}
	px.Status.Phase = v1alpha1.PhaseReady
	if deleting {
		now := metav1.Now()
		px.DeletionTimestamp = &now
	}
	return px
}

func newFakeClient(objs ...client.Object) client.Client {
	return fake.NewClientBuilder().WithScheme(proxyScheme()).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.Proxy{}).Build()
}

// releaseFinalizers does the manager's part: every Proxy being deleted loses its finalizer
// (its VM is gone), until ctx ends.
func releaseFinalizers(ctx context.Context, t *testing.T, c client.Client) {
	for ctx.Err() == nil {
		var list v1alpha1.ProxyList
		if err := c.List(ctx, &list); err != nil && ctx.Err() == nil {
			t.Errorf("listing: %v", err)
			return
		}
		for i := range list.Items {
			px := &list.Items[i]
			if !px.DeletionTimestamp.IsZero() && controllerutil.RemoveFinalizer(px, proxy.Finalizer) {
				if err := c.Update(ctx, px); err != nil && ctx.Err() == nil {
					t.Errorf("releasing %s: %v", px.Name, err)
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func recordPath(t *testing.T) string { return filepath.Join(t.TempDir(), "proxies.json") }

func TestDeleteAllDeletesEveryNamespacesProxiesAndWaitsForThem(t *testing.T) {
	c := newFakeClient(testProxy("default", "proxy-kvm2-sample", "uid-1", false),
		testProxy("default", "proxy-2", "uid-2", false), testProxy("crawlers", "proxy-3", "uid-3", false))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); releaseFinalizers(ctx, t, c) }()
	defer func() { cancel(); <-done }()

	rec := recordPath(t)
	var out bytes.Buffer
	if err := deleteAll(context.Background(), c, rec, os.Getpid(), time.Minute, 10*time.Millisecond, &out); err != nil {
		t.Fatalf("deleteAll: %v\n%s", err, out.String())
	}
	var list v1alpha1.ProxyList
	if err := c.List(context.Background(), &list); err != nil || len(list.Items) != 0 {
		t.Fatalf("after deleteAll the cluster holds %d Proxies (err %v), want none", len(list.Items), err)
	}
	if !strings.Contains(out.String(), "deleted 3 Proxies") {
		t.Errorf("output does not say how many it deleted:\n%s", out.String())
	}
	r, err := loadRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	for _, uid := range []string{"uid-1", "uid-2", "uid-3"} {
		if !r.has(uid) {
			t.Errorf("the record lacks %s: %+v", uid, r.Proxies)
		}
	}
}

func TestDeleteAllNamesTheProxiesLeftAtTheDeadline(t *testing.T) {
	c := newFakeClient(testProxy("crawlers", "stuck", "uid-1", false)) // no manager releases it
	var out bytes.Buffer
	err := deleteAll(context.Background(), c, recordPath(t), os.Getpid(), 50*time.Millisecond, 5*time.Millisecond, &out)
	if err == nil {
		t.Fatalf("deleteAll returned no error with a Proxy left\n%s", out.String())
	}
	inst := testProxy("crawlers", "stuck", "", false).InstanceName()
	for _, want := range []string{"1 left", "crawlers/stuck", "Ready", inst} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

// A manager that dies during down (or had died just before it looked) releases no
// finalizer: waiting for it would only run out the deadline.
func TestDeleteAllStopsWaitingWhenTheManagerExits(t *testing.T) {
	c := newFakeClient(testProxy("default", "a", "uid-1", false))
	manager := exec.Command("sleep", "600")
	if err := manager.Start(); err != nil {
		t.Fatal(err)
	}
	if err := manager.Process.Kill(); err != nil { // a zombie until waited for
		t.Fatal(err)
	}
	for _, reaped := range []bool{false, true} {
		if reaped {
			_ = manager.Wait()
		}
		start := time.Now()
		err := deleteAll(context.Background(), c, recordPath(t), manager.Process.Pid, 10*time.Minute, 5*time.Millisecond, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "not running any more") || !strings.Contains(err.Error(), "default/a") {
			t.Errorf("reaped %v: deleteAll = %v, want an error saying the manager is gone and naming default/a", reaped, err)
		}
		if d := time.Since(start); d > 5*time.Minute {
			t.Errorf("reaped %v: deleteAll waited %s for a dead manager", reaped, d)
		}
	}
}

func TestDeleteAllWithoutWaitLeavesTheFinalizersToTheSweep(t *testing.T) {
	c := newFakeClient(testProxy("default", "a", "uid-1", false))
	var out bytes.Buffer
	if err := deleteAll(context.Background(), c, recordPath(t), 0, time.Minute, time.Millisecond, &out); err != nil {
		t.Fatal(err)
	}
	var px v1alpha1.Proxy
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "a"}, &px); err != nil {
		t.Fatalf("the Proxy is gone without its finalizer released: %v", err)
	}
	if px.DeletionTimestamp.IsZero() {
		t.Errorf("the Proxy is not being deleted")
	}
	if !strings.Contains(out.String(), "manager is not running") {
		t.Errorf("output does not say why it does not wait:\n%s", out.String())
	}
}

func TestDeleteAllWithNoProxySaysSo(t *testing.T) {
	var out bytes.Buffer
	if err := deleteAll(context.Background(), newFakeClient(), recordPath(t), os.Getpid(), time.Minute, time.Millisecond, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "no Proxy in the cluster") {
		t.Errorf("output: %q", out.String())
	}
}

// writeRecord records the Proxies as the control plane would have.
func writeRecord(t *testing.T, path string, pxs ...*v1alpha1.Proxy) {
	t.Helper()
	r := &record{}
	items := make([]v1alpha1.Proxy, 0, len(pxs))
	for _, px := range pxs {
		items = append(items, *px)
	}
	r.add(items)
	if err := r.save(path); err != nil {
		t.Fatal(err)
	}
}

// recordedWithDomain records px and gives the fake provider its domain, marked with its
// UID (at providerID, or the fake's own ID when empty): what a demo leaves behind.
func recordedWithDomain(t *testing.T, px *v1alpha1.Proxy, providerID string) (string, *providertest.Fake, string) {
	t.Helper()
	rec := recordPath(t)
	writeRecord(t, rec, px)
	f := providertest.NewFake()
	id := f.SetInstance(provider.Instance{ProviderID: providerID, Name: px.InstanceName(), UID: string(px.UID)})
	return rec, f, id
}

func instanceIDs(f *providertest.Fake) []string {
	var ids []string
	for _, inst := range f.Instances() {
		ids = append(ids, inst.ProviderID)
	}
	return ids
}

func TestSweepRemovesOnlyTheRecordedProxiesDomains(t *testing.T) {
	a, b := testProxy("default", "a", "uid-a", true), testProxy("crawlers", "b", "uid-b", true)
	rec := recordPath(t)
	writeRecord(t, rec, a, b)
	f := providertest.NewFake()
	f.SetInstance(provider.Instance{Name: a.InstanceName(), UID: "uid-a"})
	f.SetInstance(provider.Instance{Name: b.InstanceName(), UID: "uid-b"})
	other := f.SetInstance(provider.Instance{Name: "proxy-0123456789abcdef", UID: "uid-of-a-test"}) // the shared host's
	noUID := f.SetInstance(provider.Instance{Name: "proxy-fedcba9876543210"})
	c := newFakeClient(a, b)

	var out bytes.Buffer
	s := &sweeper{prov: f, c: c, record: rec, out: &out}
	if err := s.sweep(context.Background()); err != nil {
		t.Fatalf("sweep: %v\n%s", err, out.String())
	}
	if got := instanceIDs(f); len(got) != 2 || !strings.Contains(strings.Join(got, " "), other) || !strings.Contains(strings.Join(got, " "), noUID) {
		t.Errorf("instances left %v, want exactly %s and %s (not this demo's)", got, other, noUID)
	}
	if !strings.Contains(out.String(), "removed 2 domains directly") {
		t.Errorf("output does not count the removed domains:\n%s", out.String())
	}
	var list v1alpha1.ProxyList
	if err := c.List(context.Background(), &list); err != nil || len(list.Items) != 0 {
		t.Errorf("the Proxies whose domains are gone still hold their finalizers: %d left (err %v)", len(list.Items), err)
	}
	if _, err := os.Stat(rec); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the record stays after a clean sweep: %v", err)
	}
	// A second sweep (a second down) finds nothing to do and touches nothing.
	out.Reset()
	before := len(f.Calls())
	if err := s.sweep(context.Background()); err != nil {
		t.Fatalf("second sweep: %v", err)
	}
	if n := len(f.Calls()) - before; n != 0 || !strings.Contains(out.String(), "no Proxy recorded") {
		t.Errorf("second sweep made %d provider calls and said %q", n, out.String())
	}
}

func TestSweepWithoutAnAPIServerGoesByTheRecord(t *testing.T) {
	a := testProxy("default", "a", "uid-a", false)
	rec, f, _ := recordedWithDomain(t, a, "")
	var out bytes.Buffer
	if err := (&sweeper{prov: f, record: rec, out: &out}).sweep(context.Background()); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if n := len(f.Instances()); n != 0 {
		t.Errorf("%d instances left, want none", n)
	}
}

func TestSweepNamesTheDomainsLeftWithTheCommandsAndKeepsTheRecord(t *testing.T) {
	a := testProxy("crawlers", "a", "uid-a", true)
	rec, f, id := recordedWithDomain(t, a, "hosts/local/domains/"+a.InstanceName())
	f.NextDeleteErr(provider.Transient(errors.New("ssh: connection refused")))
	c := newFakeClient(a)
	var out bytes.Buffer
	s := &sweeper{prov: f, c: c, record: rec, pools: map[string]string{"local": "epo-pool"}, out: &out}
	err := s.sweep(context.Background())
	if err == nil {
		t.Fatalf("sweep returned no error with a domain left\n%s", out.String())
	}
	for _, want := range []string{
		"1 domains of this demo are left", id, "crawlers/a", "uid-a", "connection refused",
		"virsh -c qemu:///system undefine --nvram " + a.InstanceName(),
		"vol-delete --pool epo-pool " + a.InstanceName() + ".qcow2",
		"vol-delete --pool epo-pool " + a.InstanceName() + "-seed.iso",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q:\n%v", want, err)
		}
	}
	var px v1alpha1.Proxy
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(a), &px); err != nil {
		t.Errorf("the Proxy whose domain is left lost its finalizer: %v", err)
	}
	if _, err := os.Stat(rec); err != nil {
		t.Fatalf("the record is gone while a domain is left: %v", err)
	}
}

func TestSweepAfterAFailedOneFinishes(t *testing.T) {
	a := testProxy("default", "a", "uid-a", true)
	rec, f, _ := recordedWithDomain(t, a, "")
	f.NextDeleteErr(provider.Transient(errors.New("ssh: connection refused")))
	c := newFakeClient(a)
	s := &sweeper{prov: f, c: c, record: rec, out: &bytes.Buffer{}}
	if err := s.sweep(context.Background()); err == nil {
		t.Fatal("the first sweep returned no error with its delete failing")
	}
	// The next down tries again and, the host answering now, finishes.
	if err := s.sweep(context.Background()); err != nil {
		t.Fatalf("second sweep: %v", err)
	}
	if n := len(f.Instances()); n != 0 {
		t.Errorf("%d instances left after the second sweep", n)
	}
	var list v1alpha1.ProxyList
	if err := c.List(context.Background(), &list); err != nil || len(list.Items) != 0 {
		t.Errorf("%d Proxies left after the second sweep (err %v)", len(list.Items), err)
	}
	if _, err := os.Stat(rec); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the record stays after the second, clean sweep: %v", err)
	}
}

func TestSweepListingFailureNamesTheRecordedInstances(t *testing.T) {
	a := testProxy("default", "a", "uid-a", false)
	rec := recordPath(t)
	writeRecord(t, rec, a)
	f := providertest.NewFake()
	f.NextListErr(provider.Transient(errors.New("dial tcp 127.0.0.1:2222: connection refused")))
	err := (&sweeper{prov: f, record: rec, out: &bytes.Buffer{}}).sweep(context.Background())
	if err == nil {
		t.Fatal("sweep returned no error when the host could not be listed")
	}
	for _, want := range []string{"listing the marked domains", "2222", a.InstanceName(), "default/a", "uid-a"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q: %v", want, err)
		}
	}
}

func TestRecordAddsEachProxyOnce(t *testing.T) {
	rec := recordPath(t)
	c := newFakeClient(testProxy("default", "a", "uid-a", false))
	for range 2 {
		if _, err := recordProxies(context.Background(), c, rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Create(context.Background(), testProxy("x", "b", "uid-b", false)); err != nil {
		t.Fatal(err)
	}
	if _, err := recordProxies(context.Background(), c, rec); err != nil {
		t.Fatal(err)
	}
	r, err := loadRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Proxies) != 2 || r.Proxies[0].UID != "uid-a" || r.Proxies[1].Instance != testProxy("x", "b", "", false).InstanceName() {
		t.Errorf("record %+v, want uid-a then x/b, each once", r.Proxies)
	}
}

// A control-plane round that listed the Proxies before a sweep released their finalizers
// must not save that list after the sweep removed the record: the record would come back
// naming Proxies that are gone. The round lists under the record's lock, so the sweep
// waits for it.
func TestRecordRoundDoesNotOutliveASweep(t *testing.T) {
	a := testProxy("default", "a", "uid-a", true)
	rec, f, _ := recordedWithDomain(t, a, "")
	objects := newFakeClient(a)
	sweepDone := make(chan error, 1)
	round := interceptor.NewClient(objects.(client.WithWatch), interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			err := c.List(ctx, list, opts...) // the round's list, the Proxy still there
			go func() { sweepDone <- (&sweeper{prov: f, c: objects, record: rec, out: &bytes.Buffer{}}).sweep(ctx) }()
			select {
			case err := <-sweepDone:
				t.Errorf("the sweep finished (err %v) while a round was between its list and its save", err)
				sweepDone <- err
			case <-time.After(500 * time.Millisecond):
			}
			return err
		},
	})
	if _, err := recordProxies(context.Background(), round, rec); err != nil {
		t.Fatal(err)
	}
	if err := <-sweepDone; err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if _, err := os.Stat(rec); !errors.Is(err, os.ErrNotExist) {
		r, _ := loadRecord(rec)
		t.Errorf("the record is back after the sweep (%v): %+v", err, r)
	}
}

func TestLoadRecordRefusesACorruptFile(t *testing.T) {
	rec := recordPath(t)
	if err := os.WriteFile(rec, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadRecord(rec); err == nil || !strings.Contains(err.Error(), rec) {
		t.Errorf("loadRecord of a corrupt file: %v, want an error naming %s", err, rec)
	}
}

// The control plane's rounds and down's delete-all record concurrently, each from its own
// list; neither may lose what the other added.
func TestRecordKeepsConcurrentAdditions(t *testing.T) {
	rec := recordPath(t)
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		c := newFakeClient(testProxy("default", fmt.Sprintf("p-%d", i), fmt.Sprintf("uid-%d", i), false))
		wg.Go(func() {
			if _, err := recordProxies(context.Background(), c, rec); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	r, err := loadRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Proxies) != n {
		t.Errorf("the record holds %d Proxies, want all %d: %+v", len(r.Proxies), n, r.Proxies)
	}
}

// External Proxies (make demo-external) have no domains: they are not recorded, so down
// has nothing to sweep, and needs no providers config for it.
func TestRecordLeavesOutExternalProxies(t *testing.T) {
	ext := testProxy("crawl", "crawler-1", "uid-ext", false)
	ext.Spec.Mode = v1alpha1.ProxyModeExternal
	was := testProxy("crawl", "was-managed", "uid-was", false)
	was.Spec.Mode = v1alpha1.ProxyModeExternal
	was.Status.ProviderID = "kvm2/local/default/x"
	managed := testProxy("default", "proxy-kvm2-sample", "uid-vm", false)
	var r record
	r.add([]v1alpha1.Proxy{*ext, *was, *managed})
	if r.has("uid-ext") || !r.has("uid-was") || !r.has("uid-vm") {
		t.Errorf("record %+v: want the Managed Proxy and the one that had an instance, not the External one", r.Proxies)
	}
}
