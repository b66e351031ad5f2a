// Package scripts tests the shell helpers under hack/ that need no libvirt host.
package scripts

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

var repoRoot = filepath.Join("..", "..")

// TestDetachedKeepsNoLock: a daemon started through hack/lib/libvirt-host-parts.sh's
// detached, by a script run under `flock LOCK ...`, does not hold LOCK once the script
// has ended (it would inherit flock's descriptor and keep every later flock waiting).
func TestDetachedKeepsNoLock(t *testing.T) {
	for _, tool := range []string{"flock", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (util-linux, bash): %v", tool, err)
		}
	}
	lock := filepath.Join(t.TempDir(), "lock")
	// The "daemon" forks into the background and leaves, as virtlogd -d and libvirtd -d do.
	script := `source hack/lib/common.sh && source hack/lib/libvirt-host-parts.sh && ` +
		`detached sh -c 'sleep 300 >/dev/null 2>&1 & echo $!'`
	cmd := exec.Command("flock", lock, "bash", "-c", script)
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("flock %s bash -c %q: %v (%s)", lock, script, err, out)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("the daemon's pid: %q: %v", out, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the daemon (pid %d) is not running: %v", pid, err)
	}
	if err := exec.Command("flock", "-n", lock, "true").Run(); err != nil {
		t.Fatalf("%s is still locked after the script ended, by the daemon it started (pid %d): %v", lock, pid, err)
	}
}
