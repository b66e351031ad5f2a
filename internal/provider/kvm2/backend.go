package kvm2

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
)

// backend is the seam between the provider and libvirt: exactly the libvirt calls the
// provider makes, with go-libvirt's own signatures and types. The production
// implementation is go-libvirt over a forwarded unix socket; tests use an in-memory
// libvirt behind the same interface, and the observe decorator wraps either.
type backend interface {
	ConnectGetLibVersion() (uint64, error)
	ConnectGetHostname() (string, error)
	ConnectListAllDomains(needResults int32, flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, uint32, error)

	// The pool and volume calls the image cache makes (lookup, info and refresh of the
	// pool; lookup, create, path, delete, upload and download of a volume), and the one
	// volume call only the provider makes.
	imagecache.Storage
	StorageVolGetInfo(vol libvirt.StorageVol) (typ int8, capacity, allocation uint64, err error)

	DomainLookupByName(name string) (libvirt.Domain, error)
	DomainDefineXMLFlags(xml string, flags libvirt.DomainDefineFlags) (libvirt.Domain, error)
	DomainCreate(dom libvirt.Domain) error
	DomainGetState(dom libvirt.Domain, flags uint32) (state int32, reason int32, err error)
	DomainGetMetadata(dom libvirt.Domain, typ int32, uri libvirt.OptString, flags libvirt.DomainModificationImpact) (string, error)
	DomainInterfaceAddresses(dom libvirt.Domain, source uint32, flags uint32) ([]libvirt.DomainInterface, error)
	DomainDestroyFlags(dom libvirt.Domain, flags libvirt.DomainDestroyFlagsValues) error
	DomainReset(dom libvirt.Domain, flags uint32) error
	DomainUndefineFlags(dom libvirt.Domain, flags libvirt.DomainUndefineFlagsValues) error
}

// *libvirt.Libvirt is the production backend.
var _ backend = (*libvirt.Libvirt)(nil)

// budgets are the time limits of the calls into libvirt. No caller puts a deadline on its
// context, so every call carries its own; the caller's context may still end it earlier.
type budgets struct {
	dial         time.Duration // TCP connect, SSH handshake and libvirt connect together
	rpc          time.Duration // every RPC without a budget of its own
	domainCreate time.Duration // DomainCreate: libvirt starts QEMU synchronously
	smallUpload  time.Duration // StorageVolUpload of at most smallUploadLimit bytes
	transfer     time.Duration // larger uploads and every StorageVolDownload
	closeConn    time.Duration // the courtesy ConnectClose before a connection is closed

	keepaliveInterval time.Duration // between keepalive@openssh.com requests
	keepaliveTimeout  time.Duration // wait for a keepalive reply before the link is dead
}

// smallUploadLimit separates the seed and marker uploads from image uploads.
const smallUploadLimit = 16 << 20

var defaultBudgets = budgets{
	dial:              10 * time.Second,
	rpc:               30 * time.Second,
	domainCreate:      90 * time.Second,
	smallUpload:       60 * time.Second,
	transfer:          20 * time.Minute,
	closeConn:         5 * time.Second,
	keepaliveInterval: 15 * time.Second,
	keepaliveTimeout:  15 * time.Second,
}

// upload is the budget of a StorageVolUpload of length bytes.
func (b budgets) upload(length uint64) time.Duration {
	if length <= smallUploadLimit {
		return b.smallUpload
	}
	return b.transfer
}

