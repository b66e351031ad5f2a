// Package gce is the GCP provider (type gce): proxies as Compute Engine VMs in one project,
// driven through the official REST clients of cloud.google.com/go/compute/apiv1. An
// instance is named after its Proxy (proxy-<16 hex>) and marked with labels naming the
// provider entry, the install and the Proxy UID; the cloud-init user-data goes in the
// user-data metadata key, which only an image with cloud-init runs: Ubuntu's
// (ubuntu-os-cloud) do, the official Debian GCE images ship none.
package gce

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"github.com/go-logr/logr"
	"google.golang.org/api/option"
	httptransport "google.golang.org/api/transport/http"
	"k8s.io/apimachinery/pkg/util/wait"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// Provider is the gce provider of one providers-config entry.
type Provider struct {
	name      string
	installID string
	cfg       provider.GCEConfig
	log       logr.Logger

	// extra are client options added after the config's (tests: a token source).
	extra []option.ClientOption
	// base is the innermost transport, under the wire log (default: a clone of
	// http.DefaultTransport).
	base http.RoundTripper

	pollInitial time.Duration
	pollMax     time.Duration
	runningWait time.Duration
	callTimeout time.Duration

	mu      sync.Mutex
	clients *clients
	// failedOps counts, per request key, the operations that reached DONE, so that the
	// next call derives a fresh requestId instead of getting the finished one replayed
	// (a failed insert, or a Spot VM preempted after its insert succeeded).
	failedOps map[string]int
	// ruleLocks guard the shared firewall rules of pools, by name (poolRuleLock).
	ruleLocks map[string]*sync.RWMutex
}

var _ provider.Provider = (*Provider)(nil)

type clients struct {
	instances *compute.InstancesClient
	zones     *compute.ZonesClient
	regions   *compute.RegionsClient
	firewalls *compute.FirewallsClient
	zoneOps   *compute.ZoneOperationsClient
	mtypes    *compute.MachineTypesClient
	projects  *compute.ProjectsClient
}

func (c *clients) close() error {
	return errors.Join(c.instances.Close(), c.zones.Close(), c.regions.Close(), c.firewalls.Close(), c.zoneOps.Close(), c.mtypes.Close(), c.projects.Close())
}

// Option sets something on a provider that does not come from its config entry.
type Option func(*Provider)

// WithInstallID names the install of the operator the provider runs in (the manager's
// --install-id). It goes into the epo-install label of every instance, and instances
// labelled with another install are never listed, adopted or deleted.
func WithInstallID(id string) Option { return func(p *Provider) { p.installID = id } }

// WithClientOptions adds options to every API client, after the config's.
func WithClientOptions(opts ...option.ClientOption) Option {
	return func(p *Provider) { p.extra = append(p.extra, opts...) }
}

// WithPollInterval sets the first and the longest wait between polls of an operation or
// of an instance that is still starting (default 1s growing to 10s).
func WithPollInterval(initial, longest time.Duration) Option {
	return func(p *Provider) { p.pollInitial, p.pollMax = initial, longest }
}

// WithBaseTransport sets the transport under the wire log and the credentials.
func WithBaseTransport(rt http.RoundTripper) Option { return func(p *Provider) { p.base = rt } }

// InstallID returns the install identity the provider labels its instances with.
func (p *Provider) InstallID() string { return p.installID }

// New builds the gce provider of config entry pc. It dials nothing and reads no
// credentials: the API clients are made on first use.
func New(pc provider.ProviderConfig, log logr.Logger, opts ...Option) (*Provider, error) {
	if pc.GCE == nil {
		return nil, fmt.Errorf("provider %s: the gce block is missing", pc.Name)
	}
	if errs := pc.GCE.Validate(provider.TypeGCE); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	p := &Provider{
		name:        pc.Name,
		cfg:         pc.GCE.WithDefaults(),
		log:         log.WithName("gce").WithValues("provider", pc.Name, "project", pc.GCE.Project),
		pollInitial: time.Second,
		pollMax:     10 * time.Second,
		runningWait: 5 * time.Minute,
		callTimeout: 2 * time.Minute,
		failedOps:   map[string]int{},
	}
	for _, o := range opts {
		o(p)
	}
	return p, nil
}

