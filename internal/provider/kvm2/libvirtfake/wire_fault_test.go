package libvirtfake

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

func TestUploadFailingMidStreamOverTheWire(t *testing.T) {
	f := New()
	l := overPipe(t, f)
	_ = f.SetPoolCapacity(DefaultPool, 3<<20)
	pool, _ := l.StoragePoolLookupByName(DefaultPool)
	vol, err := l.StorageVolCreateXML(pool, volXML("big.qcow2", "qcow2", 8<<20, ""), 0)
	if err != nil {
		t.Fatal(err)
	}
	err = l.StorageVolUpload(vol, bytes.NewReader(make([]byte, 8<<20)), 0, 8<<20, 0)
	var le libvirt.Error
	if !errors.As(err, &le) || le.Code != uint32(libvirt.ErrSystemError) {
		t.Fatalf("upload into a full pool: %#v", err)
	}
	u := f.Uploads()[0]
	if !u.Done || u.Received == 0 || u.Received > 3<<20 {
		t.Fatalf("recorded %+v", u)
	}
	// The connection survives the failed stream.
	if _, err := l.ConnectGetHostname(); err != nil {
		t.Fatalf("next call on the same connection: %v", err)
	}
}

func TestUploadRefusedBeforeDataOverTheWire(t *testing.T) {
	f := New()
	l := overPipe(t, f)
	vol := libvirt.StorageVol{Pool: DefaultPool, Name: "missing", Key: DefaultPoolPath + "/missing"}
	err := l.StorageVolUpload(vol, bytes.NewReader([]byte("data")), 0, 4, 0)
	var le libvirt.Error
	if !errors.As(err, &le) || le.Code != uint32(libvirt.ErrNoStorageVol) {
		t.Fatalf("upload to a missing volume: %#v", err)
	}
	if len(f.Uploads()) != 0 {
		t.Fatal("a refused upload was recorded")
	}
}

type brokenBody struct{ left int }

func (b *brokenBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	n := min(len(p), b.left)
	b.left -= n
	return n, nil
}

// A reader that fails makes go-libvirt abort the stream; the daemon confirms
// the abort, and the call returns the reader's own error instead of hanging.
func TestUploadAbortedByClientOverTheWire(t *testing.T) {
	f := New()
	l := overPipe(t, f)
	pool, _ := l.StoragePoolLookupByName(DefaultPool)
	vol, _ := l.StorageVolCreateXML(pool, volXML("img", "raw", 1<<20, ""), 0)
	err := l.StorageVolUpload(vol, &brokenBody{left: 1000}, 0, 1<<20, 0)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("upload whose reader failed returned %v, want the reader's error", err)
	}
	testutil.WaitFor(t, waitLong, "the aborted upload to be recorded", func() (bool, error) {
		u := f.Uploads()
		return len(u) == 1 && u[0].Done, fmt.Errorf("uploads %+v", u)
	})
	if u := f.Uploads()[0]; u.Err != errClientAbort || u.Received != 1000 {
		t.Fatalf("recorded %+v", u)
	}
	if _, err := l.ConnectGetHostname(); err != nil {
		t.Fatalf("next call on the same connection: %v", err)
	}
}

func TestKilledConnectionInterruptsCallInFlight(t *testing.T) {
	f := New()
	l, env, client := overSSH(t, f)
	d, _ := l.DomainDefineXMLFlags(domXML("vm1", ""), 0)
	g := f.Block("DomainCreate")
	t.Cleanup(g.Release)
	res := make(chan error, 1)
	go func() { res <- l.DomainCreate(d) }()
	<-g.Entered()
	env.KillConnections()
	if err := <-res; err == nil {
		t.Fatal("a call on a killed connection succeeded")
	}
	_ = client.Wait()
	<-l.Disconnected() // go-libvirt notices the socket is gone
	g.Release()
	testutil.WaitFor(t, waitLong, "the fake to drop the connection", func() (bool, error) {
		return f.Connections() == 0, fmt.Errorf("%d connections open", f.Connections())
	})
}

func TestFakeSideKillAndDrop(t *testing.T) {
	f := New()
	l := overPipe(t, f)
	f.DropNext("ConnectGetHostname")
	if _, err := l.ConnectGetHostname(); err == nil {
		t.Fatal("a dropped call succeeded")
	}
	<-l.Disconnected()
	if f.Calls("ConnectGetHostname") != 1 {
		t.Fatal("the dropped call was not counted")
	}

	l2 := overPipe(t, f)
	g := f.Block("ConnectGetLibVersion")
	t.Cleanup(g.Release)
	res := make(chan error, 1)
	go func() {
		_, err := l2.ConnectGetLibVersion()
		res <- err
	}()
	<-g.Entered()
	f.KillConnections()
	if err := <-res; err == nil {
		t.Fatal("a call on a killed connection succeeded")
	}
	g.Release()
}

func TestBlockReturnStallsTheReply(t *testing.T) {
	f := New()
	l := overPipe(t, f)
	g := f.BlockReturn("DomainDefineXMLFlags")
	t.Cleanup(g.Release)
	res := make(chan error, 1)
	go func() {
		_, err := l.DomainDefineXMLFlags(domXML("vm1", ""), 0)
		res <- err
	}()
	<-g.Entered()
	if _, ok := f.Domain("vm1"); !ok {
		t.Fatal("the stalled define had not taken effect")
	}
	select {
	case err := <-res:
		t.Fatalf("the client got its reply while it was held: %v", err)
	default:
	}
	g.Release()
	if err := <-res; err != nil {
		t.Fatal(err)
	}
}

// gatedBody yields first, then blocks in Read until release is closed, then
// reports EOF.
type gatedBody struct {
	first   []byte
	release chan struct{}
	parked  chan struct{} // closed when Read blocks
	resumed chan struct{} // closed when a blocked Read returns
}

func (g *gatedBody) Read(p []byte) (int, error) {
	if len(g.first) > 0 {
		n := copy(p, g.first)
		g.first = g.first[n:]
		return n, nil
	}
	close(g.parked)
	<-g.release
	close(g.resumed)
	return 0, io.EOF
}

// What go-libvirt at the pinned version does when the daemon fails an
// upload while the body is stalled: StorageVolUpload returns the daemon's
// error at once, but its stream sender stays parked in the body's Read
// until that returns; then it sees the abort and exits (the buffered
// channels let it go). goleak in TestMain checks that it is gone.
func TestUploadSenderOutlivesTheCallWhileTheBodyBlocks(t *testing.T) {
	f := New()
	l := overPipe(t, f)
	_ = f.SetPoolCapacity(DefaultPool, 1<<20)
	pool, _ := l.StoragePoolLookupByName(DefaultPool)
	vol, err := l.StorageVolCreateXML(pool, volXML("img.qcow2", "qcow2", 8<<20, ""), 0)
	if err != nil {
		t.Fatal(err)
	}
	body := &gatedBody{first: make([]byte, 2<<20), release: make(chan struct{}),
		parked: make(chan struct{}), resumed: make(chan struct{})}
	err = l.StorageVolUpload(vol, body, 0, 8<<20, 0)
	var le libvirt.Error
	if !errors.As(err, &le) || le.Code != uint32(libvirt.ErrSystemError) {
		t.Fatalf("upload into a full pool: %#v", err)
	}
	<-body.parked // the sender is still in Read after the call returned
	select {
	case <-body.resumed:
		t.Fatal("the body was released before the test released it")
	default:
	}
	close(body.release)
	<-body.resumed
	if _, err := l.ConnectGetHostname(); err != nil {
		t.Fatalf("next call on the same connection: %v", err)
	}
}
