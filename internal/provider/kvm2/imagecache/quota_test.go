package imagecache

import (
	"context"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

func TestNeededBytes(t *testing.T) {
	if got, want := neededBytes(435_000_000, 10), uint64(435_000_000+10<<30+16<<20); got != want {
		t.Fatalf("neededBytes = %d, want %d", got, want)
	}
	if got := neededBytes(0, 0); got != 16<<20 {
		t.Fatalf("a cached image and no disk still reserve the seed: %d", got)
	}
}

func TestImageLengthLookup(t *testing.T) {
	c, _ := newTestCache(t, nil)
	srv := newLengthServer(t)
	img := must(Resolve("kvm2", map[string]provider.KVMImage{"debian-13": {URL: srv.URL + "/images/debian.qcow2"}}, "debian-13"))
	for _, tc := range []struct {
		mode        string
		heads, gets int32
		class       error
	}{
		{mode: serveOK, heads: 1},
		{mode: serveHead405, heads: 1, gets: 1},
		{mode: "501", heads: 1, gets: 1, class: provider.ErrTransient},
		{mode: "403", heads: 1, gets: 1, class: provider.ErrPermanent},
		{mode: serveChunked, heads: 1, gets: 1, class: provider.ErrPermanent},
	} {
		srv.heads.Store(0)
		srv.gets.Store(0)
		srv.setMode(tc.mode)
		n, err := c.imageLength(context.Background(), img)
		if tc.class == nil && (err != nil || n != testImageSize) {
			t.Fatalf("%s: length %d, %v", tc.mode, n, err)
		}
		if tc.class != nil {
			wantClass(t, err, tc.class)
		}
		if srv.heads.Load() != tc.heads || srv.gets.Load() != tc.gets {
			t.Fatalf("%s: %d HEADs and %d GETs, want %d and %d", tc.mode, srv.heads.Load(), srv.gets.Load(), tc.heads, tc.gets)
		}
	}
}
