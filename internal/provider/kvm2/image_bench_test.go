package kvm2

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/sshtest"
)

// The image streaming benchmark: an image served from loopback HTTP is streamed through
// the in-process SSH server into the fake's RPC server (imagecache's Fetch, the production path),
// and the same bytes are copied raw through the same SSH server into a socket that
// discards them. The operator side runs in a child process, so its peak RSS is its own
// and not the fake's, which keeps the uploaded image in memory.
//
//	go test -run '^$' -bench BenchmarkImageStream -benchtime 1x ./internal/provider/kvm2/
//
// KVM2_BENCH_IMAGE_BYTES sets the image size (default 1 GiB), KVM2_BENCH_ROUNDS the rounds
// of the comparison (default 3). The fake keeps uploaded bytes in a slice it grows as they
// arrive, which costs more than the rest of the path together; the upload into a volume
// whose slice is already full size is the figure to compare with the raw copy.

const (
	benchChildEnv = "KVM2_IMAGE_STREAM_CHILD"
	benchRawSock  = "/run/bench/raw.sock"  // discards what arrives
	benchKeepSock = "/run/bench/keep.sock" // keeps it in memory, grown as the fake grows a volume
	benchMarker   = "KVM2BENCH "
	benchPreVol   = "bench-preallocated.raw"
)

type benchResult struct {
	Bytes         int64   `json:"bytes"`
	ImageSeconds  float64 `json:"imageSeconds"`
	RawSeconds    float64 `json:"rawSeconds"`
	KeepSeconds   float64 `json:"keepSeconds"`
	PreSeconds    float64 `json:"preSeconds"` // UploadImage into a volume whose memory exists
	ImageCPU      float64 `json:"imageCPU"`   // operator-side CPU seconds, user plus system
	RawCPU        float64 `json:"rawCPU"`
	HWMBeforeKiB  int64   `json:"hwmBeforeKiB"`
	HWMAfterKiB   int64   `json:"hwmAfterKiB"`
	HWMResetWorks bool    `json:"hwmResetWorks"`
}

