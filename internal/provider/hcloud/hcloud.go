// Package hcloud is the Hetzner Cloud provider (type hcloud): proxies as Hetzner Cloud
// servers in the project the API token belongs to, driven through the official client
// github.com/hetznercloud/hcloud-go/v2. A server is named after its Proxy
// (proxy-<16 hex>) and labelled with the provider entry, the install and the Proxy UID;
// the cloud-init user-data goes in the server's user_data (at most 32 KiB), which
// Hetzner's system images run. Every server gets a primary IPv4 and, unless the entry
// turns it off, its IPv6 /64; with a firewall block each Proxy gets a Hetzner firewall of
// its own, deleted with its server.
package hcloud

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	hc "github.com/hetznercloud/hcloud-go/v2/hcloud"
	"k8s.io/apimachinery/pkg/util/wait"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// Provider is the hcloud provider of one providers-config entry.
type Provider struct {
	name      string
	installID string
	cfg       provider.HCloudConfig
	log       logr.Logger
	http      *http.Client
	// extra are client options added after the provider's own (tests: fast retries).
	extra []hc.ClientOption

	pollInitial time.Duration
	pollMax     time.Duration
	runningWait time.Duration
	callTimeout time.Duration
}

var (
	_ provider.Provider = (*Provider)(nil)
	_ provider.Rebooter = (*Provider)(nil)
)

// Option sets something on a provider that does not come from its config entry.
type Option func(*Provider)

// WithInstallID names the install of the operator the provider runs in (the manager's
// --install-id). It goes into the epo-install label of every server and firewall, and
// those labelled with another install are never listed, adopted, rebooted or deleted.
func WithInstallID(id string) Option { return func(p *Provider) { p.installID = id } }

// WithPollInterval sets the first and the longest wait between polls of an action or of
// a server that is still starting (default 1s growing to 10s).
func WithPollInterval(initial, longest time.Duration) Option {
	return func(p *Provider) { p.pollInitial, p.pollMax = initial, longest }
}

// WithClientOptions adds options to every API client, after the provider's own.
func WithClientOptions(opts ...hc.ClientOption) Option {
	return func(p *Provider) { p.extra = append(p.extra, opts...) }
}

// WithHTTPClient sets the HTTP client the API clients use.
func WithHTTPClient(c *http.Client) Option { return func(p *Provider) { p.http = c } }

// InstallID returns the install identity the provider labels its servers with.
func (p *Provider) InstallID() string { return p.installID }

// New builds the hcloud provider of config entry pc. It dials nothing and reads no
// token: the token file is read on every call.
func New(pc provider.ProviderConfig, log logr.Logger, opts ...Option) (*Provider, error) {
	if pc.HCloud == nil {
		return nil, fmt.Errorf("provider %s: the hcloud block is missing", pc.Name)
	}
	if errs := pc.HCloud.Validate(provider.TypeHCloud); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	cfg := *pc.HCloud
	p := &Provider{
		name:        pc.Name,
		cfg:         cfg,
		log:         log.WithName("hcloud").WithValues("provider", pc.Name),
		pollInitial: time.Second,
		pollMax:     10 * time.Second,
		runningWait: 5 * time.Minute,
		callTimeout: 2 * time.Minute,
	}
	for _, o := range opts {
		o(p)
	}
	if p.http == nil {
		p.http = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: p.callTimeout}
	}
	// Every request is traced and logged at V(1), under whatever transport the client has.
	base := p.http.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	p.http = &http.Client{Transport: &callLog{base: base, log: p.log}, Timeout: p.http.Timeout,
		CheckRedirect: p.http.CheckRedirect, Jar: p.http.Jar}
	if _, err := os.Stat(cfg.TokenFile); err != nil {
		p.log.Info("WARNING: token file not readable yet; API calls fail until it appears",
			"field", "hcloud.tokenFile", "path", cfg.TokenFile, "error", err.Error())
	}
	return p, nil
}

// Close releases the idle connections.
func (p *Provider) Close() error {
	p.http.CloseIdleConnections()
	return nil
}

// readToken reads the token file, on every call, so that a rotated Secret is used at
// once. A file that is missing, unreadable or empty, or that holds more than one line, is
// transient (a Secret that has not landed, or is being rewritten, looks so) and named by
// field and path; the token itself is never part of an error.
func (p *Provider) readToken() (string, error) {
	b, err := os.ReadFile(p.cfg.TokenFile)
	if err != nil {
		return "", provider.Transient(fmt.Errorf("hcloud.tokenFile %s: %w", p.cfg.TokenFile, errors.Unwrap(err)))
	}
	tok := strings.TrimSpace(string(b))
	switch {
	case tok == "":
		return "", provider.Errorf(provider.ErrTransient, "hcloud.tokenFile %s is empty: it must hold the project's API token", p.cfg.TokenFile)
	case strings.ContainsAny(tok, " \t\r\n") || strings.ContainsFunc(tok, func(r rune) bool { return r < 0x21 || r > 0x7e }):
		return "", provider.Errorf(provider.ErrTransient,
			"hcloud.tokenFile %s does not hold one API token (it has spaces, line breaks or characters outside printable ASCII)", p.cfg.TokenFile)
	}
	return tok, nil
}

// client makes an API client with the token read now. Making one dials nothing; the HTTP
// client, and so its connections, is shared.
func (p *Provider) client() (*hc.Client, error) {
	tok, err := p.readToken()
	if err != nil {
		return nil, err
	}
	opts := []hc.ClientOption{
		hc.WithToken(tok),
		hc.WithHTTPClient(p.http),
		hc.WithApplication("egress-proxies-operator", "v1"),
		hc.WithPollOpts(hc.PollOpts{BackoffFunc: p.pollBackoffFunc()}),
		// A rate limit or a conflict is retried twice by the client, then classified.
		hc.WithRetryOpts(hc.RetryOpts{BackoffFunc: hc.ExponentialBackoff(2, max(p.pollInitial, 10*time.Millisecond)), MaxRetries: 2}),
	}
	if p.cfg.Endpoint != "" {
		opts = append(opts, hc.WithEndpoint(p.cfg.Endpoint))
	}
	return hc.NewClient(append(opts, p.extra...)...), nil
}

// pollBackoffFunc is the wait between polls of an action: pollInitial doubling up to
// pollMax.
func (p *Provider) pollBackoffFunc() hc.BackoffFunc {
	return func(retries int) time.Duration {
		d := p.pollInitial
		for range min(retries, 20) {
			d *= 2
			if d >= p.pollMax {
				return p.pollMax
			}
		}
		return min(d, p.pollMax)
	}
}

// pollBackoff is the wait between polls of a server that is still starting.
func (p *Provider) pollBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: min(p.pollInitial, p.pollMax), Factor: 2, Cap: p.pollMax, Steps: math.MaxInt32}
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

// NeverAnsweredHint says why an hcloud Proxy may never answer its probe though its server
// runs with an address.
func (p *Provider) NeverAnsweredHint() string {
	return "the server runs but the proxy never answered: the image may lack cloud-init (Hetzner's system images have it; a snapshot may not), " +
		"or a firewall of the project may close the port; check the boot with hcloud server request-console, or the firewalls with hcloud firewall list"
}

var _ provider.ProbeHinter = (*Provider)(nil)
