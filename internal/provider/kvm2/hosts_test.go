package kvm2

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

func TestPooledSharesOneConnection(t *testing.T) {
	e := newTestEnv(t, withHosts("h1", "h2"))
	hs, d := e.hs, e.d
	d.hold = make(chan struct{})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			b, err := hs.pooled(ctx, "h1")
			if err == nil {
				_, err = b.ConnectGetHostname()
			}
			errs[i] = err
		})
	}
	testutil.WaitFor(t, waitLong, "the first dial to start", func() (bool, error) {
		return d.dials.Load() == 1, fmt.Errorf("%d dials", d.dials.Load())
	})
	close(d.hold)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials for one host, want 1 shared by every caller", n)
	}
	if _, err := hs.pooled(ctx, "h2"); err != nil {
		t.Fatal(err)
	}
	if n := d.dials.Load(); n != 2 {
		t.Fatalf("%d dials after a second host, want 2 (one per host)", n)
	}
}

func TestPooledWaitEndsWithCallerContext(t *testing.T) {
	e := newTestEnv(t)
	hs, d := e.hs, e.d
	d.hold = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := hs.pooled(ctx, "h1")
		done <- err
	}()
	testutil.WaitFor(t, waitLong, "the dial to start", func() (bool, error) {
		return d.dials.Load() == 1, fmt.Errorf("%d dials", d.dials.Load())
	})
	cancel()
	wantClass(t, <-done, provider.ErrTransient, context.Canceled)
	// The dial itself was not the caller's: it goes on and the next caller uses it.
	close(d.hold)
	if _, err := hs.pooled(context.Background(), "h1"); err != nil {
		t.Fatal(err)
	}
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials, want the abandoned waiter's dial to be reused", n)
	}
}

func TestPooledSharesDialErrorThenRedials(t *testing.T) {
	e := newTestEnv(t)
	hs, d := e.hs, e.d
	d.err = provider.Permanent(errors.New("ssh: unable to authenticate"))
	if _, err := hs.pooled(context.Background(), "h1"); provider.Class(err) != provider.ErrPermanent {
		t.Fatalf("got %v, want the dial's permanent error", err)
	}
	d.err = nil
	if _, err := hs.pooled(context.Background(), "h1"); err != nil {
		t.Fatalf("after the cause went away: %v", err)
	}
	if n := d.dials.Load(); n != 2 {
		t.Fatalf("%d dials, want a failed dial not to be cached", n)
	}
}

func TestPooledUnknownHostIsPermanent(t *testing.T) {
	e := newTestEnv(t)
	hs := e.hs
	_, err := hs.pooled(context.Background(), "nope")
	wantClass(t, err, provider.ErrPermanent, nil)
	if !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("error %q does not name the host", err)
	}
}

