package kvm2

import (
	"strconv"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
)

// setAvailable makes the pool's free space exactly avail bytes.
func setAvailable(t *testing.T, f *libvirtfake.Fake, avail uint64) {
	t.Helper()
	info, _ := f.Pool(libvirtfake.DefaultPool)
	if err := f.SetPoolCapacity(libvirtfake.DefaultPool, info.Allocation+avail); err != nil {
		t.Fatal(err)
	}
	if info, _ = f.Pool(libvirtfake.DefaultPool); info.Available != avail {
		t.Fatalf("pool has %d bytes available, want %d", info.Available, avail)
	}
}

func TestPoolSpaceBoundary(t *testing.T) {
	const disk = uint64(10 << 30)
	for _, tc := range []struct {
		name   string
		cached bool
		spare  int64 // available minus needed
	}{
		{name: "image to fetch, exactly enough", spare: 0},
		{name: "image to fetch, one byte short", spare: -1},
		{name: "cached image, exactly enough", cached: true, spare: 0},
		{name: "cached image, one byte short", cached: true, spare: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, withImageServer(nil), withTestHost("img"))
			imageBytes := uint64(testImageSize + imagecache.MarkerLen) // the base and its marker
			if tc.cached {
				e.putCached(t, e.srv.digest)
				imageBytes = 0
			}
			need := imageBytes + disk + 16<<20
			avail := uint64(int64(need) + tc.spare)
			setAvailable(t, e.fake, avail)
			_, err := e.create("vm-a")
			if tc.spare >= 0 {
				if err != nil {
					t.Fatalf("needed == available must pass: %v", err)
				}
				return
			}
			wantClass(t, err, provider.ErrQuotaExceeded, nil)
			for _, want := range []string{"storage pool default", strconv.FormatUint(avail, 10) + " bytes available",
				strconv.FormatUint(need, 10) + " needed"} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("quota error %q does not say %q", err, want)
				}
			}
			if info, _ := e.fake.Pool(libvirtfake.DefaultPool); len(info.Volumes) != map[bool]int{true: 2}[tc.cached] {
				t.Fatalf("volumes created despite the quota: %v", info.Volumes)
			}
			if e.srv.gets.Load() != 0 {
				t.Fatal("the image was downloaded despite the quota")
			}
		})
	}
}

func TestPoolNotRunningIsPermanent(t *testing.T) {
	e := newTestEnv(t, withImageServer(nil), withTestHost("img"))
	if err := e.fake.SetPoolActive(libvirtfake.DefaultPool, false); err != nil {
		t.Fatal(err)
	}
	_, err := e.create("vm-a")
	wantClass(t, err, provider.ErrPermanent, nil)
	if !strings.Contains(err.Error(), "storage pool default is not running") {
		t.Fatalf("error %q", err)
	}
	if e.srv.heads.Load()+e.srv.gets.Load() != 0 {
		t.Fatal("the image URL was asked although the pool is stopped")
	}
}
