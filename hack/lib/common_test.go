// Package lib_test checks the shell helpers of hack/lib/common.sh that the scripts' safety
// rests on.
package lib_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startUnderLock runs `flock LOCK bash -c SCRIPT` the way the tiers run make, where
// SCRIPT starts a long-lived process and writes its pid to "$1", and returns that pid once
// flock and bash have exited.
func startUnderLock(t *testing.T, lock, start string) int {
	t.Helper()
	pidfile := filepath.Join(t.TempDir(), "pid")
	script := `source ./common.sh; ` + start
	if out, err := exec.Command("flock", lock, "bash", "-c", script, "bash", pidfile).CombinedOutput(); err != nil {
		t.Fatalf("flock %s bash -c %q: %v\n%s", lock, script, err, out)
	}
	b, err := os.ReadFile(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return pid
}

func lockFree(lock string) bool { return exec.Command("flock", "-n", lock, "true").Run() == nil }

// A daemon started with without_fds (or spawn) under `flock FILE ...` does not keep the
// lock once the command holding it ends; one started plainly does, which is how a
// libvirtd started under `flock /tmp/epo-libvirt-host.lock make ...` held everyone off.
func TestDaemonsDropTheCallersLock(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, start string
		keepsLock   bool
	}{
		// a daemon forking itself away, as virtlogd -d does
		{"plain", `bash -c 'sleep 300 >/dev/null 2>&1 & echo $! >"$0"' "$1"`, true},
		{"without_fds", `without_fds bash -c 'sleep 300 >/dev/null 2>&1 & echo $! >"$0"' "$1"`, false},
		{"spawn", `spawn "$1" /dev/null sleep 300`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lock := filepath.Join(dir, tc.name+".lock")
			pid := startUnderLock(t, lock, tc.start)
			// setsid execs the command in place, a moment after the fork
			var comm []byte
			for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
				if comm, _ = os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm"); strings.TrimSpace(string(comm)) == "sleep" {
					break
				}
			}
			if strings.TrimSpace(string(comm)) != "sleep" {
				t.Fatalf("pid %d is %q, want the started command itself, sleep", pid, comm)
			}
			// The started process closes the descriptors after its fork: give it time.
			deadline := time.Now().Add(10 * time.Second)
			free := lockFree(lock)
			for !free && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
				free = lockFree(lock)
			}
			if free == tc.keepsLock {
				t.Errorf("lock free after the locked command ended (waited up to 10s): %v, want %v", free, !tc.keepsLock)
			}
		})
	}
}
