package kvm2

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

func TestImageFetchedOnFirstCreateThenCached(t *testing.T) {
	e := newTestEnv(t, withImageServer(nil), withTestHost("img"))
	if _, err := e.create("vm-a"); err != nil {
		t.Fatal(err)
	}
	e.wantCached(t)
	if got := e.srv.gets.Load(); got != 1 {
		t.Fatalf("%d GETs for one fetch, want 1", got)
	}
	ups := e.baseUploads()
	if len(ups) != 1 || ups[0].Received != testImageSize || ups[0].Length != testImageSize || ups[0].Err != nil {
		t.Fatalf("base uploads %+v, want one clean upload of %d bytes", ups, testImageSize)
	}
	for _, enc := range e.srv.acceptEncodings() {
		if enc != "identity" {
			t.Fatalf("a request carried Accept-Encoding %q, want identity", enc)
		}
	}
	// The pooled connection plus one dialled for the upload, which is closed again.
	if n := e.d.dials.Load(); n != 2 {
		t.Fatalf("%d dials, want the pooled one and one for the upload", n)
	}
	if !e.d.conn(1).closed.Load() || e.d.conn(0).closed.Load() {
		t.Fatal("the upload's connection must be closed after it and the pooled one left open")
	}
	// The URL as logged: without its query string, where a signed URL keeps its token.
	fetching := e.logs.find(`"msg":"fetching base image into host pool"`, `"size":`+strconv.Itoa(testImageSize),
		`"url":"`+e.srv.URL+`/images/debian-13-generic-amd64.qcow2"`)
	if lines := e.logs.find("t0ken"); len(lines) != 0 {
		t.Fatalf("a log line carries the URL's query: %q", lines)
	}
	cached := e.logs.find(`"msg":"base image cached"`, `"size":`+strconv.Itoa(testImageSize), `"digest":"`+e.srv.digest, `"duration"`)
	if len(fetching) != 1 || len(cached) != 1 {
		t.Fatalf("want one fetching and one cached line, got %q", e.logs.all())
	}
	var span sdktrace.ReadOnlySpan
	for _, s := range spansFor(e.host) {
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.String(), "sig=") || strings.Contains(a.Value.String(), "/images/") {
				t.Errorf("span %s attribute %s carries the URL: %s", s.Name(), a.Key, a.Value.String())
			}
		}
		if s.Name() == "kvm2.download" {
			span = s
		}
	}
	if span == nil || span.SpanKind() != trace.SpanKindClient {
		t.Fatal("no client span kvm2.download")
	}
	u := must(url.Parse(e.srv.URL))
	for key, want := range map[string]string{"kvm2.volume": e.img.BaseVol(), "kvm2.url_host": u.Host,
		"kvm2.sha256_configured": "false", "kvm2.bytes": strconv.Itoa(testImageSize)} {
		if v, ok := attr(span, key); !ok || v.String() != want {
			t.Errorf("span attribute %s = %q, want %q", key, v.String(), want)
		}
	}

	// A second VM finds the marker: no request at all, not even the precheck's HEAD.
	heads := e.srv.heads.Load()
	if _, err := e.create("vm-b"); err != nil {
		t.Fatal(err)
	}
	if e.srv.gets.Load() != 1 || e.srv.heads.Load() != heads || len(e.baseUploads()) != 1 {
		t.Fatalf("a cached image was fetched again: %d GETs, %d HEADs", e.srv.gets.Load(), e.srv.heads.Load())
	}
	overlay, _ := e.volume(overlayVolName("vm-b"))
	if overlay.BackingStore != libvirtfake.DefaultPoolPath+"/"+e.img.BaseVol() {
		t.Fatalf("overlay backs onto %q", overlay.BackingStore)
	}
}

func TestImageFetchFailures(t *testing.T) {
	for _, tc := range []struct {
		mode  string
		sha   bool // configure a sha256 that differs from the body's
		class error
		msg   string
	}{
		{mode: serveChunked, class: provider.ErrPermanent, msg: "sent no Content-Length"},
		{mode: serveZero, class: provider.ErrPermanent, msg: "sent a Content-Length of 0"},
		{mode: "404", class: provider.ErrPermanent, msg: "answered 404 Not Found"},
		{mode: "403", class: provider.ErrPermanent, msg: "answered 403 Forbidden"},
		{mode: "429", class: provider.ErrTransient, msg: "answered 429 Too Many Requests"},
		{mode: "503", class: provider.ErrTransient, msg: "answered 503 Service Unavailable"},
		{mode: serveShort, class: provider.ErrTransient, msg: fmt.Sprintf("the body ended after %d of %d bytes", testImageSize/2, testImageSize)},
		{mode: serveGzip, class: provider.ErrPermanent, msg: "answered 406 Not Acceptable"},
		{mode: serveOK, sha: true, class: provider.ErrPermanent, msg: "not the configured " + strings.Repeat("ab", 32)},
	} {
		t.Run(tc.mode+map[bool]string{true: "-sha"}[tc.sha], func(t *testing.T) {
			var sha func(string) string
			if tc.sha {
				sha = func(string) string { return strings.Repeat("AB", 32) }
			}
			e := newTestEnv(t, withImageServer(sha), withTestHost("img"))
			e.srv.setMode(tc.mode)
			// Through Create, as a user meets it: the precheck may be what fails.
			_, err := e.create("vm-a")
			wantClass(t, err, tc.class, nil)
			if !strings.Contains(err.Error(), tc.msg) || !strings.Contains(err.Error(), e.srv.URL+"/images/") {
				t.Fatalf("Create: %q does not name the URL and say %q", err, tc.msg)
			}
			e.wantNotCached(t)
			if _, ok := e.volume(overlayVolName("vm-a")); ok {
				t.Fatal("an overlay was created although the image is missing")
			}
			// And the fetch on its own, without the precheck in front of it.
			b, h, pool := e.pooled(t)
			_, err = e.p.images.Fetch(context.Background(), discardLog(), b, h, pool, e.img)
			wantClass(t, err, tc.class, nil)
			if !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Fetch: %q does not say %q", err, tc.msg)
			}
			e.wantNotCached(t)
			for _, s := range spansFor(e.host) {
				if s.Name() == "kvm2.download" && strings.Contains(s.Status().Description, "/images/") {
					t.Fatalf("span status carries the URL: %s", s.Status().Description)
				}
			}
		})
	}
}

