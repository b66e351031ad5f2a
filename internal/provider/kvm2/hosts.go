package kvm2

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/crypto/ssh"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

// Dial stages, as logged and as read by the health check.
const (
	stageCredentials = "credentials"
	stageTCP         = "tcp"
	stageSSH         = "ssh"
	stageSocket      = "socket"
)

// hosts holds the connections of one provider to its hypervisors: one pooled SSH plus
// libvirt connection per host, dialled lazily on first use and shared by every operation
// on that host, and fresh dedicated connections for the callers that must not share it.
type hosts struct {
	name string
	// typ is the provider type (kvm2 or kvm): the logger's name and the block that
	// messages name.
	typ     string
	cfg     provider.KVMConfig
	log     logr.Logger
	budgets budgets
	rpcs    *rpcCounter
	// dial opens a new connection to a host; dialSSH outside tests.
	dial func(ctx context.Context, h provider.KVMHost) (*conn, error)

	mu     sync.Mutex
	closed bool
	slots  map[string]*slot
	wg     sync.WaitGroup // dials in flight
}

// slot is one host's pooled connection, or the dial that will produce it.
type slot struct {
	conn    *conn
	dialing *dialAttempt
}

// dialAttempt is one dial shared by every caller that needed the connection meanwhile.
type dialAttempt struct {
	done chan struct{}
	conn *conn
	err  error
}

// newHosts prepares the connections of provider name; cfg is already defaulted. Nothing is
// dialled: the credential files are only checked for existence, with a WARNING: line for
// each that is missing, so a manager starts before the kvm-ssh Secret lands.
func newHosts(name string, cfg provider.KVMConfig, log logr.Logger) (*hosts, error) {
	return newHostsOfType(name, provider.TypeKVM2, cfg, log)
}

// newHostsOfType is newHosts for a provider of type typ, whose logger it names and whose
// block (typ.hosts) its messages name.
func newHostsOfType(name, typ string, cfg provider.KVMConfig, log logr.Logger) (*hosts, error) {
	hs := &hosts{
		name:    name,
		typ:     typ,
		cfg:     cfg,
		log:     log.WithName(typ).WithValues("provider", name),
		budgets: defaultBudgets,
		rpcs:    newRPCCounter(),
		slots:   make(map[string]*slot, len(cfg.Hosts)),
	}
	hs.dial = hs.dialSSH
	for _, h := range cfg.Hosts {
		if _, dup := hs.slots[h.Name]; dup {
			return nil, provider.Permanent(fmt.Errorf("host %q is listed twice in %s.hosts", h.Name, typ))
		}
		hs.slots[h.Name] = &slot{}
	}
	checkCredentialFiles(cfg, hs.log)
	return hs, nil
}

// host returns the configuration of the host called name.
func (hs *hosts) host(name string) (provider.KVMHost, error) {
	for _, h := range hs.cfg.Hosts {
		if h.Name == name {
			return h, nil
		}
	}
	return provider.KVMHost{}, provider.Permanent(fmt.Errorf("host %q is not in %s.hosts", name, hs.typ))
}

// pooled returns the backend of host's shared connection, dialling it when there is none
// or the last one died. Concurrent callers wait for one dial and share its result; each
// stops waiting when its own ctx ends. The backend is bound to ctx: its calls run under
// their budgets, and ending ctx abandons the call in flight by killing the connection.
func (hs *hosts) pooled(ctx context.Context, host string) (backend, error) {
	h, err := hs.host(host)
	if err != nil {
		return nil, err
	}
	c, err := hs.shared(ctx, h)
	if err != nil {
		return nil, err
	}
	return hs.wrap(ctx, c), nil
}

func (hs *hosts) shared(ctx context.Context, h provider.KVMHost) (*conn, error) {
	hs.mu.Lock()
	if hs.closed {
		hs.mu.Unlock()
		return nil, provider.Transient(fmt.Errorf("%s provider %s is shut down", hs.typ, hs.name))
	}
	s := hs.slots[h.Name]
	if s.conn != nil && s.conn.alive() {
		c := s.conn
		hs.mu.Unlock()
		return c, nil
	}
	if s.conn != nil {
		// Marked dead by a cancelled call, the keepalive or go-libvirt; make sure it is
		// gone before it is forgotten.
		s.conn.kill()
		s.conn = nil
	}
	a := s.dialing
	if a == nil {
		a = &dialAttempt{done: make(chan struct{})}
		s.dialing = a
		hs.wg.Add(1)
		// The dial outlives the caller that started it, since others may share it;
		// it keeps the caller's trace but not its cancellation.
		go hs.runDial(context.WithoutCancel(ctx), h, s, a)
	}
	hs.mu.Unlock()
	select {
	case <-a.done:
		return a.conn, a.err
	case <-ctx.Done():
		return nil, provider.Transient(fmt.Errorf("waiting for the connection to host %s: %w", h.Name, ctx.Err()))
	}
}

