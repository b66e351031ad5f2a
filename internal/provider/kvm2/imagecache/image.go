package imagecache

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// image is a resolved placement.image: where the bytes come from, what they are and the
// key the cached copy is stored under.
type Image struct {
	// Key is the catalogue key, or for a URL used directly the first 16 hex characters
	// of the URL's sha256.
	Key      string
	URL      string
	SHA256   string
	Format   string
	Firmware string
	// fromSpec: the URL came from the Proxy's placement.image, not the catalogue, and is
	// fetched behind the image URL policy (urlpolicy.go).
	fromSpec bool
}

// BaseVol and MarkerVol name the cached copy in a host's pool.
func (img Image) BaseVol() string   { return BaseVolName(img.Key, img.Format) }
func (img Image) MarkerVol() string { return MarkerVolName(img.Key, img.Format) }

// Resolve maps placement.image to an image: a key of the catalogue, or an http(s)
// URL used directly with the defaults (qcow2, uefi). Anything else is permanent.
func Resolve(typ string, catalogue map[string]provider.KVMImage, ref string) (Image, error) {
	if e, ok := catalogue[ref]; ok {
		img := Image{Key: ref, URL: e.URL, SHA256: strings.ToLower(e.SHA256), Format: e.Format, Firmware: e.Firmware}
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
		return Image{
			Key:      hex.EncodeToString(sum[:])[:16],
			URL:      ref,
			Format:   provider.DefaultImageFormat,
			Firmware: provider.DefaultFirmware,
			fromSpec: true,
		}, nil
	}
	return Image{}, provider.Errorf(provider.ErrPermanent,
		"placement.image %q is neither a key in %s.images nor an http(s) URL", provider.RedactURL(ref), typ)
}

// Base is a base image present in a host's pool.
type Base struct {
	Vol    libvirt.StorageVol
	Path   string
	Format string
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
	MarkerLen        = 64
	markerReadLimit  = 4 * MarkerLen
)

// inspectCache reads what pool holds of img without changing anything: the precheck, and
// through it the cached path of a Create, uses it without the image lock.
func inspectCache(b Storage, h provider.KVMHost, pool libvirt.StoragePool, img Image) (cacheState, error) {
	var s cacheState
	lookup := func(name string) (*libvirt.StorageVol, error) {
		vol, err := b.StorageVolLookupByName(pool, name)
		if isNoVolume(err) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("looking up %s in pool %s on host %s: %w", name, h.Pool, h.Name, err)
		}
		return &vol, nil
	}
	var err error
	if s.base, err = lookup(img.BaseVol()); err != nil {
		return s, err
	}
	if s.marker, err = lookup(img.MarkerVol()); err != nil {
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
		return s, fmt.Errorf("reading image marker %s in pool %s on host %s: %w", img.MarkerVol(), h.Pool, h.Name, err)
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
	if len(s) != MarkerLen {
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
func (c *Cache) cachedImage(log logr.Logger, b Storage, h provider.KVMHost, pool libvirt.StoragePool, img Image) (Base, bool, error) {
	s, err := inspectCache(b, h, pool, img)
	if err != nil {
		return Base{}, false, err
	}
	if s.complete() {
		base, err := basePath(b, h, img, *s.base)
		return base, err == nil, err
	}
	switch s.reason {
	case cacheBadMarker, cacheWrongDigest:
		log.V(1).Info("image marker forces a refetch", "marker", img.MarkerVol(), "reason", s.reason,
			"configuredSHA256", img.SHA256 != "")
	case cacheNoMarker:
		log.V(1).Info("removing a base image left without marker", "reason", s.reason)
	}
	// The marker goes first: a base without marker is never used, whatever happens next.
	for _, v := range []*libvirt.StorageVol{s.marker, s.base} {
		if v == nil {
			continue
		}
		if err := b.StorageVolDelete(*v, 0); err != nil && !isNoVolume(err) {
			return Base{}, false, fmt.Errorf("deleting stale %s in pool %s on host %s: %w", v.Name, h.Pool, h.Name, err)
		}
	}
	return Base{}, false, nil
}

func basePath(b Storage, h provider.KVMHost, img Image, vol libvirt.StorageVol) (Base, error) {
	path, err := b.StorageVolGetPath(vol)
	if err != nil {
		return Base{}, fmt.Errorf("resolving the path of base image %s on host %s: %w", img.BaseVol(), h.Name, err)
	}
	return Base{Vol: vol, Path: path, Format: img.Format}, nil
}

// BaseVolName is the cached base image of catalogue key (or URL key) key.
func BaseVolName(key, format string) string { return "base-" + key + "." + format }

// MarkerVolName is the small raw volume holding the base image's digest; its presence
// marks the base as complete.
func MarkerVolName(key, format string) string { return BaseVolName(key, format) + ".sha256" }
