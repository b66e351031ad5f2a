package kvm2

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

func TestImageUploadOverSSH(t *testing.T) {
	e := newTestEnv(t, withImageServer(nil), withTestHost("img"), withSSH())
	if _, err := e.create("vm-a"); err != nil {
		t.Fatal(err)
	}
	e.wantCached(t)
	ups := e.baseUploads()
	if len(ups) != 1 || ups[0].Received != testImageSize || ups[0].Err != nil {
		t.Fatalf("base uploads %+v", ups)
	}
	// The upload had an SSH connection of its own, closed once it was done; the pooled
	// one stays.
	testutil.WaitFor(t, waitLong, "the upload's SSH connection to close", func() (bool, error) {
		st := e.ssh.Stats()
		return st.SSHConns == 2 && st.OpenSSHConns == 1, fmt.Errorf("%d SSH connections made, %d open", st.SSHConns, st.OpenSSHConns)
	})
	if e.fake.Connections() != 1 {
		t.Fatalf("%d libvirt connections left open, want the pooled one", e.fake.Connections())
	}
}

func TestImageFailingBodyOverSSH(t *testing.T) {
	for _, tc := range []struct{ mode, msg string }{
		{mode: serveShort, msg: "unexpected EOF"},
		{mode: serveStall, msg: "context deadline exceeded"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			e := newTestEnv(t, withImageServer(nil), withTestHost("img"), withSSH())
			e.p.images.Download = 1500 * time.Millisecond
			e.srv.setMode(tc.mode)
			_, err := e.create("vm-a")
			wantClass(t, err, provider.ErrTransient, nil)
			want := fmt.Sprintf("the body ended after %d of %d bytes: %s", testImageSize/2, testImageSize, tc.msg)
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not say %q", err, want)
			}
			// go-libvirt saw a clean end of stream, so its upload returned and its sender
			// finished: the daemon recorded a finished upload without error.
			ups := e.baseUploads()
			if len(ups) != 1 || !ups[0].Done || ups[0].Err != nil || ups[0].Received != testImageSize/2 {
				t.Fatalf("base uploads %+v", ups)
			}
			e.wantNotCached(t)
			// The next attempt, with the mirror fixed, fetches the image within the
			// usual budget.
			e.srv.setMode(serveOK)
			e.p.images.Download = 0
			if _, err := e.create("vm-a"); err != nil {
				t.Fatal(err)
			}
			e.wantCached(t)
			if _, ok := e.fake.Volume(libvirtfake.DefaultPool, overlayVolName("vm-a")); !ok {
				t.Fatal("no overlay after the retry")
			}
		})
	}
}
