package kvm2

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/kdomanski/iso9660"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
)

func TestCreateDefinesAndStartsDomain(t *testing.T) {
	env := newTestEnv(t)
	f := env.fake
	req := testRequest("proxy-aaaaaaaaaaaaaaaa")
	inst, err := env.p.Create(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	want := provider.Instance{ProviderID: "hosts/h1/domains/proxy-aaaaaaaaaaaaaaaa", Name: req.Name, UID: req.UID, State: provider.StateRunning}
	if diff := cmp.Diff(want, inst, cmpopts.IgnoreFields(provider.Instance{}, "IP", "CreatedAt")); diff != "" || inst.CreatedAt.IsZero() {
		t.Fatalf("instance (-want +got):\n%s\ncreatedAt %v, want a creation time", diff, inst.CreatedAt)
	}
	dom, ok := f.Domain(req.Name)
	if !ok || dom.State != libvirt.DomainRunning || !dom.Persistent || !dom.UEFI {
		t.Fatalf("domain on the host: %+v", dom)
	}
	m, err := ident.ParseMark(metadataURI, dom.Metadata[metadataURI])
	if err != nil || m.UID != req.UID || !m.CreatedAt.Equal(inst.CreatedAt) {
		t.Fatalf("mark %+v (%v), want uid %s created %s", m, err, req.UID, inst.CreatedAt)
	}
	dir := libvirtfake.DefaultPoolPath + "/"
	for _, s := range []string{`<source file="` + dir + req.Name + `.qcow2">`, `<source file="` + dir + req.Name + `-seed.iso">`, `<source bridge="br0">`} {
		if !strings.Contains(dom.XML, s) {
			t.Errorf("domain xml lacks %s:\n%s", s, dom.XML)
		}
	}
	overlay, ok := f.Volume(libvirtfake.DefaultPool, req.Name+".qcow2")
	if !ok || overlay.Format != "qcow2" || overlay.Capacity != 10<<30 || overlay.BackingStore != dir+"base-debian-13.qcow2" || overlay.BackingFormat != "qcow2" {
		t.Fatalf("overlay: %+v", overlay)
	}
	seed, ok := f.Volume(libvirtfake.DefaultPool, req.Name+"-seed.iso")
	if !ok || seed.Format != "raw" {
		t.Fatalf("seed: %+v", seed)
	}
	if got := readISOFile(t, seed.Content, "user-data"); got != testUserData {
		t.Fatalf("user-data on the uploaded seed is %q", got)
	}
	if got := readISOFile(t, seed.Content, "vendor-data"); got != guestAgentScript {
		t.Fatalf("vendor-data on the uploaded seed is %q", got)
	}
}

func readISOFile(t *testing.T, iso []byte, name string) string {
	t.Helper()
	img, err := iso9660.OpenImage(bytes.NewReader(iso))
	if err != nil {
		t.Fatal(err)
	}
	root, err := img.RootDir()
	if err != nil {
		t.Fatal(err)
	}
	children, err := root.GetChildren()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range children {
		if c.Name() == name {
			b, err := io.ReadAll(c.Reader())
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
	}
	t.Fatalf("no %s on the seed", name)
	return ""
}

func TestCreateBIOSImageAndQemuDomainType(t *testing.T) {
	env := newTestEnv(t)
	env.p.cfg.Hosts[0].DomainType = "qemu"
	putBase(t, env.fake, "legacy", "raw")
	req := testRequest("proxy-bbbbbbbbbbbbbbbb")
	req.Placement.Image = "legacy"
	if _, err := env.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	dom, _ := env.fake.Domain(req.Name)
	if dom.UEFI || !strings.Contains(dom.XML, `<domain type="qemu">`) || !strings.Contains(dom.XML, `<cpu mode="maximum">`) {
		t.Fatalf("bios/qemu domain:\n%s", dom.XML)
	}
	overlay, _ := env.fake.Volume(libvirtfake.DefaultPool, req.Name+".qcow2")
	if overlay.BackingFormat != "raw" || !strings.HasSuffix(overlay.BackingStore, "/base-legacy.raw") {
		t.Fatalf("overlay over a raw base: %+v", overlay)
	}
}

// TestCreatePlacementErrors: every unknown placement value is permanent with its own
// message, and is found before any host is dialled.
func TestCreatePlacementErrors(t *testing.T) {
	cases := []struct {
		name      string
		hosts     []string
		placement provider.Placement
		want      string
	}{
		{"unknown zone", nil, provider.Placement{Zone: "x", MachineType: "small", Image: "debian-13"},
			`placement.zone "x" is not in kvm2.hosts`},
		{"no zone with two hosts", []string{"h1", "h2"}, provider.Placement{MachineType: "small", Image: "debian-13"},
			`placement.zone is required when kvm2.hosts lists more than one host`},
		{"unknown machine type", nil, provider.Placement{MachineType: "x", Image: "debian-13"},
			`placement.machineType "x" is not in kvm2.machineTypes`},
		{"unknown image", nil, provider.Placement{MachineType: "small", Image: "x"},
			`placement.image "x" is neither a key in kvm2.images nor an http(s) URL`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := newTestEnv(t, withHosts(c.hosts...))
			req := testRequest("proxy-cccccccccccccccc")
			req.Placement = c.placement
			_, err := env.p.Create(t.Context(), req)
			if !errors.Is(err, provider.ErrPermanent) || provider.Class(err) != provider.ErrPermanent || err.Error() != c.want {
				t.Fatalf("got %v (class %s), want permanent %q", err, provider.ClassName(err), c.want)
			}
			if n := env.totalDials(); n != 0 {
				t.Fatalf("%d dials for an invalid placement", n)
			}
		})
	}
}

func TestCreatePicksHostByZone(t *testing.T) {
	env := newTestEnv(t, withHosts("h1", "h2"))
	req := testRequest("proxy-dddddddddddddddd")
	req.Placement.Zone = "h2"
	inst, err := env.p.Create(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if inst.ProviderID != "hosts/h2/domains/"+req.Name {
		t.Fatalf("providerID %q", inst.ProviderID)
	}
	if _, ok := env.fakes["h1"].Domain(req.Name); ok {
		t.Fatal("domain landed on h1")
	}
	if _, ok := env.fakes["h2"].Domain(req.Name); !ok {
		t.Fatal("domain missing on h2")
	}
}

// TestCreateFailsAtOnceWhenStartDoesNotRun: a domain that is shut off, crashed or
// paused right after its start fails the attempt at once, transiently.
func TestCreateFailsAtOnceWhenStartDoesNotRun(t *testing.T) {
	for _, st := range []libvirt.DomainState{libvirt.DomainShutoff, libvirt.DomainCrashed, libvirt.DomainPaused} {
		t.Run(st.String(), func(t *testing.T) {
			env := newTestEnv(t)
			env.p.runningWait = time.Hour // a wait would hang the test
			req := testRequest("proxy-2222222222222222")
			env.fake.SetStateAfterCreate(req.Name, st)
			_, err := env.p.Create(t.Context(), req)
			want := "domain proxy-2222222222222222 on host h1 is " + st.String() + " right after its start"
			if provider.Class(err) != provider.ErrTransient || err.Error() != want {
				t.Fatalf("got %v (class %s), want transient %q", err, provider.ClassName(err), want)
			}
			if n := env.fake.Calls("DomainGetState"); n != 1 {
				t.Fatalf("%d state polls, want 1", n)
			}
		})
	}
}

// stuckState is a backend whose domains never leave DomainNostate after a start.
type stuckState struct{ backend }

func (s stuckState) DomainGetState(libvirt.Domain, uint32) (int32, int32, error) {
	return int32(libvirt.DomainNostate), 0, nil
}

func TestCreateWaitForRunningExpires(t *testing.T) {
	env := newTestEnv(t)
	env.p.runningWait = 50 * time.Millisecond
	env.p.hosts.dial = func(ctx context.Context, h provider.KVMHost) (*conn, error) {
		return newConn(h.Name, stuckState{env.fake}, nil), nil
	}
	_, err := env.p.Create(t.Context(), testRequest("proxy-3333333333333333"))
	if provider.Class(err) != provider.ErrTransient || !strings.Contains(err.Error(), "is still DomainNostate 50ms after its start") {
		t.Fatalf("got %v (class %s)", err, provider.ClassName(err))
	}
	if n := env.fake.Calls("DomainCreate"); n != 1 {
		t.Fatalf("DomainCreate called %d times", n)
	}
}

func TestCreateWaitEndsWithContext(t *testing.T) {
	env := newTestEnv(t)
	env.p.runningWait = time.Hour
	env.p.hosts.dial = func(ctx context.Context, h provider.KVMHost) (*conn, error) {
		return newConn(h.Name, stuckState{env.fake}, nil), nil
	}
	ctx, cancel := context.WithCancel(t.Context())
	gate := env.fake.BlockReturn("DomainCreate")
	go func() { <-gate.Entered(); cancel(); gate.Release() }()
	_, err := env.p.Create(ctx, testRequest("proxy-4444444444444444"))
	wantClass(t, err, provider.ErrTransient, context.Canceled)
}

// TestCreateNotFoundIsTransient: a domain or volume vanishing under a Create step is a
// retry, never ErrNotFound, which the contract forbids from Create.
func TestCreateNotFoundIsTransient(t *testing.T) {
	for _, c := range []struct {
		method string
		code   libvirt.ErrorNumber
	}{
		{"StorageVolGetPath", libvirt.ErrNoStorageVol},
		{"StorageVolUpload", libvirt.ErrNoStorageVol},
		{"DomainCreate", libvirt.ErrNoDomain},
		{"DomainGetState", libvirt.ErrNoDomain},
	} {
		t.Run(c.method, func(t *testing.T) {
			env := newTestEnv(t)
			env.fake.FailNext(c.method, libvirtfake.Errorf(c.code, "gone"))
			_, err := env.p.Create(t.Context(), testRequest("proxy-5555555555555555"))
			if provider.Class(err) != provider.ErrTransient || errors.Is(err, provider.ErrNotFound) {
				t.Fatalf("got %v (class %s), want transient only", err, provider.ClassName(err))
			}
			if code, ok := libvirtCode(err); !ok || code != c.code {
				t.Fatalf("error %v lost its libvirt code", err)
			}
		})
	}
}

func TestCreateLibvirtErrorClasses(t *testing.T) {
	for _, c := range []struct {
		method string
		code   libvirt.ErrorNumber
		class  error
	}{
		{"DomainDefineXMLFlags", libvirt.ErrXMLError, provider.ErrPermanent},
		{"DomainCreate", libvirt.ErrNoSupport, provider.ErrPermanent},
		{"StoragePoolLookupByName", libvirt.ErrNoStoragePool, provider.ErrPermanent},
		{"StorageVolCreateXML", libvirt.ErrInvalidArg, provider.ErrPermanent},
		{"DomainLookupByName", libvirt.ErrAccessDenied, provider.ErrPermanent},
		{"StorageVolUpload", libvirt.ErrAuthFailed, provider.ErrPermanent},
		{"DomainCreate", libvirt.ErrOperationInvalid, provider.ErrTransient},
		{"DomainCreate", libvirt.ErrInternalError, provider.ErrTransient},
	} {
		t.Run(c.method+"-"+c.code.String(), func(t *testing.T) {
			env := newTestEnv(t)
			env.fake.FailNext(c.method, libvirtfake.Errorf(c.code, "injected"))
			_, err := env.p.Create(t.Context(), testRequest("proxy-6666666666666666"))
			if provider.Class(err) != c.class {
				t.Fatalf("got %v (class %s), want %s", err, provider.ClassName(err), provider.ClassName(c.class))
			}
			if len(env.logs.find(`"kvm2 backend call failed"`, `"op":"create"`)) != 1 {
				t.Fatalf("want one kvm2 backend call failed line; log:\n%s", strings.Join(env.logs.all(), "\n"))
			}
		})
	}
}

// TestCreateRetryRebuildsSeedAndOverlay: an attempt cut off after the volumes, at the
// definition that replaces its claim, leaves the claim marked building and the volumes;
// the next attempt rebuilds both: the seed may be truncated, and the overlay may hold an
// unfinished boot.
func TestCreateRetryRebuildsSeedAndOverlay(t *testing.T) {
	env := newTestEnv(t)
	f := env.fake
	req := testRequest("proxy-8888888888888888")
	// The claim passes; the definition after the volumes is cut off.
	f.FailNext("DomainDefineXMLFlags", nil)
	f.FailNext("DomainDefineXMLFlags", libvirtfake.Errorf(libvirt.ErrInternalError, "cut off"))
	if _, err := env.p.Create(t.Context(), req); provider.Class(err) != provider.ErrTransient {
		t.Fatalf("first attempt: %v", err)
	}
	if m := markOf(t, f, provider.TypeKVM2, req.Name); !m.Building || m.UID != req.UID {
		t.Fatalf("after the cut-off attempt the claim is marked %+v, want building for %s", m, req.UID)
	}
	// A truncated seed, as an upload cut off mid-way would leave, and an overlay that
	// has booted once over an older base.
	putLeftOvers(t, f, req.Name)
	if _, err := env.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	wantFreshVolumes(t, f, req.Name)
	if m := markOf(t, f, provider.TypeKVM2, req.Name); m.Building {
		t.Fatalf("the finished domain is still marked building: %+v", m)
	}
	if n := len(f.Uploads()); n != 2 {
		t.Fatalf("%d seed uploads, want one per attempt", n)
	}
	if len(env.logs.find(`"kvm2 domain rebuilt: an earlier attempt stopped while building its disks"`)) != 1 {
		t.Fatal("no line saying the claim of an earlier attempt was rebuilt")
	}
}

// TestCreateReplacesVolumesLeftWithoutDomain: volumes of the name with no domain (an
// earlier release created them before its definition and was cut off) are replaced
// under the new claim, never reused.
func TestCreateReplacesVolumesLeftWithoutDomain(t *testing.T) {
	env := newTestEnv(t)
	f := env.fake
	req := testRequest("proxy-8888888888888889")
	putLeftOvers(t, f, req.Name)
	if _, err := env.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	wantFreshVolumes(t, f, req.Name)
	if len(env.logs.find(`"overlay volume created"`, `"replacedLeftOver":true`)) != 1 {
		t.Fatal("no overlay volume created line saying a left-over was replaced")
	}
}

// putLeftOvers places a truncated seed and an overlay that booted over another base for
// vm, as a cut-off attempt leaves them.
func putLeftOvers(t *testing.T, f *libvirtfake.Fake, vm string) {
	t.Helper()
	if err := f.PutVolume(libvirtfake.DefaultPool, libvirtfake.VolumeInfo{Name: seedVolName(vm), Content: []byte("trunc")}); err != nil {
		t.Fatal(err)
	}
	if err := f.PutVolume(libvirtfake.DefaultPool, libvirtfake.VolumeInfo{Name: overlayVolName(vm), Format: "qcow2",
		Content: []byte("old boot"), BackingStore: "/var/lib/libvirt/images/base-debian-12.qcow2", BackingFormat: "qcow2"}); err != nil {
		t.Fatal(err)
	}
}

// wantFreshVolumes checks that vm's seed holds the test user-data and its overlay is a
// new, empty one over the cached base.
func wantFreshVolumes(t *testing.T, f *libvirtfake.Fake, vm string) {
	t.Helper()
	seed, _ := f.Volume(libvirtfake.DefaultPool, seedVolName(vm))
	if got := readISOFile(t, seed.Content, "user-data"); got != testUserData {
		t.Fatalf("seed holds user-data %q", got)
	}
	base, _ := f.Volume(libvirtfake.DefaultPool, imagecache.BaseVolName("debian-13", "qcow2"))
	overlay, _ := f.Volume(libvirtfake.DefaultPool, overlayVolName(vm))
	if overlay.BackingStore != base.Path || len(overlay.Content) != 0 || overlay.XML == "" {
		t.Fatalf("the left-over overlay was kept: %+v", overlay)
	}
}

// TestCreateAndDeleteShareTheNameLock: a Delete waits while a Create of the same name is
// between its steps, and gives up when its context ends first.
func TestCreateAndDeleteShareTheNameLock(t *testing.T) {
	env := newTestEnv(t)
	req := testRequest("proxy-9999999999999999")
	gate := env.fake.Block("DomainDefineXMLFlags")
	done := make(chan error, 1)
	go func() { _, err := env.p.Create(t.Context(), req); done <- err }()
	<-gate.Entered()

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err := env.p.Delete(ctx, ident.ProviderID(fakeHost, req.Name))
	wantClass(t, err, provider.ErrTransient, context.DeadlineExceeded)
	if !strings.Contains(err.Error(), "waiting for the lock on domain "+req.Name) {
		t.Fatalf("delete error %v", err)
	}
	// Another name is not held up.
	if err := env.p.Delete(t.Context(), ident.ProviderID(fakeHost, "proxy-other")); err != nil {
		t.Fatal(err)
	}
	gate.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := env.p.Delete(t.Context(), ident.ProviderID(fakeHost, req.Name)); err != nil {
		t.Fatal(err)
	}
	if _, ok := env.fake.Domain(req.Name); ok {
		t.Fatal("domain survived the delete")
	}
}

// TestCreateLogLines: the steps of a fresh Create at V(1), the resolved parameters and
// the xml at V(2), and never the cloud-init content.
func TestCreateLogLines(t *testing.T) {
	env := newTestEnv(t)
	req := testRequest("proxy-abababababababab")
	if _, err := env.p.Create(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	order := []string{`"kvm2 create resolved"`, `"overlay volume created"`, `"seed volume uploaded"`, `"domain defined"`, `"domain started"`, `"kvm2 domain ensured running"`}
	var mine []string
	for _, l := range env.logs.all() {
		if strings.Contains(l, `"name":"`+req.Name+`"`) && strings.Contains(l, `"host":"h1"`) && strings.Contains(l, `"provider":"kvm2-test"`) {
			mine = append(mine, l)
		}
	}
	i := 0
	for _, l := range mine {
		if i < len(order) && strings.Contains(l, `"msg":`+order[i]) {
			i++
		}
	}
	if i != len(order) {
		t.Fatalf("missing or out of order: %s\nlines:\n%s", order[i], strings.Join(mine, "\n"))
	}
	checks := map[string][]string{
		`"kvm2 create resolved"`:        {`"level":2`, `"pool":"default"`, `"bridge":"br0"`, `"imageVolume":"base-debian-13.qcow2"`, `"firmware":"uefi"`, `"cloudInitBytes":`},
		`"seed volume uploaded"`:        {`"level":1`, `"bytes":`},
		`"domain defined"`:              {`"level":1`, `"uid":"uid-` + req.Name + `"`, `"firmware":"uefi"`, `"xml":"<domain`},
		`"kvm2 domain ensured running"`: {`"level":1`, `"id":`},
	}
	for msg, parts := range checks {
		if len(env.logs.find(append([]string{`"msg":` + msg}, parts...)...)) != 1 {
			t.Errorf("no %s line with %v", msg, parts)
		}
	}
	for _, l := range env.logs.all() {
		if strings.Contains(l, "s3cr3t-user-data") {
			t.Fatalf("cloud-init content in the log: %s", l)
		}
	}
}
