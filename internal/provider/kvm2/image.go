package kvm2

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// image is a resolved placement.image: where the bytes come from, what they are and the
// key the cached copy is stored under.
type image struct {
	// Key is the catalogue key, or for a URL used directly the first 16 hex characters
	// of the URL's sha256.
	Key      string
	URL      string
	SHA256   string
	Format   string
	Firmware string
	// fromSpec: the URL came from the Proxy's placement.image, not the catalogue, and is
	// fetched behind the URL fence (fence.go).
	fromSpec bool
}

// baseVol and markerVol name the cached copy in a host's pool.
func (img image) baseVol() string   { return baseVolName(img.Key, img.Format) }
func (img image) markerVol() string { return markerVolName(img.Key, img.Format) }

// resolveImage maps placement.image to an image: a key of the catalogue, or an http(s)
// URL used directly with the defaults (qcow2, uefi). Anything else is permanent.
func resolveImage(typ string, catalogue map[string]provider.KVMImage, ref string) (image, error) {
	if e, ok := catalogue[ref]; ok {
		img := image{Key: ref, URL: e.URL, SHA256: strings.ToLower(e.SHA256), Format: e.Format, Firmware: e.Firmware}
		if img.Format == "" {
			img.Format = provider.DefaultImageFormat
		}
		if img.Firmware == "" {
			img.Firmware = provider.DefaultFirmware
		}
		return img, nil
	}
	if u, err := url.Parse(ref); err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
		sum := sha256.Sum256([]byte(ref))
		return image{
			Key:      hex.EncodeToString(sum[:])[:16],
			URL:      ref,
			Format:   provider.DefaultImageFormat,
			Firmware: provider.DefaultFirmware,
			fromSpec: true,
		}, nil
	}
	return image{}, provider.Errorf(provider.ErrPermanent,
		"placement.image %q is neither a key in %s.images nor an http(s) URL", provider.RedactURL(ref), typ)
}

// planImage resolves placement.image for a Create and puts a URL given in the Proxy
// through the fence before anything else happens, so a refused URL fails the Create
// permanently even when a base for it is cached on the host.
func (p *Provider) planImage(ref string) (image, error) {
	img, err := resolveImage(p.typ, p.cfg.Images, ref)
	if err != nil || !img.fromSpec {
		return img, err
	}
	u, err := url.Parse(img.URL)
	if err != nil {
		return image{}, provider.Permanent(err) // resolveImage parsed it already
	}
	return img, p.fenceFor(img).admit(u, false)
}

// baseImage is a base image present in a host's pool.
type baseImage struct {
	Vol    libvirt.StorageVol
	Path   string
	Format string
}

// Defaults of the image cache's own time limits. The whole fetch, from the HTTP request to
// the marker, runs within the transfer budget (budgets.transfer); the HTTP download itself
// ends a minute earlier, so a stalled mirror ends through its body and never through the
// connection the upload budget would otherwise kill.
const (
	defaultDownloadMargin = time.Minute
	defaultHeadBudget     = 30 * time.Second
	defaultProgressEvery  = 5 * time.Second
)

// imageCache is the provider's image cache: the background jobs that fetch base images
// (image_jobs.go), the per-(host, volume) fetch locks those jobs take, the HTTP client
// and the time limits, which tests shorten. A Create asks it for a base (baseImage) and
// gets the cached copy or the pending result of the job fetching it.
type imageCache struct {
	jobs   *jobs
	locks  *nameLocks
	client *http.Client
	// dialer connects client; tests replace its resolver and dial.
	dialer *fenceDialer
	// download bounds the HTTP download; 0 means the transfer budget less
	// defaultDownloadMargin (or a tenth of the budget, when that is shorter).
	download time.Duration
	// head bounds the length lookup of the pool-space precheck.
	head time.Duration
	// progressEvery is the least time between two progress reports of a download.
	progressEvery time.Duration
}

// imageLocks are the fetch locks of every provider in the process: entries of either type
// that name the same host share the base volumes in its pool, so they must share the
// locks too, or one would take the other's half-written base for an interrupted fetch.
var imageLocks = newNameLocks()

// imageLockKey names the base volume of img in h's pool by where the pool is reached (the
// address and socket), not by the host's name, which each providers-config entry picks.
func imageLockKey(h provider.KVMHost, img image) string {
	return h.Address + "|" + h.Socket + "|" + h.Pool + "/" + img.baseVol()
}

func newImageCache() *imageCache {
	dialer := newFenceDialer()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = dialer.DialContext
	tr.Proxy = fenceProxy
	// An image is fetched once per host; an idle connection kept for a next fetch that
	// may never come is only a goroutine pair and a socket held open.
	tr.DisableKeepAlives = true
	tr.DisableCompression = true
	return &imageCache{
		jobs:          newJobs(),
		locks:         imageLocks,
		client:        &http.Client{Transport: tr, CheckRedirect: fenceRedirect},
		dialer:        dialer,
		head:          defaultHeadBudget,
		progressEvery: defaultProgressEvery,
	}
}

