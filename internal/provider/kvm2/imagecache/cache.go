package imagecache

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// Storage is what the cache asks of a host's libvirt: exactly the storage calls it makes,
// with go-libvirt's own signatures, so the provider's backend (go-libvirt, the in-memory
// fake, the observing decorator) is a Storage as it is.
type Storage interface {
	StoragePoolLookupByName(name string) (libvirt.StoragePool, error)
	StoragePoolGetInfo(pool libvirt.StoragePool) (state uint8, capacity, allocation, available uint64, err error)
	StoragePoolRefresh(pool libvirt.StoragePool, flags uint32) error

	StorageVolLookupByName(pool libvirt.StoragePool, name string) (libvirt.StorageVol, error)
	StorageVolCreateXML(pool libvirt.StoragePool, xml string, flags libvirt.StorageVolCreateFlags) (libvirt.StorageVol, error)
	StorageVolGetPath(vol libvirt.StorageVol) (string, error)
	StorageVolDelete(vol libvirt.StorageVol, flags libvirt.StorageVolDeleteFlags) error
	StorageVolUpload(vol libvirt.StorageVol, r io.Reader, offset, length uint64, flags libvirt.StorageVolUploadFlags) error
	StorageVolDownload(vol libvirt.StorageVol, w io.Writer, offset, length uint64, flags libvirt.StorageVolDownloadFlags) error
}

// Hosts is how the cache reaches the provider's hosts by name: the pooled connection an
// image job runs on, a connection of its own for the upload, and the transfer budget the
// whole fetch runs within.
type Hosts interface {
	Pooled(ctx context.Context, host string) (Storage, error)
	DialFresh(ctx context.Context, host string) (s Storage, closeFn func(), err error)
	Transfer() time.Duration
}

// Locker is a set of named locks; the fetch lock of a base is taken by ImageLockKey.
type Locker interface {
	Lock(ctx context.Context, name string) (unlock func(), err error)
}

// Config is what a cache takes from its provider.
type Config struct {
	// Type is the config block (kvm2 or kvm), which messages name.
	Type string
	// KVM is the provider's config block, read when it is used (the catalogue, the URL
	// prefixes and the disk size).
	KVM   *provider.KVMConfig
	Hosts Hosts
	// Locks are the fetch locks, shared by every provider of the process.
	Locks  Locker
	Log    logr.Logger
	Tracer trace.Tracer
	// VolumeXML describes a raw volume of size bytes (the base before its upload, the
	// marker).
	VolumeXML func(name string, size uint64) (string, error)
	// Failed logs and classifies the error of a failed image job.
	Failed func(log logr.Logger, op string, err error) error
}

// Defaults of the image cache's own time limits. The whole fetch, from the HTTP request to
// the marker, runs within the transfer budget (Hosts.Transfer); the HTTP download itself
// ends a minute earlier, so a stalled mirror ends through its body and never through the
// connection the upload budget would otherwise kill.
const (
	defaultDownloadMargin = time.Minute
	defaultHeadBudget     = 30 * time.Second
	defaultProgressEvery  = 5 * time.Second
)

// Cache is a provider's image cache: the background jobs that fetch base images
// (jobs.go), the per-(host, volume) fetch locks those jobs take, the HTTP client behind
// the image URL policy (urlpolicy.go) and the time limits, which tests shorten. A Create asks it for
// a base (Base) and gets the cached copy or the pending result of the job fetching it.
type Cache struct {
	typ       string
	cfg       *provider.KVMConfig
	hosts     Hosts
	locks     Locker
	log       logr.Logger
	tracer    trace.Tracer
	volumeXML func(name string, size uint64) (string, error)
	failed    func(log logr.Logger, op string, err error) error

	jobs   *jobs
	client *http.Client
	// Dialer connects the HTTP client; tests replace its Resolver and Dial.
	Dialer *PolicyDialer
	// Download bounds the HTTP download; 0 means the transfer budget less
	// defaultDownloadMargin (or a tenth of the budget, when that is shorter).
	Download time.Duration
	// Head bounds the length lookup of the pool-space precheck.
	Head time.Duration
	// ProgressEvery is the least time between two progress reports of a download.
	ProgressEvery time.Duration
}

// New builds the image cache of one provider.
func New(cfg Config) *Cache {
	dialer := newPolicyDialer()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = dialer.DialContext
	tr.Proxy = policyProxy
	// An image is fetched once per host; an idle connection kept for a next fetch that
	// may never come is only a goroutine pair and a socket held open.
	tr.DisableKeepAlives = true
	tr.DisableCompression = true
	return &Cache{
		typ:           cfg.Type,
		cfg:           cfg.KVM,
		hosts:         cfg.Hosts,
		locks:         cfg.Locks,
		log:           cfg.Log,
		tracer:        cfg.Tracer,
		volumeXML:     cfg.VolumeXML,
		failed:        cfg.Failed,
		jobs:          newJobs(),
		client:        &http.Client{Transport: tr, CheckRedirect: policyRedirect},
		Dialer:        dialer,
		Head:          defaultHeadBudget,
		ProgressEvery: defaultProgressEvery,
	}
}

// Close cancels the image jobs and waits for them to end: a cancelled fetch removes its
// half-written base and never writes the marker. Later fetches are refused.
func (c *Cache) Close() { c.jobs.close() }

// Running is how many image jobs are in flight.
func (c *Cache) Running() int {
	c.jobs.mu.Lock()
	defer c.jobs.mu.Unlock()
	return len(c.jobs.running)
}

// Client is the HTTP client images are fetched with.
func (c *Cache) Client() *http.Client { return c.client }

// Plan resolves placement.image for a Create and puts a URL given in the Proxy through
// the policy before anything else happens, so a refused URL fails the Create permanently
// even when a base for it is cached on the host.
func (c *Cache) Plan(ref string) (Image, error) {
	img, err := Resolve(c.typ, c.cfg.Images, ref)
	if err != nil || !img.fromSpec {
		return img, err
	}
	u, err := url.Parse(img.URL)
	if err != nil {
		return Image{}, provider.Permanent(err) // Resolve parsed it already
	}
	return img, c.policyFor(img).admit(u, false)
}

// ImageLockKey names the base volume of img in h's pool by where the pool is reached (the
// address and socket), not by the host's name, which each providers-config entry picks.
func ImageLockKey(h provider.KVMHost, img Image) string {
	return h.Address + "|" + h.Socket + "|" + h.Pool + "/" + img.BaseVol()
}

// downloadBudget is the deadline of the HTTP download of an image.
func (c *Cache) downloadBudget() time.Duration {
	if c.Download > 0 {
		return c.Download
	}
	t := c.hosts.Transfer()
	return t - min(defaultDownloadMargin, t/10)
}

// isNoVolume reports whether err is libvirt's answer for a volume that does not exist.
func isNoVolume(err error) bool {
	var lerr libvirt.Error
	if errors.As(err, &lerr) {
		return libvirt.ErrorNumber(lerr.Code) == libvirt.ErrNoStorageVol
	}
	var lperr *libvirt.Error
	return errors.As(err, &lperr) && lperr != nil && libvirt.ErrorNumber(lperr.Code) == libvirt.ErrNoStorageVol
}
