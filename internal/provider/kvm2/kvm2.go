// Package kvm2 runs proxy instances as VMs on libvirt/KVM hypervisors reached over SSH.
// Each host's libvirt unix socket is forwarded through an SSH connection and spoken to
// with libvirt's own RPC, so the hosts need only sshd and libvirtd. A VM is a domain booted
// from a copy-on-write overlay over a cached distro image, with the Proxy's cloud-init on
// a NoCloud seed ISO.
package kvm2

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/tracing"
)

// Provider is the kvm2 provider: one per providers-config entry of type kvm2, or of type
// kvm, which runs on the same code (see NewOfType).
type Provider struct {
	name string
	// typ is the config block (kvm2, or kvm for the first-generation type built on this
	// code); it names the block in messages and the mark in metadata.
	typ    string
	metaNS string
	// installID names the install of the operator this provider runs in; it goes into
	// every mark written, and a mark naming another install is never touched.
	installID string
	cfg       provider.KVMConfig
	log       logr.Logger
	hosts     *hosts
	locks     *nameLocks
	images    *imagecache.Cache
	now       func() time.Time

	runningWait time.Duration
	runningPoll time.Duration
}

var _ provider.Provider = (*Provider)(nil)

// New builds the kvm2 provider of config entry pc. It dials nothing: hosts are connected
// on first use, and a missing SSH key or known_hosts file is only a WARNING: line, so the
// manager starts before the kvm-ssh Secret lands.
func New(pc provider.ProviderConfig, log logr.Logger, opts ...Option) (*Provider, error) {
	return NewOfType(pc, provider.TypeKVM2, log, opts...)
}

// Option sets something on a provider that does not come from its config entry.
type Option func(*Provider)

// WithInstallID names the install of the operator the provider runs in (the manager's
// --install-id). It is written into every mark, and ListByTag, Create, Get and Delete
// leave alone every domain whose mark names another install. Without it the provider
// writes marks without an install, as before install identities existed, and treats
// every mark naming one as another install's.
func WithInstallID(id string) Option { return func(p *Provider) { p.installID = id } }

// InstallID returns the install identity the provider marks its domains with.
func (p *Provider) InstallID() string { return p.installID }

// NewOfType builds a provider of type typ (kvm2 or kvm) on this code: it reads the block
// of that name and marks its domains in MetadataURI(typ), so the two types never see or
// adopt each other's domains.
func NewOfType(pc provider.ProviderConfig, typ string, log logr.Logger, opts ...Option) (*Provider, error) {
	var block *provider.KVMConfig
	switch typ {
	case provider.TypeKVM2:
		block = pc.KVM2
	case provider.TypeKVM:
		block = pc.KVM
	default:
		return nil, fmt.Errorf("provider %s: type %q is not built on the kvm2 code", pc.Name, typ)
	}
	if block == nil {
		return nil, fmt.Errorf("provider %s: the %s block is missing", pc.Name, typ)
	}
	cfg := withDefaults(*block)
	if len(cfg.Hosts) == 0 {
		return nil, fmt.Errorf("provider %s: %s.hosts lists no host", pc.Name, typ)
	}
	hs, err := newHostsOfType(pc.Name, typ, cfg, log)
	if err != nil {
		return nil, fmt.Errorf("provider %s: %w", pc.Name, err)
	}
	p := &Provider{
		name:        pc.Name,
		typ:         typ,
		metaNS:      MetadataURI(typ),
		cfg:         cfg,
		log:         log.WithName(typ).WithValues("provider", pc.Name),
		hosts:       hs,
		locks:       newNameLocks(),
		now:         time.Now,
		runningWait: defaultRunningWait,
		runningPoll: defaultRunningPoll,
	}
	p.images = imagecache.New(imagecache.Config{
		Type: typ, KVM: &p.cfg, Hosts: cacheHosts{hs}, Locks: imageLocks, Log: p.log, Tracer: rpcTracer,
		VolumeXML: rawVolumeXML,
		Failed: func(log logr.Logger, op string, err error) error {
			return failed(log, op, err, classifyInCreate)
		},
	})
	for _, o := range opts {
		o(p)
	}
	return p, nil
}