// call runs fn, one blocking go-libvirt call on c, within budget and the life of ctx.
// go-libvirt takes no context, so the only way to give up on a call is to take the
// connection away from under it: when ctx ends or the budget runs out, c is marked dead
// (so the next caller redials) and then killed by closing its TCP connection. Both steps are
// lock-free, so neither can queue behind a write stuck on a host that has gone away. The
// call in flight, and every other call on c, then fails on its own; this caller returns at
// once with ErrTransient wrapping the context or deadline error.
func call[T any](ctx context.Context, c *conn, method string, budget time.Duration, fn func() (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, provider.Transient(fmt.Errorf("libvirt %s on host %s not started: %w", method, c.host, err))
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn()
		done <- result{v, err}
	}()
	timer := time.NewTimer(budget)
	defer timer.Stop()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		c.kill()
		return zero, provider.Transient(fmt.Errorf("libvirt %s on host %s abandoned: %w", method, c.host, ctx.Err()))
	case <-timer.C:
		c.kill()
		return zero, provider.Transient(fmt.Errorf("libvirt %s on host %s exceeded its %s budget: %w",
			method, c.host, budget, context.DeadlineExceeded))
	}
}

// call0 is call for the methods that return only an error.
func call0(ctx context.Context, c *conn, method string, budget time.Duration, fn func() error) error {
	_, err := call(ctx, c, method, budget, func() (struct{}, error) { return struct{}{}, fn() })
	return err
}

// bound is a connection's backend tied to one caller's context: every method runs under
// call with its budget, so ending the context abandons the call in flight.
type bound struct {
	ctx context.Context
	c   *conn
	b   budgets
}

var _ backend = (*bound)(nil)

func (x *bound) ConnectGetLibVersion() (uint64, error) {
	return call(x.ctx, x.c, "ConnectGetLibVersion", x.b.rpc, x.c.be.ConnectGetLibVersion)
}

func (x *bound) ConnectGetHostname() (string, error) {
	return call(x.ctx, x.c, "ConnectGetHostname", x.b.rpc, x.c.be.ConnectGetHostname)
}

func (x *bound) ConnectListAllDomains(need int32, flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, uint32, error) {
	type out struct {
		doms []libvirt.Domain
		n    uint32
	}
	r, err := call(x.ctx, x.c, "ConnectListAllDomains", x.b.rpc, func() (out, error) {
		doms, n, err := x.c.be.ConnectListAllDomains(need, flags)
		return out{doms, n}, err
	})
	return r.doms, r.n, err
}

func (x *bound) StoragePoolLookupByName(name string) (libvirt.StoragePool, error) {
	return call(x.ctx, x.c, "StoragePoolLookupByName", x.b.rpc, func() (libvirt.StoragePool, error) {
		return x.c.be.StoragePoolLookupByName(name)
	})
}

func (x *bound) StoragePoolGetInfo(pool libvirt.StoragePool) (uint8, uint64, uint64, uint64, error) {
	type out struct {
		state                           uint8
		capacity, allocation, available uint64
	}
	r, err := call(x.ctx, x.c, "StoragePoolGetInfo", x.b.rpc, func() (out, error) {
		s, c, a, v, err := x.c.be.StoragePoolGetInfo(pool)
		return out{s, c, a, v}, err
	})
	return r.state, r.capacity, r.allocation, r.available, err
}

func (x *bound) StoragePoolRefresh(pool libvirt.StoragePool, flags uint32) error {
	return call0(x.ctx, x.c, "StoragePoolRefresh", x.b.rpc, func() error {
		return x.c.be.StoragePoolRefresh(pool, flags)
	})
}

func (x *bound) StorageVolLookupByName(pool libvirt.StoragePool, name string) (libvirt.StorageVol, error) {
	return call(x.ctx, x.c, "StorageVolLookupByName", x.b.rpc, func() (libvirt.StorageVol, error) {
		return x.c.be.StorageVolLookupByName(pool, name)
	})
}

func (x *bound) StorageVolCreateXML(pool libvirt.StoragePool, xml string, flags libvirt.StorageVolCreateFlags) (libvirt.StorageVol, error) {
	return call(x.ctx, x.c, "StorageVolCreateXML", x.b.rpc, func() (libvirt.StorageVol, error) {
		return x.c.be.StorageVolCreateXML(pool, xml, flags)
	})
}

