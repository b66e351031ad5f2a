package kvm2

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

const testImageSize = 3<<20 + 12345

func (e *testEnv) create(name string) (provider.Instance, error) {
	return e.createCtx(context.Background(), name)
}

// createCtx creates name as the reconciler would: it repeats the Create while it is
// pending (an image job runs) and returns what the first settled call returns.
func (e *testEnv) createCtx(ctx context.Context, name string) (provider.Instance, error) {
	return createSettled(ctx, e.p, e.request(name))
}

// createOnce is one Create of name, pending or not.
func (e *testEnv) createOnce(name string) (provider.Instance, error) {
	return e.p.Create(context.Background(), e.request(name))
}

func (e *testEnv) request(name string) provider.CreateRequest {
	req := testRequest(name)
	req.Placement.Zone = e.host
	return req
}

// createSettled repeats req on p while the result is pending, for at most a generous
// deadline within ctx, and returns the first result that is not.
func createSettled(ctx context.Context, p provider.Provider, req provider.CreateRequest) (provider.Instance, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	return providertest.CreateSettled(ctx, p, req, 2*time.Millisecond)
}

func (e *testEnv) volume(name string) (libvirtfake.VolumeInfo, bool) {
	return e.fake.Volume(libvirtfake.DefaultPool, name)
}

// baseUploads returns the uploads into the base volume.
func (e *testEnv) baseUploads() []libvirtfake.Upload {
	var out []libvirtfake.Upload
	for _, u := range e.fake.Uploads() {
		if u.Volume == e.img.BaseVol() {
			out = append(out, u)
		}
	}
	return out
}

// wantCached fails unless the pool holds the whole image and a marker with its digest.
func (e *testEnv) wantCached(t *testing.T) {
	t.Helper()
	base, ok := e.volume(e.img.BaseVol())
	if !ok || string(base.Content) != string(e.srv.body) {
		t.Fatalf("base volume missing or not the served image (found %v, %d bytes)", ok, len(base.Content))
	}
	if base.Format != "qcow2" {
		t.Fatalf("base format after the pool refresh is %q, want qcow2", base.Format)
	}
	marker, ok := e.volume(e.img.MarkerVol())
	if !ok || string(marker.Content) != e.srv.digest {
		t.Fatalf("marker %q (found %v), want %s", marker.Content, ok, e.srv.digest)
	}
}

// wantNotCached fails when a marker exists, or a base that is not being written.
func (e *testEnv) wantNotCached(t *testing.T) {
	t.Helper()
	if _, ok := e.volume(e.img.MarkerVol()); ok {
		t.Fatal("a marker was written for a failed fetch")
	}
	if _, ok := e.volume(e.img.BaseVol()); ok {
		t.Fatal("the base volume of a failed fetch was left in the pool")
	}
}

// putCached places a base volume holding the served image and a marker holding content.
func (e *testEnv) putCached(t *testing.T, marker string) {
	t.Helper()
	if err := e.fake.PutVolume(libvirtfake.DefaultPool, libvirtfake.VolumeInfo{Name: e.img.BaseVol(), Format: "qcow2",
		Content: []byte("an older copy")}); err != nil {
		t.Fatal(err)
	}
	if err := e.fake.PutVolume(libvirtfake.DefaultPool, libvirtfake.VolumeInfo{Name: e.img.MarkerVol(), Content: []byte(marker)}); err != nil {
		t.Fatal(err)
	}
}

// pooled is the host's pooled backend and pool, for calling the image functions directly.
func (e *testEnv) pooled(t *testing.T) (backend, provider.KVMHost, libvirt.StoragePool) {
	t.Helper()
	b, err := e.p.hosts.pooled(context.Background(), e.host)
	if err != nil {
		t.Fatal(err)
	}
	h := must(e.p.hosts.host(e.host))
	pool, err := b.StoragePoolLookupByName(h.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return b, h, pool
}

// wantOneSharedFetch takes two Creates that were started against the gated image server
// (their results arrive on errs) and checks they shared one fetch: both wait while the
// first download is half way, both prechecks asked for the length, and once the server
// lets the download finish both succeed with one GET and one base upload between them.
func (e *testEnv) wantOneSharedFetch(t *testing.T, errs <-chan error, what string) {
	t.Helper()
	select {
	case <-e.srv.halfSent: // one fetch is half way through
	case err := <-errs:
		t.Fatalf("a Create ended before the fetch was half way: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("gave up waiting for a fetch to be half way through")
	}
	// Both prechecks asked for the length, so both Creates saw no marker and queue for
	// the image; only then may the fetch finish.
	testutil.WaitFor(t, waitLong, "both prechecks to ask for the image length", func() (bool, error) {
		return e.srv.heads.Load() == 2, fmt.Errorf("%d HEAD requests", e.srv.heads.Load())
	})
	e.srv.release()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	e.wantCached(t)
	if e.srv.gets.Load() != 1 || len(e.baseUploads()) != 1 {
		t.Fatalf("%d GETs and %d base uploads for %s, want one each", e.srv.gets.Load(), len(e.baseUploads()), what)
	}
}