// withDefaults fills every unset field of the block with its default (disk size, guest
// agent, image format and firmware, host socket, pool and domain type).
func withDefaults(cfg provider.KVMConfig) provider.KVMConfig { return cfg.WithDefaults() }

// Close cancels the image jobs and waits for them to end (a cancelled fetch removes its
// half-written base and never writes the marker), then drops the pooled connections.
func (p *Provider) Close() error {
	p.images.Close()
	return p.hosts.close()
}

// Check probes every configured host on a connection of its own, in config order.
func (p *Provider) Check(ctx context.Context) []provider.TargetStatus { return p.hosts.check(ctx) }

// host selects the host placement.zone names. With exactly one host configured the zone
// may be left empty.
func (p *Provider) host(zone string) (provider.KVMHost, error) {
	if zone == "" {
		if len(p.cfg.Hosts) == 1 {
			return p.cfg.Hosts[0], nil
		}
		return provider.KVMHost{}, provider.Errorf(provider.ErrPermanent,
			"placement.zone is required when %s.hosts lists more than one host", p.typ)
	}
	if h, ok := p.configuredHost(zone); ok {
		return h, nil
	}
	return provider.KVMHost{}, provider.Errorf(provider.ErrPermanent,
		"placement.zone %q is not in %s.hosts", zone, p.typ)
}

// configuredHost returns the host called name, if the config lists it.
func (p *Provider) configuredHost(name string) (provider.KVMHost, bool) {
	for _, h := range p.cfg.Hosts {
		if h.Name == name {
			return h, true
		}
	}
	return provider.KVMHost{}, false
}

// instanceLog is the logger for lines about domain name on host: provider, host and name
// on every line, plus the trace and span of ctx.
func (p *Provider) instanceLog(ctx context.Context, host, name string) logr.Logger {
	return tracing.Logger(ctx, p.log).WithValues("host", host, "name", name)
}

// failed logs the raw error of a failed operation once and returns it classified.
func failed(log logr.Logger, op string, err error, classifyFn func(error) error) error {
	log.V(1).Info("kvm2 backend call failed", "op", op, "error", err.Error())
	return classifyFn(err)
}

// nameLocks serialises Create and Delete per domain name, so two Deletes (GC and the
// reconciler) never race on destroy and undefine, and a Delete cannot interleave with a
// Create's steps. Get and ListByTag take no lock.
type nameLocks struct {
	mu sync.Mutex
	m  map[string]*nameLock
}

type nameLock struct {
	ch   chan struct{} // holds one token while the name is locked
	refs int
}

func newNameLocks() *nameLocks { return &nameLocks{m: make(map[string]*nameLock)} }

// lock takes the lock on name, or gives up when ctx ends first.
func (l *nameLocks) lock(ctx context.Context, name string) (unlock func(), err error) {
	l.mu.Lock()
	e := l.m[name]
	if e == nil {
		e = &nameLock{ch: make(chan struct{}, 1)}
		l.m[name] = e
	}
	e.refs++
	l.mu.Unlock()
	release := func() {
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.m, name)
		}
		l.mu.Unlock()
	}
	select {
	case e.ch <- struct{}{}:
		return func() { <-e.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// Lock takes the lock on name for the image cache (imagecache.Locker).
func (l *nameLocks) Lock(ctx context.Context, name string) (unlock func(), err error) {
	return l.lock(ctx, name)
}

// imageLocks are the fetch locks of every provider in the process: entries of either type
// that name the same host share the base volumes in its pool, so they must share the
// locks too, or one would take the other's half-written base for an interrupted fetch.
var imageLocks = newNameLocks()

// cacheHosts are the provider's hosts as the image cache reaches them.
type cacheHosts struct{ hs *hosts }

func (c cacheHosts) Pooled(ctx context.Context, host string) (imagecache.Storage, error) {
	return c.hs.pooled(ctx, host)
}

func (c cacheHosts) DialFresh(ctx context.Context, host string) (imagecache.Storage, func(), error) {
	return c.hs.dialFresh(ctx, host)
}

func (c cacheHosts) Transfer() time.Duration { return c.hs.budgets.transfer }