func (hs *hosts) runDial(ctx context.Context, h provider.KVMHost, s *slot, a *dialAttempt) {
	defer hs.wg.Done()
	c, err := hs.dial(ctx, h)
	var orphan *conn
	hs.mu.Lock()
	s.dialing = nil
	if err == nil && hs.closed {
		orphan, c = c, nil
		err = provider.Transient(fmt.Errorf("%s provider %s is shut down", hs.typ, hs.name))
	}
	if c != nil {
		s.conn = c
	}
	a.conn, a.err = c, err
	hs.mu.Unlock()
	close(a.done)
	if orphan != nil {
		orphan.close(hs.budgets)
	}
}

// dialFresh opens a connection of the caller's own to host, for the image upload and the
// health check: killing it when ctx ends or a budget runs out affects no one else. The
// caller runs closeFn when done.
func (hs *hosts) dialFresh(ctx context.Context, host string) (b backend, closeFn func(), err error) {
	h, err := hs.host(host)
	if err != nil {
		return nil, nil, err
	}
	c, err := hs.dial(ctx, h)
	if err != nil {
		return nil, nil, err
	}
	return hs.wrap(ctx, c), func() { c.close(hs.budgets) }, nil
}

// wrap is c's backend as callers see it: bound to ctx, budgeted and observed.
func (hs *hosts) wrap(ctx context.Context, c *conn) backend {
	return &observed{ctx: ctx, host: c.host, log: hs.log, rpcs: hs.rpcs, inner: &bound{ctx: ctx, c: c, b: hs.budgets}}
}

// close closes every pooled connection, politely, and waits for dials in flight.
func (hs *hosts) close() error {
	hs.mu.Lock()
	hs.closed = true
	var conns []*conn
	for _, s := range hs.slots {
		if s.conn != nil {
			conns = append(conns, s.conn)
			s.conn = nil
		}
	}
	hs.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() { c.close(hs.budgets) })
	}
	wg.Wait()
	hs.wg.Wait()
	return nil
}

// dialError is a failed dial, with the stage it failed at.
type dialError struct {
	stage string
	err   error
}

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// dialSSH connects to h: credentials, TCP, the SSH handshake, the forwarded libvirt socket
// and the libvirt connect, all within the dial budget and ctx.
func (hs *hosts) dialSSH(ctx context.Context, h provider.KVMHost) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, hs.budgets.dial)
	defer cancel()
	ctx, span := rpcTracer.Start(ctx, "kvm2.dial", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("kvm2.host", h.Name), attribute.String("kvm2.address", h.Address),
			attribute.String("kvm2.user", h.User)))
	defer span.End()
	log := tracing.Logger(ctx, hs.log).WithValues("host", h.Name)
	start := time.Now()
	c, stage, err := hs.connect(ctx, h)
	if err != nil {
		err = classify(&dialError{stage: stage, err: fmt.Errorf("connecting to libvirt host %s at %s: %w", h.Name, h.Address, err)})
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		log.V(1).Info("libvirt host connect failed", "address", h.Address, "user", h.User,
			"duration", time.Since(start), "stage", stage, "error", err.Error())
		return nil, err
	}
	log.V(1).Info("libvirt host connected", "address", h.Address, "user", h.User, "duration", time.Since(start))
	return c, nil
}

func (hs *hosts) connect(ctx context.Context, h provider.KVMHost) (*conn, string, error) {
	cr, err := loadCredentials(hs.cfg)
	if err != nil {
		return nil, stageCredentials, err
	}
	var d net.Dialer
	tcp, err := d.DialContext(ctx, "tcp", h.Address)
	if err != nil {
		return nil, stageTCP, err
	}
	// Neither the SSH handshake nor go-libvirt's connect takes a context: closing the TCP
	// connection is what ends them when ctx does.
	stop := context.AfterFunc(ctx, func() { tcp.Close() })
	fail := func(stage string, err error) (*conn, string, error) {
		stop()
		tcp.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return nil, stage, err
	}
	sc, chans, reqs, err := ssh.NewClientConn(tcp, h.Address, cr.clientConfig(h.User, h.Address, tcp.RemoteAddr()))
	if err != nil {
		return fail(stageSSH, err)
	}
	client := ssh.NewClient(sc, chans, reqs)
	fwd, err := client.Dial("unix", h.Socket)
	if err != nil {
		return fail(stageSocket, fmt.Errorf("forwarding libvirt socket %s: %w", h.Socket, err))
	}
	lv := libvirt.NewWithDialer(&forwardedSocket{conn: fwd})
	if err := lv.ConnectToURI(libvirt.QEMUSystem); err != nil {
		return fail(stageSocket, fmt.Errorf("libvirt connect over %s: %w", h.Socket, err))
	}
	if !stop() {
		return fail(stageSocket, errors.New("dial cut short"))
	}
	c := newConn(h.Name, lv, tcp)
	ping := func() error {
		_, _, err := client.SendRequest("keepalive@openssh.com", true, nil)
		return err
	}
	go c.watch(hs.log.WithValues("host", h.Name), lv.Disconnected(), ping, hs.budgets)
	return c, "", nil
}
