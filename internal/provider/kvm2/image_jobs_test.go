package kvm2

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// wantPending fails unless err is the pending result, and returns its progress.
func wantPending(t *testing.T, err error) provider.Progress {
	t.Helper()
	if !errors.Is(err, provider.ErrPending) || provider.Class(err) != provider.ErrPending {
		t.Fatalf("got %v, want the pending result", err)
	}
	pr, ok := provider.PendingProgress(err)
	if !ok || pr.Reason != provider.ReasonImageDownloading {
		t.Fatalf("pending result carries progress %+v (%v), want reason %s", pr, ok, provider.ReasonImageDownloading)
	}
	return pr
}

// runningJobs is how many image jobs the provider has in flight.
func (e *testEnv) runningJobs() int {
	return e.p.images.Running()
}

// noRunningJobs is a WaitFor condition: no image job is running.
func (e *testEnv) noRunningJobs() (bool, error) {
	n := e.runningJobs()
	return n == 0, fmt.Errorf("%d jobs running", n)
}

// TestImageCreatesShareOneJob: the first Create needing the image starts its fetch in the
// background and returns pending at once, on a context it may cancel; a second Create
// joins the job without asking the mirror anything and sees its progress; once the job
// is done both go on, with one download between them.
func TestImageCreatesShareOneJob(t *testing.T) {
	e := newTestEnv(t, withImageServer(nil), withTestHost("img"))
	e.p.images.ProgressEvery = 10 * time.Millisecond
	e.srv.setMode(serveGated)

	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	_, err := e.p.Create(ctx, e.request("vm-a"))
	first := wantPending(t, err)
	cancel() // the job is the provider's, not this call's
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the first Create took %s; it must return at once", took)
	}
	if first.Message != "fetching base image debian-13 to host "+e.host {
		t.Fatalf("first progress %+v", first)
	}
	select {
	case <-e.srv.halfSent:
	case <-time.After(10 * time.Second):
		t.Fatal("gave up waiting for the job's download to be half way")
	}
	heads := e.srv.heads.Load()
	// The upload reads the body in chunks; what arrived of the half is counted up to the
	// last whole one.
	half := fmt.Sprintf("downloading base image debian-13 to host %s: 1.5 MiB of 3.0 MiB (49%%)", e.host)
	var pr provider.Progress
	testutil.WaitFor(t, waitLong, "the second Create to show the job half way", func() (bool, error) {
		_, err := e.createOnce("vm-b")
		pr = wantPending(t, err)
		return pr.Message == half, fmt.Errorf("progress %q", pr.Message)
	})
	if pr.Done < 3<<19 || pr.Done > testImageSize/2 || pr.Total != testImageSize {
		t.Fatalf("progress %+v, want about half of %d bytes", pr, testImageSize)
	}
	if e.srv.heads.Load() != heads || e.srv.gets.Load() != 1 || e.runningJobs() != 1 {
		t.Fatalf("joining asked the mirror (%d HEADs, %d GETs) or started a job (%d running)",
			e.srv.heads.Load()-heads, e.srv.gets.Load(), e.runningJobs())
	}
	if _, ok := e.volume(e.img.MarkerVol()); ok {
		t.Fatal("marker written before the download ended")
	}
	e.srv.release()
	for _, name := range []string{"vm-a", "vm-b"} {
		if _, err := e.create(name); err != nil {
			t.Fatal(err)
		}
		if _, ok := e.volume(overlayVolName(name)); !ok {
			t.Fatalf("no overlay for %s", name)
		}
	}
	e.wantCached(t)
	if e.srv.gets.Load() != 1 || len(e.baseUploads()) != 1 {
		t.Fatalf("%d GETs and %d base uploads, want one each", e.srv.gets.Load(), len(e.baseUploads()))
	}
}