func TestImageCrashMidDownloadIsRefetched(t *testing.T) {
	e := newTestEnv(t, withImageServer(nil), withTestHost("img"))
	// What a crash leaves: a base volume, part written, and no marker.
	if err := e.fake.PutVolume(libvirtfake.DefaultPool, libvirtfake.VolumeInfo{Name: e.img.BaseVol(),
		Content: e.srv.body[:1000], Capacity: testImageSize}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.create("vm-a"); err != nil {
		t.Fatal(err)
	}
	e.wantCached(t)
	if e.srv.gets.Load() != 1 || len(e.logs.find(`"msg":"removing a base image left without marker"`)) != 1 {
		t.Fatalf("%d GETs, logs %q", e.srv.gets.Load(), e.logs.all())
	}
}

func TestImageMarkerForcesRefetch(t *testing.T) {
	for _, tc := range []struct {
		name, marker string
		sha          bool
		reason       string
	}{
		{name: "garbage", marker: "not a digest at all", reason: "marker does not hold a sha256 digest"},
		{name: "short hex", marker: "abcdef", reason: "marker does not hold a sha256 digest"},
		{name: "differs from configured", marker: strings.Repeat("0", 64), sha: true, reason: "marker differs from the configured sha256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sha func(string) string
			if tc.sha {
				sha = strings.ToUpper // the configured digest is the body's, in upper case
			}
			e := newTestEnv(t, withImageServer(sha), withTestHost("img"))
			e.putCached(t, tc.marker)
			if _, err := e.create("vm-a"); err != nil {
				t.Fatal(err)
			}
			e.wantCached(t)
			lines := e.logs.find(`"msg":"image marker forces a refetch"`, `"reason":"`+tc.reason+`"`, `"level":1`)
			if e.srv.gets.Load() != 1 || len(lines) != 1 {
				t.Fatalf("%d GETs and %d refetch lines, want one each", e.srv.gets.Load(), len(lines))
			}
		})
	}
}

func TestImageValidMarkerIsUsedAsIs(t *testing.T) {
	// A marker with a digest and no sha256 configured: the cached copy stays, even
	// though its content is not what the URL serves now.
	e := newTestEnv(t, withImageServer(nil), withTestHost("img"))
	e.putCached(t, strings.Repeat("5", 64)+"\n")
	if _, err := e.create("vm-a"); err != nil {
		t.Fatal(err)
	}
	base, _ := e.volume(e.img.BaseVol())
	if string(base.Content) != "an older copy" || e.srv.gets.Load()+e.srv.heads.Load() != 0 {
		t.Fatalf("cached base replaced (%q) or URL asked (%d requests)", base.Content, e.srv.gets.Load()+e.srv.heads.Load())
	}
}

func TestImageHeadRefusedFallsBackToGet(t *testing.T) {
	e := newTestEnv(t, withImageServer(nil), withTestHost("img"))
	e.srv.setMode(serveHead405)
	if _, err := e.create("vm-a"); err != nil {
		t.Fatal(err)
	}
	e.wantCached(t)
	// The precheck's GET (closed at once) and the fetch's.
	if e.srv.heads.Load() != 1 || e.srv.gets.Load() != 2 {
		t.Fatalf("%d HEADs and %d GETs", e.srv.heads.Load(), e.srv.gets.Load())
	}
}

func TestImageStalledMirrorEndsByDownloadDeadline(t *testing.T) {
	e := newTestEnv(t, withImageServer(nil), withTestHost("img"))
	e.srv.setMode(serveStall)
	e.p.images.Download = 1500 * time.Millisecond
	// The upload and transfer budgets are far away, so only the download deadline can end
	// it however loaded the machine is.
	e.p.hosts.budgets.smallUpload, e.p.hosts.budgets.transfer = 10*time.Minute, 10*time.Minute
	start := time.Now()
	_, err := e.create("vm-a")
	wantClass(t, err, provider.ErrTransient, context.DeadlineExceeded)
	if !strings.Contains(err.Error(), fmt.Sprintf("the body ended after %d of %d bytes", testImageSize/2, testImageSize)) {
		t.Fatalf("error %q does not say where the body ended", err)
	}
	if took := time.Since(start); took >= e.p.hosts.budgets.smallUpload {
		t.Fatalf("took %s, the upload budget would have ended it", took)
	}
	// The stream itself ended cleanly with what had arrived: the connection was not
	// killed under it.
	ups := e.baseUploads()
	if len(ups) != 1 || !ups[0].Done || ups[0].Err != nil || ups[0].Received != testImageSize/2 {
		t.Fatalf("base upload %+v, want a clean end after the half that arrived", ups)
	}
	e.wantNotCached(t)
}
