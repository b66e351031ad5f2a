package imagecache

import (
	"context"
	"fmt"
	"net/http"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// seedReserve is what the precheck sets aside for the seed ISO, which is tens of KiB.
const seedReserve = 16 << 20

// neededBytes is what a Create commits to a pool: the image when it is not cached yet,
// the overlay at its full capacity and the seed.
func neededBytes(imageBytes uint64, diskSizeGb int) uint64 {
	return imageBytes + uint64(diskSizeGb)<<30 + seedReserve
}

// checkPoolSpace is the pool-space precheck, run before a Create makes any volume: the
// pool must be running and have room for everything the Create is about to put in it.
// Too little room is ErrQuotaExceeded, which the reconciler answers with a wait. It
// returns what the pool holds of the image, for the image step (Base).
func (c *Cache) checkPoolSpace(ctx context.Context, b Storage, h provider.KVMHost, pool libvirt.StoragePool, img Image) (cacheState, error) {
	state, _, _, available, err := b.StoragePoolGetInfo(pool)
	if err != nil {
		return cacheState{}, fmt.Errorf("reading pool %s on host %s: %w", h.Pool, h.Name, err)
	}
	if libvirt.StoragePoolState(state) != libvirt.StoragePoolRunning {
		return cacheState{}, provider.Errorf(provider.ErrPermanent,
			"storage pool %s is not running on host %s; start it with virsh pool-start and virsh pool-autostart", h.Pool, h.Name)
	}
	cache, err := inspectCache(b, h, pool, img)
	if err != nil {
		return cacheState{}, err
	}
	var imageBytes uint64
	if !cache.complete() {
		n, err := c.imageLength(ctx, img)
		if err != nil {
			return cacheState{}, err
		}
		// The marker is written next to the base, after the fetch.
		imageBytes = uint64(n) + MarkerLen
	}
	need := neededBytes(imageBytes, c.cfg.DiskSizeGb)
	if need > available {
		return cacheState{}, provider.Errorf(provider.ErrQuotaExceeded,
			"storage pool %s on host %s has %d bytes available, %d needed (image %d, disk %d, seed %d)",
			h.Pool, h.Name, available, need, imageBytes, uint64(c.cfg.DiskSizeGb)<<30, uint64(seedReserve))
	}
	return cache, nil
}

// imageLength asks the image URL for its size without downloading it: a HEAD, or when the
// mirror answers HEAD with anything but 2xx (many refuse it, with 405, 403 or 501 alike) a
// GET whose body is closed unread, and whose status is then the one that counts. A URL the
// policy refuses is not asked again.
func (c *Cache) imageLength(ctx context.Context, img Image) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Head)
	defer cancel()
	resp, err := c.GetImage(ctx, http.MethodHead, img)
	if err != nil && (IsPolicyError(err) || provider.Class(err) == provider.ErrTransient && ctx.Err() != nil) {
		return 0, err
	}
	if err != nil {
		resp, err = c.GetImage(ctx, http.MethodGet, img)
		if err != nil {
			return 0, err
		}
	}
	resp.Body.Close()
	return resp.ContentLength, nil
}