func TestCallOverBudgetKillsConnectionAndNextCallRedials(t *testing.T) {
	e := newTestEnv(t)
	f, hs, d := e.fake, e.hs, e.d
	hs.budgets.rpc = 20 * time.Millisecond
	gate := f.Block("DomainLookupByName")
	t.Cleanup(gate.Release)
	b := must(hs.pooled(context.Background(), "h1"))
	_, err := b.DomainLookupByName("proxy-1")
	wantClass(t, err, provider.ErrTransient, context.DeadlineExceeded)
	for _, want := range []string{"DomainLookupByName", "h1", "budget"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if c := d.conn(0); !c.closed.Load() || c.alive() {
		t.Fatal("the connection under an abandoned call was not killed")
	}
	gate.Release()
	b = must(hs.pooled(context.Background(), "h1"))
	if _, err := b.ConnectGetHostname(); err != nil {
		t.Fatal(err)
	}
	if n := d.dials.Load(); n != 2 {
		t.Fatalf("%d dials, want a redial after the kill", n)
	}
}

func TestCallCancelledKillsConnection(t *testing.T) {
	e := newTestEnv(t)
	f, hs, d := e.fake, e.hs, e.d
	gate := f.Block("DomainCreate")
	t.Cleanup(gate.Release)
	ctx, cancel := context.WithCancel(context.Background())
	b := must(hs.pooled(ctx, "h1"))
	done := make(chan error, 1)
	go func() { done <- b.DomainCreate(must(f.DomainDefineXMLFlags(minimalDomainXML("proxy-1"), 0))) }()
	<-gate.Entered()
	cancel()
	wantClass(t, <-done, provider.ErrTransient, context.Canceled)
	if c := d.conn(0); !c.closed.Load() {
		t.Fatal("a cancelled call left its connection open")
	}
}

func TestCallWithEndedContextDoesNotStartOrKill(t *testing.T) {
	e := newTestEnv(t)
	f, hs, d := e.fake, e.hs, e.d
	b := must(hs.pooled(context.Background(), "h1"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	bc := hs.wrap(ctx, d.conn(0).conn)
	_, err := bc.ConnectGetHostname()
	wantClass(t, err, provider.ErrTransient, context.Canceled)
	if f.Calls("ConnectGetHostname") != 0 {
		t.Error("a call was started for an ended context")
	}
	if _, err := b.ConnectGetHostname(); err != nil || d.conn(0).closed.Load() {
		t.Fatalf("the connection was disturbed: %v", err)
	}
}

func TestBudgetsPerMethod(t *testing.T) {
	if got := defaultBudgets.upload(smallUploadLimit); got != 60*time.Second {
		t.Errorf("16 MiB upload budget %s, want 60s", got)
	}
	if got := defaultBudgets.upload(smallUploadLimit + 1); got != 20*time.Minute {
		t.Errorf("image upload budget %s, want 20m", got)
	}
	e := newTestEnv(t)
	f, hs := e.fake, e.hs
	hs.budgets.domainCreate = 20 * time.Millisecond
	dom := must(f.DomainDefineXMLFlags(minimalDomainXML("proxy-1"), 0))
	gate := f.Block("DomainCreate")
	t.Cleanup(gate.Release)
	err := must(hs.pooled(context.Background(), "h1")).DomainCreate(dom)
	wantClass(t, err, provider.ErrTransient, context.DeadlineExceeded)
	if !strings.Contains(err.Error(), "20ms budget") {
		t.Errorf("DomainCreate did not run under its own budget: %v", err)
	}
}

func TestDialFreshIsItsOwnConnection(t *testing.T) {
	e := newTestEnv(t)
	f, hs, d := e.fake, e.hs, e.d
	pooled := must(hs.pooled(context.Background(), "h1"))
	ctx, cancel := context.WithCancel(context.Background())
	fresh, closeFn, err := hs.dialFresh(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	gate := f.Block("StoragePoolGetInfo")
	t.Cleanup(gate.Release)
	done := make(chan error, 1)
	go func() {
		_, _, _, _, err := fresh.StoragePoolGetInfo(must(f.StoragePoolLookupByName("default")))
		done <- err
	}()
	<-gate.Entered()
	cancel()
	wantClass(t, <-done, provider.ErrTransient, context.Canceled)
	gate.Release()
	if !d.conn(1).closed.Load() {
		t.Fatal("the fresh connection was not killed")
	}
	if d.conn(0).closed.Load() {
		t.Fatal("cancelling a fresh connection's call killed the pooled one")
	}
	if _, err := pooled.ConnectGetHostname(); err != nil {
		t.Fatal(err)
	}
}

func TestWatchKillsOnKeepaliveFailureAndDisconnect(t *testing.T) {
	b := budgets{keepaliveInterval: time.Millisecond, keepaliveTimeout: 10 * time.Millisecond}
	cases := []struct {
		name         string
		ping         func(c *conn) error
		disconnected bool
	}{
		{name: "keepalive error", ping: func(*conn) error { return errors.New("eof") }},
		// A request on a link that is gone blocks until the connection is killed.
		{name: "keepalive unanswered", ping: func(c *conn) error { <-c.done; return errors.New("closed") }},
		{name: "libvirt disconnected", ping: func(*conn) error { return nil }, disconnected: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mc := &memConn{}
			mc.conn = newConn("h1", nil, mc)
			disc := make(chan struct{})
			if tc.disconnected {
				close(disc)
			}
			mc.watch(discardLog(), disc, func() error { return tc.ping(mc.conn) }, b)
			if mc.alive() || !mc.closed.Load() {
				t.Fatal("watch returned without killing the connection")
			}
		})
	}
	t.Run("answered keepalives keep it", func(t *testing.T) {
		mc := &memConn{}
		mc.conn = newConn("h1", nil, mc)
		pings := make(chan struct{}, 3)
		ping := func() error {
			select {
			case pings <- struct{}{}:
			default:
			}
			return nil
		}
		returned := make(chan struct{})
		go func() { mc.watch(discardLog(), make(chan struct{}), ping, b); close(returned) }()
		for range 3 {
			<-pings
		}
		if !mc.alive() {
			t.Fatal("answered keepalives killed the connection")
		}
		mc.kill()
		<-returned
	})
}

func TestCloseClosesPooledConnections(t *testing.T) {
	e := newTestEnv(t, withHosts("h1", "h2"))
	hs, d := e.hs, e.d
	must(hs.pooled(context.Background(), "h1"))
	must(hs.pooled(context.Background(), "h2"))
	if err := hs.close(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if !d.conn(i).closed.Load() {
			t.Errorf("connection %d still open after close", i)
		}
	}
	_, err := hs.pooled(context.Background(), "h1")
	wantClass(t, err, provider.ErrTransient, nil)
}

// minimalDomainXML is a domain the in-memory libvirt accepts.
func minimalDomainXML(name string) string {
	return `<domain type="kvm"><name>` + name + `</name><memory unit="MiB">64</memory><vcpu>1</vcpu>` +
		`<os><type arch="x86_64" machine="q35">hvm</type></os></domain>`
}