func BenchmarkImageStream(b *testing.B) {
	size := int64(1 << 30)
	if v := os.Getenv("KVM2_BENCH_IMAGE_BYTES"); v != "" {
		size = must(strconv.ParseInt(v, 10, 64))
	}
	fake := libvirtfake.New()
	srv := sshtest.NewEnv(b, fake.ServeConn)
	srv.Handle(benchRawSock, func(c net.Conn) {
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "%d\n", n)
	})
	srv.Handle(benchKeepSock, func(c net.Conn) {
		defer c.Close()
		var kept []byte
		buf := make([]byte, 256<<10)
		for {
			n, err := c.Read(buf)
			kept = append(kept, buf[:n]...)
			if err != nil {
				break
			}
		}
		fmt.Fprintf(c, "%d\n", len(kept))
	})
	block := make([]byte, 1<<20)
	rand.Read(block)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		for left := size; left > 0 && r.Method == http.MethodGet; {
			n, err := w.Write(block[:min(left, int64(len(block)))])
			if err != nil {
				return
			}
			left -= int64(n)
		}
	}))
	b.Cleanup(web.Close)
	for i := 0; i < b.N; i++ {
		pool := must(fake.StoragePoolLookupByName(libvirtfake.DefaultPool))
		for _, name := range []string{"base-bench.raw", "base-bench.raw.sha256"} {
			if vol, err := fake.StorageVolLookupByName(pool, name); err == nil {
				_ = fake.StorageVolDelete(vol, 0)
			}
		}
		// The fake keeps a volume's bytes in a slice that grows as they arrive; a volume
		// whose slice is already full size shows the streaming path without that cost.
		if err := fake.PutVolume(libvirtfake.DefaultPool, libvirtfake.VolumeInfo{Name: benchPreVol,
			Content: make([]byte, size)}); err != nil {
			b.Fatal(err)
		}
		res := runBenchChild(b, srv, web.URL+"/bench.raw")
		mb := float64(res.Bytes) / 1e6
		b.ReportMetric(mb/res.ImageSeconds, "image-MB/s")
		b.ReportMetric(mb/res.RawSeconds, "raw-MB/s")
		b.ReportMetric(res.RawSeconds/res.ImageSeconds, "ratio")
		b.ReportMetric(mb/res.KeepSeconds, "raw-kept-MB/s")
		b.ReportMetric(mb/res.PreSeconds, "upload-prealloc-MB/s")
		b.ReportMetric(res.RawSeconds/res.PreSeconds, "ratio-prealloc")
		b.ReportMetric(res.ImageCPU/(mb/1000), "image-cpu-s/GB")
		b.ReportMetric(res.RawCPU/(mb/1000), "raw-cpu-s/GB")
		b.ReportMetric(res.KeepSeconds/res.ImageSeconds, "ratio-kept")
		b.ReportMetric(float64(res.HWMAfterKiB-res.HWMBeforeKiB)/1024, "rss-growth-MiB")
		b.ReportMetric(float64(res.HWMAfterKiB)/1024, "peak-rss-MiB")
		b.Logf("upload into a preallocated volume %.1f MB/s (ratio to raw %.3f)", mb/res.PreSeconds, res.RawSeconds/res.PreSeconds)
		b.Logf("%d bytes: image %.1f MB/s, raw %.1f MB/s (ratio %.3f), raw kept in memory %.1f MB/s (ratio %.3f); "+
			"operator CPU %.2f s (image) vs %.2f s (raw); VmHWM %d KiB before, %d KiB after (reset works: %v)",
			res.Bytes, mb/res.ImageSeconds, mb/res.RawSeconds, res.RawSeconds/res.ImageSeconds,
			mb/res.KeepSeconds, res.KeepSeconds/res.ImageSeconds, res.ImageCPU, res.RawCPU,
			res.HWMBeforeKiB, res.HWMAfterKiB, res.HWMResetWorks)
	}
}

func runBenchChild(b *testing.B, srv *sshtest.Env, imageURL string) benchResult {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestImageStreamChild$", "-test.v")
	cmd.Env = append(os.Environ(), benchChildEnv+"=1", "BENCH_URL="+imageURL, "BENCH_ADDR="+srv.Addr,
		"BENCH_USER="+srv.User, "BENCH_KEY="+srv.KeyFile, "BENCH_KNOWN_HOSTS="+srv.KnownHostsFile, "BENCH_SOCKET="+srv.Socket)
	if prof := os.Getenv("KVM2_BENCH_CPUPROFILE"); prof != "" {
		cmd.Args = append(cmd.Args, "-test.cpuprofile="+prof)
	}
	out, err := cmd.CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if i := strings.Index(line, benchMarker); i >= 0 {
			var res benchResult
			if jerr := json.Unmarshal([]byte(line[i+len(benchMarker):]), &res); jerr != nil {
				b.Fatal(jerr)
			}
			if err != nil {
				b.Fatalf("child: %v\n%s", err, out)
			}
			return res
		}
	}
	b.Fatalf("child printed no result (%v):\n%s", err, out)
	return benchResult{}
}

