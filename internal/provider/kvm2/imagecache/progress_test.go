package imagecache

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// TestImageProgressReports: the download reports once at its start, then at most every
// progressEvery while bytes arrive, each report also a V(1) line.
func TestImageProgressReports(t *testing.T) {
	c, logs := newTestCache(t, nil)
	body := testBody(testImageSize)
	img := Image{Key: "debian-13", URL: "https://images.example/debian-13.qcow2", Format: "qcow2"}
	host := "h1"
	const every = 40 * time.Millisecond
	c.ProgressEvery = every
	var (
		mu      sync.Mutex
		reports []provider.Progress
		at      []time.Time
	)
	ctx := provider.WithProgress(context.Background(), func(p provider.Progress) {
		mu.Lock()
		reports, at = append(reports, p), append(at, time.Now())
		mu.Unlock()
	})
	last := func() provider.Progress { mu.Lock(); defer mu.Unlock(); return reports[len(reports)-1] }
	h := provider.KVMHost{Name: host}
	pr, pw := io.Pipe()
	src := NewSourceReader(pr)
	stop := c.reportProgress(ctx, c.log, h, img, src, testImageSize)
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf := make([]byte, 64<<10)
		for {
			if _, err := src.Read(buf); err != nil {
				return
			}
		}
	}()
	for i := range 3 {
		pw.Write(body[i<<20 : (i+1)<<20])
		testutil.WaitFor(t, waitLong, fmt.Sprintf("a report of MiB %d", i+1), func() (bool, error) {
			return last().Done == int64(i+1)<<20, fmt.Errorf("last report %+v", last())
		})
	}
	stop()
	pw.Close()
	<-read
	src.Finish()
	mu.Lock()
	defer mu.Unlock()
	first := reports[0]
	if first.Reason != provider.ReasonImageDownloading || first.Done != 0 || first.Total != testImageSize ||
		first.Message != "downloading base image debian-13 to host "+host+": 0.0 MiB of 3.0 MiB (0%)" {
		t.Fatalf("first report %+v", first)
	}
	var sawMiB bool
	for i, r := range reports {
		sawMiB = sawMiB || r.Message == "downloading base image debian-13 to host "+host+": 1.0 MiB of 3.0 MiB (33%)"
		if i > 0 && at[i].Sub(at[i-1]) < every {
			t.Fatalf("reports %d and %d only %s apart, want at least %s", i-1, i, at[i].Sub(at[i-1]), every)
		}
	}
	if !sawMiB || len(reports) < 4 {
		t.Fatalf("reports %+v, want the start and one per MiB", reports)
	}
	if lines := logs.find(`"msg":"downloading base image"`, `"total":`+strconv.Itoa(testImageSize)); len(lines) != len(reports) {
		t.Fatalf("%d progress lines for %d reports", len(lines), len(reports))
	}
}