// downloadBudget is the deadline of the HTTP download of an image.
func (p *Provider) downloadBudget() time.Duration {
	if p.images.download > 0 {
		return p.images.download
	}
	t := p.hosts.budgets.transfer
	return t - min(defaultDownloadMargin, t/10)
}

// cacheState is what a host's pool holds of an image: the base volume, its marker and the
// digest the marker records. reason says why the cached copy cannot be used ("" when it
// can).
type cacheState struct {
	base   *libvirt.StorageVol
	marker *libvirt.StorageVol
	digest string
	reason string
}

func (s cacheState) complete() bool { return s.reason == "" }

// Reasons a cached base is not used as it is.
const (
	cacheNoBase      = "no base volume"
	cacheNoMarker    = "base volume without marker"
	cacheBadMarker   = "marker does not hold a sha256 digest"
	cacheWrongDigest = "marker differs from the configured sha256"
	markerLen        = 64
	markerReadLimit  = 4 * markerLen
)

// inspectCache reads what pool holds of img without changing anything: the precheck, and
// through it the cached path of a Create, uses it without the image lock.
func inspectCache(b backend, h provider.KVMHost, pool libvirt.StoragePool, img image) (cacheState, error) {
	var s cacheState
	lookup := func(name string) (*libvirt.StorageVol, error) {
		vol, err := b.StorageVolLookupByName(pool, name)
		if isCode(err, libvirt.ErrNoStorageVol) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("looking up %s in pool %s on host %s: %w", name, h.Pool, h.Name, err)
		}
		return &vol, nil
	}
	var err error
	if s.base, err = lookup(img.baseVol()); err != nil {
		return s, err
	}
	if s.marker, err = lookup(img.markerVol()); err != nil {
		return s, err
	}
	switch {
	case s.base == nil:
		s.reason = cacheNoBase
		return s, nil
	case s.marker == nil:
		s.reason = cacheNoMarker
		return s, nil
	}
	var buf bytes.Buffer
	if err := b.StorageVolDownload(*s.marker, &limitedWriter{w: &buf, n: markerReadLimit}, 0, markerReadLimit, 0); err != nil {
		return s, fmt.Errorf("reading image marker %s in pool %s on host %s: %w", img.markerVol(), h.Pool, h.Name, err)
	}
	s.digest = strings.ToLower(strings.TrimRight(buf.String(), "\x00\n "))
	switch {
	case !isDigest(s.digest):
		s.reason = cacheBadMarker
	case img.SHA256 != "" && s.digest != img.SHA256:
		s.reason = cacheWrongDigest
	}
	return s, nil
}

// isDigest reports whether s is a sha256 digest in lowercase hex.
func isDigest(s string) bool {
	if len(s) != markerLen {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// limitedWriter keeps at most n bytes and drops the rest: a marker is 64 bytes, and a
// volume of that name holding something else must not be read into memory whole.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if keep := min(len(p), l.n); keep > 0 {
		if _, err := l.w.Write(p[:keep]); err != nil {
			return 0, err
		}
		l.n -= keep
	}
	return len(p), nil
}

// cachedImage returns the cached base of img when it is complete. Otherwise it removes
// what an interrupted or outdated fetch left behind (a base without marker, a marker that
// is not a digest or differs from the configured sha256) and reports false, so the caller
// fetches afresh. The caller (an image job) holds the image lock.
func (p *Provider) cachedImage(log logr.Logger, b backend, h provider.KVMHost, pool libvirt.StoragePool, img image) (baseImage, bool, error) {
	s, err := inspectCache(b, h, pool, img)
	if err != nil {
		return baseImage{}, false, err
	}
	if s.complete() {
		base, err := basePath(b, h, img, *s.base)
		return base, err == nil, err
	}
	switch s.reason {
	case cacheBadMarker, cacheWrongDigest:
		log.V(1).Info("image marker forces a refetch", "marker", img.markerVol(), "reason", s.reason,
			"configuredSHA256", img.SHA256 != "")
	case cacheNoMarker:
		log.V(1).Info("removing a base image left without marker", "reason", s.reason)
	}
	// The marker goes first: a base without marker is never used, whatever happens next.
	for _, v := range []*libvirt.StorageVol{s.marker, s.base} {
		if v == nil {
			continue
		}
		if err := b.StorageVolDelete(*v, 0); err != nil && !isCode(err, libvirt.ErrNoStorageVol) {
			return baseImage{}, false, fmt.Errorf("deleting stale %s in pool %s on host %s: %w", v.Name, h.Pool, h.Name, err)
		}
	}
	return baseImage{}, false, nil
}

func basePath(b backend, h provider.KVMHost, img image, vol libvirt.StorageVol) (baseImage, error) {
	path, err := b.StorageVolGetPath(vol)
	if err != nil {
		return baseImage{}, fmt.Errorf("resolving the path of base image %s on host %s: %w", img.baseVol(), h.Name, err)
	}
	return baseImage{Vol: vol, Path: path, Format: img.Format}, nil
}