func (x *bound) StorageVolGetPath(vol libvirt.StorageVol) (string, error) {
	return call(x.ctx, x.c, "StorageVolGetPath", x.b.rpc, func() (string, error) {
		return x.c.be.StorageVolGetPath(vol)
	})
}

func (x *bound) StorageVolGetInfo(vol libvirt.StorageVol) (int8, uint64, uint64, error) {
	type out struct {
		typ                  int8
		capacity, allocation uint64
	}
	r, err := call(x.ctx, x.c, "StorageVolGetInfo", x.b.rpc, func() (out, error) {
		t, c, a, err := x.c.be.StorageVolGetInfo(vol)
		return out{t, c, a}, err
	})
	return r.typ, r.capacity, r.allocation, err
}

func (x *bound) StorageVolDelete(vol libvirt.StorageVol, flags libvirt.StorageVolDeleteFlags) error {
	return call0(x.ctx, x.c, "StorageVolDelete", x.b.rpc, func() error {
		return x.c.be.StorageVolDelete(vol, flags)
	})
}

func (x *bound) StorageVolUpload(vol libvirt.StorageVol, r io.Reader, offset, length uint64, flags libvirt.StorageVolUploadFlags) error {
	return call0(x.ctx, x.c, "StorageVolUpload", x.b.upload(length), func() error {
		return x.c.be.StorageVolUpload(vol, r, offset, length, flags)
	})
}

func (x *bound) StorageVolDownload(vol libvirt.StorageVol, w io.Writer, offset, length uint64, flags libvirt.StorageVolDownloadFlags) error {
	return call0(x.ctx, x.c, "StorageVolDownload", x.b.transfer, func() error {
		return x.c.be.StorageVolDownload(vol, w, offset, length, flags)
	})
}

func (x *bound) DomainLookupByName(name string) (libvirt.Domain, error) {
	return call(x.ctx, x.c, "DomainLookupByName", x.b.rpc, func() (libvirt.Domain, error) {
		return x.c.be.DomainLookupByName(name)
	})
}

func (x *bound) DomainDefineXMLFlags(xml string, flags libvirt.DomainDefineFlags) (libvirt.Domain, error) {
	return call(x.ctx, x.c, "DomainDefineXMLFlags", x.b.rpc, func() (libvirt.Domain, error) {
		return x.c.be.DomainDefineXMLFlags(xml, flags)
	})
}

func (x *bound) DomainCreate(dom libvirt.Domain) error {
	return call0(x.ctx, x.c, "DomainCreate", x.b.domainCreate, func() error {
		return x.c.be.DomainCreate(dom)
	})
}

func (x *bound) DomainGetState(dom libvirt.Domain, flags uint32) (int32, int32, error) {
	type out struct{ state, reason int32 }
	r, err := call(x.ctx, x.c, "DomainGetState", x.b.rpc, func() (out, error) {
		s, rs, err := x.c.be.DomainGetState(dom, flags)
		return out{s, rs}, err
	})
	return r.state, r.reason, err
}

func (x *bound) DomainGetMetadata(dom libvirt.Domain, typ int32, uri libvirt.OptString, flags libvirt.DomainModificationImpact) (string, error) {
	return call(x.ctx, x.c, "DomainGetMetadata", x.b.rpc, func() (string, error) {
		return x.c.be.DomainGetMetadata(dom, typ, uri, flags)
	})
}

func (x *bound) DomainInterfaceAddresses(dom libvirt.Domain, source, flags uint32) ([]libvirt.DomainInterface, error) {
	return call(x.ctx, x.c, "DomainInterfaceAddresses", x.b.rpc, func() ([]libvirt.DomainInterface, error) {
		return x.c.be.DomainInterfaceAddresses(dom, source, flags)
	})
}

func (x *bound) DomainDestroyFlags(dom libvirt.Domain, flags libvirt.DomainDestroyFlagsValues) error {
	return call0(x.ctx, x.c, "DomainDestroyFlags", x.b.rpc, func() error {
		return x.c.be.DomainDestroyFlags(dom, flags)
	})
}