// TestImageStreamChild is the operator side of BenchmarkImageStream; it runs only in the
// child process the benchmark starts.
func TestImageStreamChild(t *testing.T) {
	if os.Getenv(benchChildEnv) == "" {
		t.Skip("the operator side of BenchmarkImageStream")
	}
	host := provider.KVMHost{Name: "bench", Address: os.Getenv("BENCH_ADDR"), User: os.Getenv("BENCH_USER"),
		Socket: os.Getenv("BENCH_SOCKET"), Bridge: "br0"}
	cfg := provider.KVMConfig{SSHKeyFile: os.Getenv("BENCH_KEY"), KnownHostsFile: os.Getenv("BENCH_KNOWN_HOSTS"),
		Hosts: []provider.KVMHost{host}, Images: map[string]provider.KVMImage{"bench": {URL: os.Getenv("BENCH_URL"), Format: "raw"}},
		MachineTypes: map[string]provider.KVMMachineType{"small": {VCPUs: 1, MemoryMiB: 512}}}.WithDefaults()
	p, err := New(provider.ProviderConfig{Name: "bench", Type: provider.TypeKVM2, KVM2: &cfg}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	img := must(imagecache.Resolve("kvm2", cfg.Images, "bench"))
	ctx := context.Background()
	b, err := p.hosts.pooled(ctx, host.Name)
	if err != nil {
		t.Fatal(err)
	}
	h := cfg.Hosts[0]
	pool := must(b.StoragePoolLookupByName(h.Pool))

	var res benchResult
	runtime.GC()
	res.HWMResetWorks = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	res.HWMBeforeKiB = vmHWM(t)
	start, cpu := time.Now(), cpuSeconds()
	if _, err := p.images.Fetch(ctx, logr.Discard(), b, h, pool, img); err != nil {
		t.Fatal(err)
	}
	res.ImageSeconds, res.ImageCPU = time.Since(start).Seconds(), cpuSeconds()-cpu
	res.HWMAfterKiB = vmHWM(t)

	// The machine is shared, so the streaming path and the raw copies alternate for a few
	// rounds and the best time of each counts.
	pre := must(b.StorageVolLookupByName(pool, benchPreVol))
	best := func(cur *float64, d time.Duration) {
		if *cur == 0 || d.Seconds() < *cur {
			*cur = d.Seconds()
		}
	}
	for range benchRounds() {
		resp, err := p.images.GetImage(ctx, http.MethodGet, img)
		if err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		_, err = p.images.UploadImage(ctx, logr.Discard(), h, img, pre, resp.Body, resp.ContentLength)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		best(&res.PreSeconds, time.Since(start))

		start, cpu = time.Now(), cpuSeconds()
		res.Bytes = rawCopy(t, p.images.Client(), img.URL, benchRawSock)
		best(&res.RawSeconds, time.Since(start))
		res.RawCPU = cpuSeconds() - cpu

		start = time.Now()
		rawCopy(t, p.images.Client(), img.URL, benchKeepSock)
		best(&res.KeepSeconds, time.Since(start))
	}
	fmt.Println(benchMarker + string(must(json.Marshal(res))))
}

// rawCopy copies the body of url through a new SSH connection into socket
// and returns the byte count the far end confirmed. It fetches with the provider's own
// HTTP client, so the two runs differ only in what lies between the body and SSH.
func rawCopy(t *testing.T, client *http.Client, url, socket string) int64 {
	key := must(os.ReadFile(os.Getenv("BENCH_KEY")))
	signer := must(ssh.ParsePrivateKey(key))
	hostKeys := must(knownhosts.New(os.Getenv("BENCH_KNOWN_HOSTS")))
	sc, err := ssh.Dial("tcp", os.Getenv("BENCH_ADDR"), &ssh.ClientConfig{User: os.Getenv("BENCH_USER"),
		Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hostKeys})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	ch, err := sc.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(ch, resp.Body); err != nil {
		t.Fatal(err)
	}
	ch.(interface{ CloseWrite() error }).CloseWrite()
	line, err := bufio.NewReader(ch).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return must(strconv.ParseInt(strings.TrimSpace(line), 10, 64))
}

// vmHWM is the process's peak resident set size in KiB.
func vmHWM(t *testing.T) int64 {
	status := must(os.ReadFile("/proc/self/status"))
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return must(strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64))
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// benchRounds is KVM2_BENCH_ROUNDS, 3 by default.
func benchRounds() int {
	if n, err := strconv.Atoi(os.Getenv("KVM2_BENCH_ROUNDS")); err == nil && n > 0 {
		return n
	}
	return 3
}

// cpuSeconds is the CPU time the process has used, user plus system.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
