//go:build integration

package kvm2

import (
	"bufio"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/imagecache"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// TestKVM2UploadKilled_realHost kills the SSH connection carrying an image upload on the
// host's side, halfway through: the Create fails transiently, leaves no goroutine behind
// and no marker, and the next Create fetches the image whole and completes. Killing every
// session of the provider also takes the connection the failed fetch would clean up
// with, so the unmarked base stays behind for the next Create to delete.
func TestKVM2UploadKilled_realHost(t *testing.T) {
	t.Run("upload connection", func(t *testing.T) { testUploadKilled(t, "upkill", false) })
	t.Run("every connection", func(t *testing.T) { testUploadKilled(t, "upkillall", true) })
}

func testUploadKilled(t *testing.T, short string, all bool) {
	const size, gateAt = 96 << 20, 24 << 20
	e := itNewRealEnv(t, short)
	t.Cleanup(e.removeImage)
	srv := itNewPatternServer(t, size, gateAt)
	ignore := goleak.IgnoreCurrent()
	opts := itEnvOptions{diskSizeGb: 1, format: "raw", imageURL: srv.URL + "/big.raw"}
	p := e.newProvider(opts)
	req := e.request(e.names.vm(1), "uid-upkill")
	base := filepath.Join(e.host.poolPath, imagecache.BaseVolName(e.names.image(), "raw"))

	type result struct{ err error }
	done := make(chan result, 1)
	wantInErr := "base image " + imagecache.BaseVolName(e.names.image(), "raw")
	go func() {
		ctx := itCtxFor(t)
		for {
			_, err := createSettled(ctx, p, req)
			// The kill also cuts the pooled connection, so a repeat Create's own call
			// (the domain lookup) may fail transiently before the job's failure is
			// collected; the reconciler retries such an error, and so does this loop,
			// until the job's failure arrives.
			if err == nil || ctx.Err() != nil || !errors.Is(err, provider.ErrTransient) || strings.Contains(err.Error(), wantInErr) {
				done <- result{err}
				return
			}
		}
	}()
	// The server has sent its first part and holds the rest back; wait until that part
	// has crossed SSH and landed in the base volume on the host.
	testutil.WaitFor(t, 5*time.Minute, "the first part of the image to land in "+base, func() (bool, error) {
		select {
		case r := <-done:
			t.Fatalf("create ended before the upload was cut: %v", r.err)
		default:
		}
		n := allocated(base)
		return srv.sent.Load() >= gateAt && n >= gateAt/2, fmt.Errorf("server sent %d bytes, %d allocated on the host", srv.sent.Load(), n)
	}, testutil.Every(itPoll))
	pids := e.killSessions(t, all)
	t.Logf("killed the sshd processes %v (every session: %v)", pids, all)

	var r result
	select {
	case r = <-done:
	case <-time.After(5 * time.Minute):
		t.Fatalf("create still running 5 minutes after its upload connection was killed")
	}
	itWantErr(t, r.err, provider.ErrTransient, wantInErr)
	t.Logf("create with the upload cut: %v", r.err)
	srv.openGate()
	if e.hasVolume(imagecache.MarkerVolName(e.names.image(), "raw")) {
		t.Fatalf("an image marker exists after a cut upload")
	}
	left := e.hasVolume(imagecache.BaseVolName(e.names.image(), "raw"))
	t.Logf("base volume left by the cut upload: %v", left)
	if all && !left {
		t.Fatalf("with every connection killed the incomplete base cannot have been removed, yet it is gone")
	}

	// No goroutine of the failed call may be left waiting on the dead connection.
	p.Close()
	srv.CloseClientConnections()
	if err := goleak.Find(ignore); err != nil {
		t.Fatalf("goroutines left after the failed upload: %v", err)
	}

	e.checkRefetch(t, e.newProvider(opts), req, srv, size)
}

// checkRefetch runs the Create after a cut upload: it fetches the image whole (the
// second download), records its digest and completes.
func (e *itRealEnv) checkRefetch(t *testing.T, p *Provider, req provider.CreateRequest, srv *itImageServer, size int64) {
	t.Helper()
	base := filepath.Join(e.host.poolPath, imagecache.BaseVolName(e.names.image(), "raw"))
	inst, err := createSettled(itCtxFor(t), p, req)
	if err != nil {
		t.Fatalf("create after the cut upload: %v", err)
	}
	if n := srv.gets.Load(); n != 2 {
		t.Errorf("%d downloads, want 2 (the cut one and a complete one)", n)
	}
	want := sha256.New()
	if _, err := io.Copy(want, io.LimitReader(&itPatternReader{}, size)); err != nil {
		t.Fatal(err)
	}
	if got := e.markerContent(t, imagecache.MarkerVolName(e.names.image(), "raw")); got != hex.EncodeToString(want.Sum(nil)) {
		t.Errorf("marker %q, want the sha256 of the whole image", got)
	}
	if fi, err := os.Stat(base); err != nil || fi.Size() != size {
		t.Errorf("base %s after the refetch: %v, size want %d", base, err, size)
	}
	if err := p.Delete(itCtxFor(t), inst.ProviderID); err != nil {
		t.Fatalf("delete: %v", err)
	}
}

// allocated is how many bytes of path are allocated on disk.
func allocated(path string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return st.Blocks * 512
}

// killSessions finds this process's SSH connection to the host that has sent the most
// bytes (the image upload), or with all every connection of this process to the host, and
// kills the sshd processes serving them on the host's side: only processes that descend
// from the host's sshd.
func (e *itRealEnv) killSessions(t *testing.T, all bool) []int {
	t.Helper()
	ports := e.mySSHPorts(t)
	if !all {
		ports = ports[:1]
	}
	listener := readPID(t, e.host.sshdPIDFile)
	var pids []int
	for _, port := range ports {
		out := itRunCmd(t, "ss", "-Htnp", "state", "established", fmt.Sprintf("( sport = :%s and dport = :%d )", sshPort(e.host.addr), port))
		n := len(pids)
		for _, m := range regexp.MustCompile(`pid=(\d+)`).FindAllStringSubmatch(out, -1) {
			pid, _ := strconv.Atoi(m[1])
			if descendsFrom(pid, listener) {
				pids = append(pids, pid)
			}
		}
		if len(pids) == n {
			t.Fatalf("no sshd process of the host (listener %d) serves port %d: %s", listener, port, out)
		}
	}
	for _, pid := range pids {
		// Killing a session's monitor may take its child with it before its turn comes.
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("killing sshd %d: %v", pid, err)
		}
	}
	return pids
}

