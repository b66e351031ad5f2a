//go:build integration

package kvm2

import (
	"context"
	"io"
	"os/exec"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
)

// BenchmarkKVM2Operations_realHost measures Create with the image cached, Get of the
// running domain and Delete against the real host: wall time and libvirt RPCs each.
//
//	make test-integration-kvm2 GO_TEST_FLAGS='-run=^$ -bench=_realHost -benchtime=5x'
func BenchmarkKVM2Operations_realHost(b *testing.B) {
	e := itNewRealEnv(b, "benchops")
	b.Cleanup(e.removeImage)
	p := e.newProvider(itEnvOptions{diskSizeGb: 1})
	rpcs := p.hosts.rpcs
	// Warm the image cache and the pooled connection.
	warm, err := createSettled(itCtxFor(b), p, e.request(e.names.vm(0), "uid-bench"))
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Delete(itCtxFor(b), warm.ProviderID); err != nil {
		b.Fatal(err)
	}
	var createT, getT, deleteT time.Duration
	var createN, getN, deleteN int64
	getErrs := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := e.request(e.names.vm(i+1), "uid-bench")
		rpcs.reset()
		start := time.Now()
		inst, err := createSettled(itCtxFor(b), p, req)
		if err != nil {
			b.Fatalf("create: %v", err)
		}
		createT += time.Since(start)
		createN += rpcs.total()

		rpcs.reset()
		start = time.Now()
		// Without a guest agent the address comes from ARP, which fails on some
		// kernels; the Get still makes all its calls.
		if _, err := p.Get(itCtxFor(b), inst.ProviderID); err != nil {
			getErrs++
		}
		getT += time.Since(start)
		getN += rpcs.total()

		rpcs.reset()
		start = time.Now()
		if err := p.Delete(itCtxFor(b), inst.ProviderID); err != nil {
			b.Fatalf("delete: %v", err)
		}
		deleteT += time.Since(start)
		deleteN += rpcs.total()
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(createT.Milliseconds())/n, "create-ms/op")
	b.ReportMetric(float64(createN)/n, "create-rpcs/op")
	b.ReportMetric(float64(getT.Milliseconds())/n, "get-ms/op")
	b.ReportMetric(float64(getN)/n, "get-rpcs/op")
	b.ReportMetric(float64(deleteT.Milliseconds())/n, "delete-ms/op")
	b.ReportMetric(float64(deleteN)/n, "delete-rpcs/op")
	if getErrs > 0 {
		b.Logf("%d of %d Gets found no address source answering (no guest agent, ARP unreadable)", getErrs, b.N)
	}
}

// BenchmarkKVM2ImageUpload_realHost compares the provider's image fetch (HTTP on loopback,
// hashed, uploaded with StorageVolUpload over SSH, then the marker) with a plain copy of
// the same bytes through the same sshd, in the same run.
func BenchmarkKVM2ImageUpload_realHost(b *testing.B) {
	const size = 200 << 20
	e := itNewRealEnv(b, "benchup")
	b.Cleanup(e.removeImage)
	srv := itNewPatternServer(b, size, 0)

	b.Run("provider", func(b *testing.B) {
		p := e.newProvider(itEnvOptions{format: "raw", imageURL: srv.URL + "/bench.raw"})
		h := p.cfg.Hosts[0]
		img, err := imagecache.Resolve(p.typ, p.cfg.Images, e.names.image())
		if err != nil {
			b.Fatal(err)
		}
		ctx := itCtxFor(b)
		be, err := p.hosts.pooled(ctx, h.Name)
		if err != nil {
			b.Fatal(err)
		}
		pool, err := be.StoragePoolLookupByName(h.Pool)
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(size)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := p.images.Fetch(ctx, p.log, be, h, pool, img); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			e.removeImage()
			b.StartTimer()
		}
	})

	for _, c := range []struct{ name, remote string }{
		{"ssh-cat-devnull", "cat > /dev/null"},
		{"ssh-cat-file", "cat > epo-it-bench.raw && rm -f epo-it-bench.raw"},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				cmd := exec.CommandContext(ctx, "ssh", "-F", "/dev/null", "-i", e.key, "-p", sshPort(e.host.addr),
					"-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
					"-o", "UserKnownHostsFile="+e.known, e.host.user+"@127.0.0.1", c.remote)
				cmd.Stdin = io.LimitReader(&itPatternReader{}, size)
				out, err := cmd.CombinedOutput()
				cancel()
				if err != nil {
					b.Fatalf("ssh %s: %v: %s", c.remote, err, out)
				}
			}
		})
	}
}