// client returns the API clients, making them on first use. A failure (no credentials
// found, an unreadable key file) is transient: the file or the metadata server may come.
func (p *Provider) client(ctx context.Context) (*clients, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.clients != nil {
		return p.clients, nil
	}
	c, err := p.newClients(ctx)
	if err != nil {
		return nil, provider.Transient(fmt.Errorf("gce provider %s: credentials: %w", p.name, err))
	}
	p.clients = c
	return c, nil
}

func (p *Provider) newClients(ctx context.Context) (*clients, error) {
	auth := []option.ClientOption{option.WithScopes(compute.DefaultAuthScopes()...)}
	switch {
	case p.cfg.WithoutAuthentication:
		auth = append(auth, option.WithoutAuthentication())
	case p.cfg.CredentialsFile != "":
		auth = append(auth, option.WithAuthCredentialsFile(option.ServiceAccount, p.cfg.CredentialsFile))
	}
	auth = append(auth, p.extra...)
	base := p.base
	if base == nil {
		base = http.DefaultTransport.(*http.Transport).Clone()
	}
	// The wire log sits under the credentials, so it sees (and removes) the
	// Authorization header the real API gets.
	rt, err := httptransport.NewTransport(ctx, &wireLog{base: base, log: p.log}, auth...)
	if err != nil {
		return nil, err
	}
	opts := []option.ClientOption{option.WithHTTPClient(&http.Client{Transport: rt})}
	if p.cfg.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(p.cfg.Endpoint))
	}
	// The clients make no connection when built.
	bg := context.WithoutCancel(ctx)
	c := &clients{}
	if c.instances, err = compute.NewInstancesRESTClient(bg, opts...); err != nil {
		return nil, err
	}
	if c.zones, err = compute.NewZonesRESTClient(bg, opts...); err != nil {
		return nil, err
	}
	if c.regions, err = compute.NewRegionsRESTClient(bg, opts...); err != nil {
		return nil, err
	}
	if c.firewalls, err = compute.NewFirewallsRESTClient(bg, opts...); err != nil {
		return nil, err
	}
	if c.zoneOps, err = compute.NewZoneOperationsRESTClient(bg, opts...); err != nil {
		return nil, err
	}
	if c.mtypes, err = compute.NewMachineTypesRESTClient(bg, opts...); err != nil {
		return nil, err
	}
	if c.projects, err = compute.NewProjectsRESTClient(bg, opts...); err != nil {
		return nil, err
	}
	return c, nil
}

// Close closes the API clients.
func (p *Provider) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.clients == nil {
		return nil
	}
	err := p.clients.close()
	p.clients = nil
	return err
}

// failures is how many operations of key reached DONE so far.
func (p *Provider) failures(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failedOps[key]
}

// opFinished counts an operation of key that reached DONE, failed or not: the next call
// of key is new work and needs a requestId GCE has not seen.
func (p *Provider) opFinished(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failedOps[key]++
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// pollBackoff is the wait between polls of an operation or of an instance that is still
// starting: pollInitial doubling up to pollMax, then pollMax for as long as the poll goes
// on (the caller's context bounds it).
func (p *Provider) pollBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: min(p.pollInitial, p.pollMax), Factor: 2, Cap: p.pollMax, Steps: math.MaxInt32}
}

// NeverAnsweredHint says why a gce Proxy may never answer its probe though its VM runs
// with an address: the image runs no cloud-init, so the user-data that installs and
// starts the proxy is ignored.
func (p *Provider) NeverAnsweredHint() string {
	return "the VM runs but its image may lack cloud-init, which applies the proxy's user-data " +
		"(official Debian GCE images have none): use an Ubuntu image (ubuntu-os-cloud), or check the serial port output " +
		"with gcloud compute instances get-serial-port-output --project " + p.cfg.Project
}

var _ provider.ProbeHinter = (*Provider)(nil)
