//go:build integration

package kvm2

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// What real libvirtd does with an upload whose body fails, as go-libvirt at the pinned
// version sees it: the call returns the body's own error (libvirtd confirms the abort
// instead of answering with an error of its own), the stream sender exits, and the
// connection stays usable. The in-process fake models the same; this checks the model.
func TestKVM2UploadReaderError_realHost(t *testing.T) {
	h := itLoadRealHost(t)
	cfg := provider.KVMConfig{SSHKeyFile: h.key, KnownHostsFile: h.knownHosts,
		Hosts: []provider.KVMHost{h.kvmHost(integrationHost)}}.WithDefaults()
	hs, err := newHosts("it-stream", cfg, discardLog())
	if err != nil {
		t.Fatal(err)
	}
	defer hs.close()
	ctx := context.Background()
	b, err := hs.pooled(ctx, integrationHost)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := b.StoragePoolLookupByName(h.pool)
	if err != nil {
		t.Fatal(err)
	}
	const size = 8 << 20
	vol, err := b.StorageVolCreateXML(pool, rawVolumeXMLForTest(itNewNames("stream").token+".raw", size), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.StorageVolDelete(vol, 0); err != nil {
			t.Errorf("removing %s: %v", vol.Name, err)
		}
	}()
	mirror := errors.New("mirror closed the connection")
	r := io.MultiReader(bytes.NewReader(make([]byte, 1<<20)), errReader{mirror})
	err = b.StorageVolUpload(vol, r, 0, size, 0)
	t.Logf("upload with a failing body returned: %v", err)
	if !errors.Is(err, mirror) {
		t.Fatalf("got %v, want the body's own error", err)
	}
	testutil.WaitFor(t, waitLong, "the stream sender to exit", func() (bool, error) {
		n := senders()
		return n == 0, fmt.Errorf("%d stream senders running", n)
	})
	if _, err := b.ConnectGetHostname(); err != nil {
		t.Fatalf("connection unusable after an aborted upload: %v", err)
	}
}