// TestImageJobFailureReportedOncePerWaiter: a failed job's error reaches every Create
// that waited on it, each once and with its class; the next Create starts a new job, and
// a Create that never waited never sees the old error.
func TestImageJobFailureReportedOncePerWaiter(t *testing.T) {
	e := newTestEnv(t, withImageServer(nil), withTestHost("img"))
	e.srv.setMode(serveStall)
	// The download deadline ends the stall. It covers the request, the upload's own SSH
	// dial and the first half of the body, all of which must be through before it for the
	// error to count exactly half: one second was too short now and then when the
	// package's tests ran in parallel under -race on a loaded machine. The upload and
	// transfer budgets are far away, so only the download deadline can end it.
	e.p.images.Download = 5 * time.Second
	e.p.hosts.budgets.smallUpload, e.p.hosts.budgets.transfer = 10*time.Minute, 10*time.Minute
	_, err := e.createOnce("vm-a")
	wantPending(t, err)
	<-e.srv.halfSent
	_, err = e.createOnce("vm-b")
	wantPending(t, err)
	testutil.WaitFor(t, waitLong, "the stalled job to fail", e.noRunningJobs)
	e.wantNotCached(t)

	wantFailure := func(name string) {
		t.Helper()
		_, err := e.createOnce(name)
		wantClass(t, err, provider.ErrTransient, nil)
		if want := fmt.Sprintf("the body ended after %d of %d bytes", testImageSize/2, testImageSize); !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %q does not say %q", name, err, want)
		}
	}
	e.srv.setMode(serveOK)
	wantFailure("vm-a")
	// Told once: the next Create of vm-a starts a fresh job.
	_, err = e.createOnce("vm-a")
	wantPending(t, err)
	// vm-b waited on the failed job too: it is told, even with the new job running.
	wantFailure("vm-b")
	// vm-c never waited on it.
	_, err = e.createOnce("vm-c")
	if err != nil && !errors.Is(err, provider.ErrPending) {
		t.Fatalf("vm-c was told another Create's failure: %v", err)
	}
	for _, name := range []string{"vm-a", "vm-b", "vm-c"} {
		if _, err := e.create(name); err != nil {
			t.Fatalf("%s after the fresh job: %v", name, err)
		}
	}
	e.wantCached(t)
	if e.srv.gets.Load() != 2 {
		t.Fatalf("%d GETs, want the failed one and the fresh job's", e.srv.gets.Load())
	}
}

// TestImageJobPermanentFailureKeepsItsClass: a job that fails permanently (the digest
// differs from the configured one) reports permanent, naming the URL.
func TestImageJobPermanentFailureKeepsItsClass(t *testing.T) {
	e := newTestEnv(t, withImageServer(func(string) string { return strings.Repeat("ab", 32) }), withTestHost("img"))
	_, err := e.createOnce("vm-a")
	wantPending(t, err)
	testutil.WaitFor(t, waitLong, "the job to end", e.noRunningJobs)
	_, err = e.createOnce("vm-a")
	wantClass(t, err, provider.ErrPermanent, nil)
	if !strings.Contains(err.Error(), "not the configured "+strings.Repeat("ab", 32)) || !strings.Contains(err.Error(), e.srv.URL+"/images/") {
		t.Fatalf("error %q", err)
	}
	e.wantNotCached(t)
}

// TestImageJobCancelledByClose: Close cancels a job mid-download and returns only once it
// has ended; the half-written base is removed and no marker written; a Create after Close
// starts no job.
func TestImageJobCancelledByClose(t *testing.T) {
	e := newTestEnv(t, withImageServer(nil), withTestHost("img"), withSSH())
	e.srv.setMode(serveGated)
	_, err := e.createOnce("vm-a")
	wantPending(t, err)
	<-e.srv.halfSent
	// The server holds the rest of the body until the test ends: Close returning at all
	// means it cancelled the job.
	if err := e.p.Close(); err != nil {
		t.Fatal(err)
	}
	if e.runningJobs() != 0 {
		t.Fatal("Close returned with a job running")
	}
	// The base may stay (the pooled connection went with the job's context); without its
	// marker it is never used, and the next fetch replaces it.
	if _, ok := e.volume(e.img.MarkerVol()); ok {
		t.Fatal("a marker was written for a cancelled fetch")
	}
	_, err = e.createOnce("vm-b")
	if err == nil || errors.Is(err, provider.ErrPending) || e.srv.gets.Load() != 1 {
		t.Fatalf("a Create after Close: %v, %d GETs", err, e.srv.gets.Load())
	}
}