func (x *bound) DomainReset(dom libvirt.Domain, flags uint32) error {
	return call0(x.ctx, x.c, "DomainReset", x.b.rpc, func() error {
		return x.c.be.DomainReset(dom, flags)
	})
}

func (x *bound) DomainUndefineFlags(dom libvirt.Domain, flags libvirt.DomainUndefineFlagsValues) error {
	return call0(x.ctx, x.c, "DomainUndefineFlags", x.b.rpc, func() error {
		return x.c.be.DomainUndefineFlags(dom, flags)
	})
}

// forwardedSocket hands go-libvirt the libvirt socket already forwarded over SSH. A
// connection is dialled once and never reconnected in place: a dead one is replaced by a
// new dial, so a second Dial is an error. go-libvirt gets the socket through
// streamOrderConn, which puts a stream call's reply ahead of data libvirtd sent early.
type forwardedSocket struct {
	conn net.Conn
	used atomic.Bool
}

func (f *forwardedSocket) Dial() (net.Conn, error) {
	if f.used.Swap(true) {
		return nil, errors.New("forwarded libvirt socket already used")
	}
	return newStreamOrderConn(f.conn), nil
}

// connectCloser is the part of go-libvirt used to say goodbye before a connection closes.
type connectCloser interface {
	ConnectClose() error
}

// conn is one connection to a host: the libvirt client and the TCP connection under the
// SSH session it runs over.
type conn struct {
	host string
	be   backend
	// tcp carries the SSH session; closing it ends the session, the forwarded socket and
	// every call on it. nil for a backend with no connection under it.
	tcp      io.Closer
	dead     atomic.Bool
	done     chan struct{} // closed once the connection is killed
	killOnce sync.Once
}

func newConn(host string, be backend, tcp io.Closer) *conn {
	return &conn{host: host, be: be, tcp: tcp, done: make(chan struct{})}
}

// alive reports whether c may still be handed to callers.
func (c *conn) alive() bool { return !c.dead.Load() }

// kill marks c dead, so the next caller redials, and then closes its TCP connection.
// Neither step takes a lock that a call stuck writing to a vanished host could hold.
func (c *conn) kill() {
	c.dead.Store(true)
	c.killOnce.Do(func() {
		close(c.done)
		if c.tcp != nil {
			c.tcp.Close()
		}
	})
}

// close ends a connection that is done with: a courtesy ConnectClose when it is still
// alive, so libvirtd frees its side at once, then kill.
func (c *conn) close(b budgets) {
	if cc, ok := c.be.(connectCloser); ok && c.alive() {
		_ = call0(context.Background(), c, "ConnectClose", b.closeConn, cc.ConnectClose)
	}
	c.kill()
}

// watch kills c when go-libvirt reports the socket gone or a keepalive@openssh.com request
// fails or goes unanswered for the keepalive timeout. It returns once c is killed.
func (c *conn) watch(log logr.Logger, disconnected <-chan struct{}, ping func() error, b budgets) {
	t := time.NewTicker(b.keepaliveInterval)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-disconnected:
			log.V(1).Info("libvirt host disconnected")
			c.kill()
			return
		case <-t.C:
		}
		if err := c.keepalive(ping, b.keepaliveTimeout); err != nil {
			log.V(1).Info("libvirt host keepalive failed", "error", err.Error())
			c.kill()
			return
		}
	}
}

func (c *conn) keepalive(ping func() error, timeout time.Duration) error {
	res := make(chan error, 1)
	// The request returns when the reply arrives or the connection dies, whichever is
	// first; a killed connection always ends it.
	go func() { res <- ping() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-res:
		return err
	case <-timer.C:
		return fmt.Errorf("no keepalive reply within %s", timeout)
	case <-c.done:
		return nil
	}
}
