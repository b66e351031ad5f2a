package kvm2

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// testBudgets are budgets short enough that a test waiting one out takes milliseconds,
// and long enough that a call that should pass does under -race on a busy machine.
var testBudgets = budgets{
	dial:              5 * time.Second,
	rpc:               5 * time.Second,
	domainCreate:      5 * time.Second,
	smallUpload:       5 * time.Second,
	transfer:          5 * time.Second,
	closeConn:         2 * time.Second,
	keepaliveInterval: time.Hour,
	keepaliveTimeout:  time.Hour,
}

// testHostConfig is a config with one host per name; the credential files do not exist.
func testHostConfig(names ...string) provider.KVMConfig {
	cfg := provider.KVMConfig{SSHKeyFile: "/nonexistent/id", KnownHostsFile: "/nonexistent/known_hosts"}
	for _, n := range names {
		cfg.Hosts = append(cfg.Hosts, provider.KVMHost{Name: n, Address: n + ":22", User: "operator", Bridge: "br0"})
	}
	return cfg.WithDefaults()
}

// memDialer "dials" a host's in-memory libvirt: the connection is real in everything but
// the wire, and its TCP connection is a closer that records being closed.
type memDialer struct {
	fakes map[string]*libvirtfake.Fake // by host name
	dials atomic.Int32
	hold  chan struct{} // when set, a dial waits for it to close (or for its ctx)
	err   error

	mu    sync.Mutex
	conns []*memConn
}

type memConn struct {
	*conn
	closed atomic.Bool
}

func (m *memConn) Close() error { m.closed.Store(true); return nil }

func (d *memDialer) dial(ctx context.Context, h provider.KVMHost) (*conn, error) {
	d.dials.Add(1)
	if d.hold != nil {
		select {
		case <-d.hold:
		case <-ctx.Done():
			return nil, provider.Transient(ctx.Err())
		}
	}
	if d.err != nil {
		return nil, d.err
	}
	mc := &memConn{}
	mc.conn = newConn(h.Name, d.fakes[h.Name], mc)
	d.mu.Lock()
	d.conns = append(d.conns, mc)
	d.mu.Unlock()
	return mc.conn, nil
}

func (d *memDialer) conn(i int) *memConn {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.conns[i]
}

// waitLong is the deadline of a wait on an in-process condition (testutil.WaitFor): one
// that only a broken test reaches.
const waitLong = testutil.WaitLong

// wantClass fails unless err carries class and wraps cause (when cause is not nil).
func wantClass(t testing.TB, err, class, cause error) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v", class)
	}
	if provider.Class(err) != class {
		t.Fatalf("error %q has class %v, want %v", err, provider.Class(err), class)
	}
	if cause != nil && !errors.Is(err, cause) {
		t.Fatalf("error %q does not wrap %v", err, cause)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("unexpected error: %v", err))
	}
	return v
}

func discardLog() logr.Logger { return logr.Discard() }
