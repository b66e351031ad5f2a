package kvm2

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"

	"github.com/digitalocean/go-libvirt"

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
		}, nil
	}
	return image{}, provider.Errorf(provider.ErrPermanent,
		"placement.image %q is neither a key in %s.images nor an http(s) URL", ref, typ)
}

// baseImage is a base image present in a host's pool.
type baseImage struct {
	Vol    libvirt.StorageVol
	Path   string
	Format string
}

// ensureImage makes sure img is cached in pool on host h and returns it.
//
// This is the seam the image cache fills: the cache checks the pool has room for the
// image and the VM's own volumes (the quota precheck), validates the marker, and
// downloads and uploads a missing base on a connection of its own. Until then it only
// looks the base and its marker up, and a base that is not complete yet is transient.
func (p *Provider) ensureImage(ctx context.Context, b backend, h provider.KVMHost, pool libvirt.StoragePool, img image) (baseImage, error) {
	_ = ctx
	vol, err := b.StorageVolLookupByName(pool, img.baseVol())
	if err != nil {
		if code, ok := libvirtCode(err); ok && code == libvirt.ErrNoStorageVol {
			return baseImage{}, provider.Errorf(provider.ErrTransient,
				"base image %s is not in pool %s on host %s yet: %w", img.baseVol(), h.Pool, h.Name, err)
		}
		return baseImage{}, fmt.Errorf("looking up base image %s in pool %s on host %s: %w", img.baseVol(), h.Pool, h.Name, err)
	}
	if _, err := b.StorageVolLookupByName(pool, img.markerVol()); err != nil {
		if code, ok := libvirtCode(err); ok && code == libvirt.ErrNoStorageVol {
			return baseImage{}, provider.Errorf(provider.ErrTransient,
				"base image %s in pool %s on host %s is not complete yet (no %s): %w",
				img.baseVol(), h.Pool, h.Name, img.markerVol(), err)
		}
		return baseImage{}, fmt.Errorf("looking up image marker %s in pool %s on host %s: %w", img.markerVol(), h.Pool, h.Name, err)
	}
	path, err := b.StorageVolGetPath(vol)
	if err != nil {
		return baseImage{}, fmt.Errorf("resolving the path of base image %s on host %s: %w", img.baseVol(), h.Name, err)
	}
	return baseImage{Vol: vol, Path: path, Format: img.Format}, nil
}
