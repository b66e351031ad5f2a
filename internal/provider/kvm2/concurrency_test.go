package kvm2

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// A cancelled call kills the pooled connection under it: every other call in flight on
// that connection fails once with ErrTransient, and its retry succeeds on a new
// connection. Connections of their own (uploads, checks) are not affected.
func TestCancelledCallDropsOnlyThePooledConnection(t *testing.T) {
	e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(0))
	ctx := context.Background()
	fresh, closeFresh, err := e.hs.dialFresh(ctx, e.host)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFresh()
	pool := must(must(e.hs.pooled(ctx, e.host)).StoragePoolLookupByName("default"))

	refresh := e.fake.Block("StoragePoolRefresh")
	list := e.fake.Block("ConnectListAllDomains")
	defer refresh.Release()
	defer list.Release()

	cancelCtx, cancel := context.WithCancel(ctx)
	cancelled := make(chan error, 1)
	go func() { cancelled <- must(e.hs.pooled(cancelCtx, e.host)).StoragePoolRefresh(pool, 0) }()
	var wg sync.WaitGroup
	bystanders := make([]error, 2)
	for i := range bystanders {
		wg.Go(func() {
			_, _, err := must(e.hs.pooled(ctx, e.host)).ConnectListAllDomains(1, libvirt.ConnectListDomainsActive)
			bystanders[i] = err
		})
	}
	<-refresh.Entered()
	testutil.WaitFor(t, waitLong, "both bystanders in flight", func() (bool, error) {
		return list.Waiting() == 2, fmt.Errorf("%d calls held", list.Waiting())
	})

	cancel()
	wantClass(t, <-cancelled, provider.ErrTransient, context.Canceled)
	wg.Wait()
	for i, err := range bystanders {
		if err == nil {
			t.Fatalf("bystander %d succeeded on a killed connection", i)
		}
		wantClass(t, classify(err), provider.ErrTransient, nil)
	}
	refresh.Release()
	list.Release()

	for i := range bystanders {
		if _, _, err := must(e.hs.pooled(ctx, e.host)).ConnectListAllDomains(1, libvirt.ConnectListDomainsActive); err != nil {
			t.Fatalf("bystander %d retry: %v", i, err)
		}
	}
	if _, err := fresh.ConnectGetHostname(); err != nil {
		t.Fatalf("the dedicated connection was hit too: %v", err)
	}
	if n := e.ssh.Stats().SSHConns; n != 3 {
		t.Fatalf("%d SSH connections, want 3: dedicated, pooled, one redial shared by both retries", n)
	}
}
