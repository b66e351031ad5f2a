//go:build integration

package kvm2

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// TestKVM2ImageCache_realHost: the first Create downloads the image, the next finds the
// marker and downloads nothing, and a base whose marker is gone is fetched again.
func TestKVM2ImageCache_realHost(t *testing.T) {
	e := itNewRealEnv(t, "cache")
	t.Cleanup(e.removeImage)
	p := e.newProvider(itEnvOptions{diskSizeGb: 1})
	baseVol, markerVol := imagecache.BaseVolName(e.names.image(), "qcow2"), imagecache.MarkerVolName(e.names.image(), "qcow2")
	sum := sha256.Sum256(itTinyQcow2(t))
	digest := hex.EncodeToString(sum[:])

	createDelete := func(i int) {
		t.Helper()
		inst, err := createSettled(itCtxFor(t), p, e.request(e.names.vm(i), "uid-cache"))
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		if err := p.Delete(itCtxFor(t), inst.ProviderID); err != nil {
			t.Fatalf("delete %d: %v", i, err)
		}
	}

	createDelete(1)
	if n := e.img.gets.Load(); n != 1 {
		t.Fatalf("first create: %d downloads, want 1", n)
	}
	if got := e.markerContent(t, markerVol); got != digest {
		t.Fatalf("marker holds %q, want the image's sha256 %s", got, digest)
	}

	createDelete(2)
	if n := e.img.gets.Load(); n != 1 {
		t.Fatalf("second create with the marker in place: %d downloads in all, want still 1", n)
	}

	// A base without its marker is what an interrupted fetch leaves: never used, fetched again.
	itMustVirsh(t, "vol-delete", "--pool", e.host.pool, markerVol)
	createDelete(3)
	if n := e.img.gets.Load(); n != 2 {
		t.Fatalf("create after the marker was removed: %d downloads in all, want 2", n)
	}
	if !e.hasVolume(baseVol) {
		t.Fatalf("base %s missing after the refetch", baseVol)
	}
	if got := e.markerContent(t, markerVol); got != digest {
		t.Fatalf("marker after the refetch holds %q, want %s", got, digest)
	}
}

// markerContent downloads the marker volume with virsh.
func (e *itRealEnv) markerContent(t testing.TB, vol string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "marker")
	itMustVirsh(t, "vol-download", "--pool", e.host.pool, vol, f)
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimRight(string(b), "\x00\n ")
}

// TestKVM2Quota_realHost: a disk larger than the pool's free space is QuotaExceeded with
// the numbers, before anything is created.
func TestKVM2Quota_realHost(t *testing.T) {
	e := itNewRealEnv(t, "quota")
	before := e.poolVolumes()
	available := itPoolAvailable(t, e.host.pool)
	disk := int(available>>30) + 100
	p := e.newProvider(itEnvOptions{diskSizeGb: disk})
	req := e.request(e.names.vm(1), "uid-quota")

	_, err := createSettled(itCtxFor(t), p, req)
	itWantErr(t, err, provider.ErrQuotaExceeded, "storage pool "+e.host.pool+" on host "+integrationHost+" has ")
	m := regexp.MustCompile(`has (\d+) bytes available, (\d+) needed \(image (\d+), disk (\d+), seed (\d+)\)`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("quota error %q does not carry the numbers", err)
	}
	n := make([]uint64, len(m))
	for i := 1; i < len(m); i++ {
		n[i], _ = strconv.ParseUint(m[i], 10, 64)
	}
	// The image figure counts the cached copy's marker volume too.
	image := uint64(len(itTinyQcow2(t))) + imagecache.MarkerLen
	if n[3] != image || n[4] != uint64(disk)<<30 || n[2] != n[3]+n[4]+n[5] {
		t.Errorf("quota numbers %v: want image %d (with its marker), disk %d and needed = image+disk+seed", m[1:], image, uint64(disk)<<30)
	}
	// The pool's free space moves with everyone else's writes; within a GiB is the same pool.
	if diff := int64(n[1]) - int64(available); diff > 1<<30 || diff < -(1<<30) {
		t.Errorf("quota says %d bytes available, virsh pool-info says %d", n[1], available)
	}
	if n := e.img.gets.Load(); n != 0 {
		t.Errorf("the precheck downloaded the image %d times; it must only ask for its length", n)
	}
	if itHasDomain(req.Name) {
		t.Errorf("domain %s defined despite the quota error", req.Name)
	}
	if after := e.poolVolumes(); itContainsToken(after, e.names.token) {
		t.Errorf("volumes created despite the quota error: before %v after %v", before, after)
	}
}