// mySSHPorts are the local ports of this process's connections to the host's sshd, the
// one that has sent the most bytes first.
func (e *itRealEnv) mySSHPorts(t *testing.T) []int {
	t.Helper()
	out := itRunCmd(t, "ss", "-Htnpi", "state", "established", fmt.Sprintf("( dport = :%s )", sshPort(e.host.addr)))
	mine := fmt.Sprintf("pid=%d,", os.Getpid())
	sent := map[int]int64{}
	port := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) >= 4 && strings.Contains(line, "users:") {
			port = 0
			if strings.Contains(line, mine) {
				port, _ = strconv.Atoi(f[2][strings.LastIndex(f[2], ":")+1:])
				sent[port] = 0
			}
			continue
		}
		if m := regexp.MustCompile(`bytes_sent:(\d+)`).FindStringSubmatch(line); m != nil && port != 0 {
			sent[port], _ = strconv.ParseInt(m[1], 10, 64)
		}
	}
	if len(sent) == 0 {
		t.Fatalf("no connection of this process to %s in:\n%s", e.host.addr, out)
	}
	ports := slices.Collect(maps.Keys(sent))
	slices.SortFunc(ports, func(a, b int) int { return cmp.Compare(sent[b], sent[a]) })
	t.Logf("connections to sshd by local port, bytes sent: %v", sent)
	return ports
}

func sshPort(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }

func readPID(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("pid file %s: %v", file, err)
	}
	return pid
}

// descendsFrom reports whether pid is a child, grandchild... of ancestor.
func descendsFrom(pid, ancestor int) bool {
	for pid > 1 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return false
		}
		// The command name is in parentheses and may hold spaces; the ppid follows it.
		rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
		f := strings.Fields(rest)
		if len(f) < 2 {
			return false
		}
		if pid, err = strconv.Atoi(f[1]); err != nil {
			return false
		}
		if pid == ancestor {
			return true
		}
	}
	return false
}
