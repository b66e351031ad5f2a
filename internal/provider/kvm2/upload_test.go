package kvm2

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// What go-libvirt's StorageVolUpload does at the pinned version when a stream goes wrong.
// Its stream sender is a goroutine running socket.(*Socket).SendStream; these tests
// watch for it.

// senders counts goroutines inside go-libvirt's stream sender.
func senders() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "(*Socket).SendStream(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// uploadVolume creates an empty raw volume of size bytes in a pool of its own holding
// free bytes, and returns the host's pooled backend with it.
func uploadVolume(t *testing.T, e *testEnv, size, free uint64) (backend, libvirt.StorageVol) {
	t.Helper()
	e.fake.AddPool("uploads", "/srv/uploads", free)
	b := must(e.hs.pooled(context.Background(), e.host))
	pool := must(b.StoragePoolLookupByName("uploads"))
	vol, err := b.StorageVolCreateXML(pool, rawVolumeXMLForTest("v.raw", size), 0)
	if err != nil {
		t.Fatal(err)
	}
	return b, vol
}

func rawVolumeXMLForTest(name string, size uint64) string {
	return "<volume><name>" + name + "</name><capacity unit=\"bytes\">" + strconv.FormatUint(size, 10) +
		"</capacity><allocation unit=\"bytes\">0</allocation><target><format type=\"raw\"/></target></volume>"
}

// The daemon failing part way (here: the pool fills up) ends the call with the daemon's
// error, and the sender goroutine exits: abort and outErr are buffered at this version,
// so neither side parks on a channel nobody reads.
func TestUploadDaemonFailureLeavesNoSender(t *testing.T) {
	e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(0))
	const size = 32 << 20
	b, vol := uploadVolume(t, e, size, 1<<20)
	err := b.StorageVolUpload(vol, bytes.NewReader(make([]byte, size)), 0, size, 0)
	if err == nil {
		t.Fatal("an upload larger than the pool succeeded")
	}
	if _, ok := libvirtCode(err); !ok {
		t.Fatalf("error %v does not carry the daemon's libvirt error", err)
	}
	testutil.WaitFor(t, waitLong, "the stream sender to exit", func() (bool, error) {
		n := senders()
		return n == 0, fmt.Errorf("%d stream senders running", n)
	})
	if _, err := b.ConnectGetHostname(); err != nil {
		t.Fatalf("connection unusable after a failed upload: %v", err)
	}
}

// A reader error aborts the stream and the call returns without wedging. The daemon
// confirms an abort like a finish, so go-libvirt hands back the reader's own error, taken
// from the sender through the buffered outErr; the sender has exited by then.
func TestUploadReaderErrorEndsTheCall(t *testing.T) {
	e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(0))
	const size = 8 << 20
	b, vol := uploadVolume(t, e, size, 1<<30)
	mirror := errors.New("mirror closed the connection")
	r := io.MultiReader(bytes.NewReader(make([]byte, 1<<20)), errReader{mirror})
	if err := b.StorageVolUpload(vol, r, 0, size, 0); !errors.Is(err, mirror) {
		t.Fatalf("got %v, want the reader's error", err)
	}
	testutil.WaitFor(t, waitLong, "the stream sender to exit", func() (bool, error) {
		n := senders()
		return n == 0, fmt.Errorf("%d stream senders running", n)
	})
	if _, err := b.ConnectGetHostname(); err != nil {
		t.Fatalf("connection unusable after an aborted upload: %v", err)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// A reader that blocks pins the sender for as long as it blocks: abandoning the call and
// killing the connection return the caller at once, but the sender sits in Read, with
// its buffer, until the reader returns.
func TestUploadBlockedReaderPinsSenderUntilItReturns(t *testing.T) {
	e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(0))
	e.hs.budgets.smallUpload = 100 * time.Millisecond
	b, vol := uploadVolume(t, e, 1<<20, 1<<30)
	r := &blockingReader{release: make(chan struct{}), reading: make(chan struct{})}
	err := b.StorageVolUpload(vol, r, 0, 1<<20, 0)
	wantClass(t, err, provider.ErrTransient, context.DeadlineExceeded)
	if e.pooledConn().alive() {
		t.Fatal("the abandoned upload's connection is still in use")
	}
	<-r.reading
	if n := senders(); n != 1 {
		t.Fatalf("%d stream senders while the reader blocks, want 1", n)
	}
	close(r.release)
	testutil.WaitFor(t, waitLong, "the sender to exit once the reader returned", func() (bool, error) {
		n := senders()
		return n == 0, fmt.Errorf("%d stream senders running", n)
	})
}

type blockingReader struct {
	release chan struct{}
	reading chan struct{}
	once    bool
}

func (r *blockingReader) Read([]byte) (int, error) {
	if !r.once {
		r.once = true
		close(r.reading)
	}
	<-r.release
	return 0, io.EOF
}