// itPoolAvailable is the pool's free space in bytes, as virsh reports it.
func itPoolAvailable(t testing.TB, pool string) uint64 {
	t.Helper()
	for _, l := range strings.Split(itMustVirsh(t, "pool-info", "--bytes", pool), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Available:" {
			v, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("virsh pool-info %s has no Available line", pool)
	return 0
}

// TestKVM2PoolFaults_realHost: a stopped pool fails the check with PoolNotActive and
// Create permanently; a pool that does not exist is PoolNotFound.
func TestKVM2PoolFaults_realHost(t *testing.T) {
	e := itNewRealEnv(t, "pool")
	missing := e.names.token + "-nopool"
	other := e.host.kvmHost("nopool")
	other.Pool = missing
	p := e.newProvider(itEnvOptions{hosts: []provider.KVMHost{other}})

	t.Run("missing", func(t *testing.T) {
		var st provider.TargetStatus
		for _, s := range p.Check(itCtxFor(t)) {
			if s.Target == "nopool" {
				st = s
			}
		}
		if st.Ready || st.Reason != reasonPoolNotFound || !strings.Contains(st.Message, missing) {
			t.Fatalf("check of a host whose pool does not exist: %+v, want PoolNotFound naming %s", st, missing)
		}
		req := e.request(e.names.vm(1), "uid-pool")
		req.Placement.Zone = "nopool"
		_, err := createSettled(itCtxFor(t), p, req)
		itWantErr(t, err, provider.ErrPermanent, "pool "+missing, "on host nopool")
	})

	t.Run("stopped", func(t *testing.T) {
		itMustVirsh(t, "pool-destroy", e.host.pool)
		t.Cleanup(func() { itEnsurePoolRunning(t, e.host.pool) })

		st := itCheckOne(t, p)
		if st.Ready || st.Reason != reasonPoolNotActive || st.Details["poolState"] != "inactive" {
			t.Fatalf("check of a stopped pool: %+v, want PoolNotActive with poolState inactive", st)
		}
		_, err := createSettled(itCtxFor(t), p, e.request(e.names.vm(2), "uid-pool"))
		itWantErr(t, err, provider.ErrPermanent, "storage pool "+e.host.pool+" is not running")
		if n := e.img.gets.Load() + e.img.heads.Load(); n != 0 {
			t.Errorf("create on a stopped pool asked the image server %d times", n)
		}

		itEnsurePoolRunning(t, e.host.pool)
		if st := itCheckOne(t, p); !st.Ready {
			t.Fatalf("check after the pool was started again: %+v", st)
		}
	})
}

// itEnsurePoolRunning starts pool unless it runs, and waits until virsh says it does.
func itEnsurePoolRunning(t testing.TB, pool string) {
	t.Helper()
	testutil.WaitFor(t, 2*time.Minute, "pool "+pool+" to run", func() (bool, error) {
		out, err := itVirsh("pool-info", pool)
		if err == nil && regexp.MustCompile(`State:\s+running`).MatchString(out) {
			return true, nil
		}
		out2, err2 := itVirsh("pool-start", pool)
		return false, fmt.Errorf("%s%s%s", out, out2, itErrString(err2))
	}, testutil.Every(itPoll))
}

func itErrString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
