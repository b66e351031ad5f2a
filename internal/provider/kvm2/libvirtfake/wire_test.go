package libvirtfake

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/sshtest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

type dialerFunc func() (net.Conn, error)

func (d dialerFunc) Dial() (net.Conn, error) { return d() }

// connect runs go-libvirt's real client over the dialler and closes it at
// the end of the test.
func connect(t testing.TB, d dialerFunc) *libvirt.Libvirt {
	t.Helper()
	l := libvirt.NewWithDialer(d)
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		t.Fatalf("connecting to the fake: %v", err)
	}
	t.Cleanup(func() {
		if l.IsConnected() {
			_ = l.Disconnect()
		}
	})
	return l
}

// overPipe connects the real client to f over an in-memory pipe.
func overPipe(t testing.TB, f *Fake) *libvirt.Libvirt {
	return connect(t, f.Dial)
}

// overSSH connects the real client to f the way the provider does: an SSH
// connection to the test server and the libvirt socket forwarded through it.
func overSSH(t testing.TB, f *Fake) (*libvirt.Libvirt, *sshtest.Env, *ssh.Client) {
	t.Helper()
	env := sshtest.NewEnv(t, f.ServeConn)
	client, err := env.Dial()
	if err != nil {
		t.Fatalf("ssh dial: %v", err)
	}
	t.Cleanup(func() { _ = client.Close() })
	l := connect(t, func() (net.Conn, error) { return client.Dial("unix", env.Socket) })
	return l, env, client
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRealClientThroughSSH(t *testing.T) {
	f := New()
	l, env, _ := overSSH(t, f)

	if v, err := l.ConnectGetLibVersion(); err != nil || v != DefaultLibVersion {
		t.Fatalf("ConnectGetLibVersion = %d, %v", v, err)
	}

	meta := `<instance xmlns="` + testNS + `"><managed>true</managed><uid>u-1</uid></instance>`
	d, err := l.DomainDefineXMLFlags(domXML("vm1", `<os firmware="efi"/><metadata>`+meta+`</metadata>`), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.DomainCreate(d); err != nil {
		t.Fatal(err)
	}
	looked, err := l.DomainLookupByName("vm1")
	if err != nil || looked.UUID != d.UUID || looked.ID <= 0 {
		t.Fatalf("lookup: %+v, %v", looked, err)
	}
	st, _, err := l.DomainGetState(looked, 0)
	if err != nil || libvirt.DomainState(st) != libvirt.DomainRunning {
		t.Fatalf("state %d, %v", st, err)
	}
	got, err := l.DomainGetMetadata(looked, int32(libvirt.DomainMetadataElement), libvirt.OptString{testNS}, 0)
	want := "<instance>\n  <managed>true</managed>\n  <uid>u-1</uid>\n</instance>"
	if err != nil || got != want {
		t.Fatalf("metadata %q, %v", got, err)
	}

	pool, err := l.StoragePoolLookupByName(DefaultPool)
	if err != nil {
		t.Fatal(err)
	}
	data := randomBytes(t, 20<<20)
	vol, err := l.StorageVolCreateXML(pool, volXML("base.qcow2", "qcow2", uint64(len(data)), ""), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.StorageVolUpload(vol, bytes.NewReader(data), 0, uint64(len(data)), 0); err != nil {
		t.Fatalf("upload: %v", err)
	}
	var out bytes.Buffer
	if err := l.StorageVolDownload(vol, &out, 0, 0, 0); err != nil {
		t.Fatalf("download: %v", err)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("downloaded %d bytes that differ from the %d uploaded", out.Len(), len(data))
	}
	if u := f.Uploads(); len(u) != 1 || u[0].Received != uint64(len(data)) || u[0].Err != nil {
		t.Fatalf("recorded uploads %+v", u)
	}

	f.FailNext("DomainCreate", Errorf(libvirt.ErrOperationFailed, "no firmware found"))
	_ = l.DomainDestroyFlags(looked, 0)
	err = l.DomainCreate(looked)
	var le libvirt.Error
	if !errors.As(err, &le) || le.Code != uint32(libvirt.ErrOperationFailed) || le.Message != "operation failed: no firmware found" {
		t.Fatalf("injected error arrived as %#v", err)
	}
	if _, err := l.DomainLookupByName("nope"); !libvirt.IsNotFound(err) {
		t.Fatalf("missing domain: %v is not libvirt's not-found", err)
	}
	if s := env.Stats(); s.SSHConns != 1 || s.Channels != 1 {
		t.Fatalf("ssh stats %+v", s)
	}
}

func TestEveryBackendMethodOverTheWire(t *testing.T) {
	f := New()
	l := overPipe(t, f)
	if _, err := l.ConnectGetHostname(); err != nil {
		t.Fatal(err)
	}
	pool, _ := l.StoragePoolLookupByName(DefaultPool)
	if _, _, _, _, err := l.StoragePoolGetInfo(pool); err != nil {
		t.Fatal(err)
	}
	seed, err := l.StorageVolCreateXML(pool, volXML("seed.iso", "raw", 3, ""), 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.StorageVolUpload(seed, bytes.NewReader([]byte("iso")), 0, 3, 0)
	_ = l.StoragePoolRefresh(pool, 0)
	seed, _ = l.StorageVolLookupByName(pool, "seed.iso")
	if p, err := l.StorageVolGetPath(seed); err != nil || p != DefaultPoolPath+"/seed.iso" {
		t.Fatalf("path %q, %v", p, err)
	}
	if typ, c, _, err := l.StorageVolGetInfo(seed); err != nil || typ != 0 || c != 3 {
		t.Fatalf("vol info %d %d %v", typ, c, err)
	}
	var buf bytes.Buffer
	if err := l.StorageVolDownload(seed, &buf, 1, 1, 0); err != nil || buf.String() != "s" {
		t.Fatalf("ranged download %q, %v", buf.String(), err)
	}
	_ = l.StorageVolDelete(seed, 0)
	d, _ := l.DomainDefineXMLFlags(domXML("vm1", ""), 0)
	_ = l.DomainCreate(d)
	d, _ = l.DomainLookupByName("vm1")
	_ = f.SetInterfaceAddresses("vm1", libvirt.DomainInterfaceAddressesSrcArp,
		[]libvirt.DomainInterface{Interface("vnet0", "52:54:00:00:00:01", "10.0.0.5/24")}, nil)
	ifaces, err := l.DomainInterfaceAddresses(d, uint32(libvirt.DomainInterfaceAddressesSrcArp), 0)
	if err != nil || len(ifaces) != 1 || ifaces[0].Addrs[0].Addr != "10.0.0.5" || ifaces[0].Hwaddr[0] != "52:54:00:00:00:01" {
		t.Fatalf("interfaces %+v, %v", ifaces, err)
	}
	doms, n, err := l.ConnectListAllDomains(1, libvirt.ConnectListDomainsActive)
	if err != nil || n != 1 || doms[0].Name != "vm1" {
		t.Fatalf("list %+v %d %v", doms, n, err)
	}
	_, _ = l.DomainGetMetadata(d, int32(libvirt.DomainMetadataElement), libvirt.OptString{testNS}, 0)
	_, _, _ = l.DomainGetState(d, 0)
	if err := l.DomainReset(d, 0); err != nil {
		t.Fatalf("reset over the wire: %v", err)
	}
	if got, _ := f.Domain("vm1"); got.Resets != 1 || got.ID != d.ID {
		t.Fatalf("after a reset over the wire: %+v, want one reset with id %d", got, d.ID)
	}
	_ = l.DomainDestroyFlags(d, 0)
	if err := l.DomainUndefineFlags(d, libvirt.DomainUndefineNvram); err != nil {
		t.Fatal(err)
	}
	_, _ = l.ConnectGetLibVersion()
	for _, m := range backendMethods(t) {
		if f.Calls(m) == 0 {
			t.Errorf("%s never reached the fake over the wire", m)
		}
	}
}

func TestErrorsCrossTheWireIntact(t *testing.T) {
	f := New()
	l := overPipe(t, f)
	for _, tc := range []struct {
		inject error
		want   libvirt.Error
	}{
		{Errorf(libvirt.ErrAccessDenied, "'novakj' may not"), Errorf(libvirt.ErrAccessDenied, "'novakj' may not")},
		{errNoMetadata(), Errorf(libvirt.ErrNoDomainMetadata, "Requested metadata element is not present")},
		{errors.New("disk on fire"), Errorf(libvirt.ErrInternalError, "disk on fire")},
	} {
		f.FailNext("ConnectGetHostname", tc.inject)
		_, err := l.ConnectGetHostname()
		var le libvirt.Error
		if !errors.As(err, &le) || le != tc.want {
			t.Errorf("injected %v, client got %#v, want %#v", tc.inject, err, tc.want)
		}
	}
	if _, err := l.ConnectGetSysinfo(0); !errors.Is(err, libvirt.ErrUnsupported) {
		t.Errorf("unimplemented procedure: %v, want go-libvirt's ErrUnsupported", err)
	}
}

func TestConnectOpenFailure(t *testing.T) {
	f := New()
	f.FailNext("ConnectOpen", Errorf(libvirt.ErrAccessDenied, "'qemu:///system' denied"))
	l := libvirt.NewWithDialer(f)
	err := l.ConnectToURI(libvirt.QEMUSystem)
	var le libvirt.Error
	if !errors.As(err, &le) || le.Code != uint32(libvirt.ErrAccessDenied) {
		t.Fatalf("connect: %#v", err)
	}
	testutil.WaitFor(t, waitLong, "the refused connection to close", func() (bool, error) {
		return f.Connections() == 0, fmt.Errorf("%d connections open", f.Connections())
	})
}

func TestConcurrentCallsShareOneConnection(t *testing.T) {
	f := New()
	l := overPipe(t, f)
	errs := make(chan error, 40)
	for i := range 40 {
		go func() {
			name := "vm" + string(rune('a'+i%26)) + string(rune('a'+i/26))
			d, err := l.DomainDefineXMLFlags(domXML(name, ""), 0)
			if err == nil {
				var got libvirt.Domain
				got, err = l.DomainLookupByName(name)
				if err == nil && got.UUID != d.UUID {
					err = errors.New("lookup answered another domain")
				}
			}
			errs <- err
		}()
	}
	for range 40 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := len(f.Domains()); n != 40 {
		t.Fatalf("%d domains defined", n)
	}
}
