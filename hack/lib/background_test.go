package lib_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// background runs hack/background.sh with its state in dir and returns its combined
// output and exit status.
func background(t *testing.T, dir string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("../background.sh", args...)
	cmd.Env = append(os.Environ(), "BACKGROUND_STATE="+dir)
	out, err := cmd.CombinedOutput()
	if err == nil {
		return string(out), 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	}
	t.Fatalf("background.sh %v: %v", args, err)
	return "", 0
}

// owner starts a process standing in for make, and stops it when the test ends.
func owner(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func mustContain(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("%s: want %q in:\n%s", what, w, out)
		}
	}
}

// TestBackgroundJobStatus: wait prints a job's output and returns its exit status; with
// --advisory a failure is reported and not returned.
func TestBackgroundJobStatus(t *testing.T) {
	dir := t.TempDir()
	pid := strconv.Itoa(owner(t).Process.Pid)
	for _, job := range [][]string{
		{"passes", "bash", "-c", "echo made it"},
		{"fails", "bash", "-c", "echo broke it >&2; exit 3"},
	} {
		if out, rc := background(t, dir, append([]string{"start", pid}, job...)...); rc != 0 {
			t.Fatalf("start %s: exit %d\n%s", job[0], rc, out)
		}
	}
	out, rc := background(t, dir, "wait", "passes")
	if rc != 0 {
		t.Errorf("wait passes: exit %d, want 0\n%s", rc, out)
	}
	mustContain(t, "wait passes", out, "[passes] made it", "passes: passed")

	out, rc = background(t, dir, "wait", "fails")
	if rc != 3 {
		t.Errorf("wait fails: exit %d, want the job's 3\n%s", rc, out)
	}
	mustContain(t, "wait fails", out, "[fails] broke it", "fails: failed (exit 3)", filepath.Join(dir, "fails.log"))

	out, rc = background(t, dir, "wait", "--advisory", "fails")
	if rc != 0 {
		t.Errorf("wait --advisory fails: exit %d, want 0\n%s", rc, out)
	}
	mustContain(t, "wait --advisory fails", out, "the background run failed (exit 3)", "built it itself")
}

// TestBackgroundJobRunsAtNice19: the job runs at the lowest priority until someone waits
// for it.
func TestBackgroundJobRunsAtNice19(t *testing.T) {
	dir := t.TempDir()
	pid := strconv.Itoa(owner(t).Process.Pid)
	marker := filepath.Join(t.TempDir(), "nice")
	release := filepath.Join(t.TempDir(), "release")
	script := fmt.Sprintf("nice >%s.tmp && mv %s.tmp %s; while [ ! -e %s ]; do sleep 0.1; done; nice", marker, marker, marker, release)
	if out, rc := background(t, dir, "start", pid, "niced", "bash", "-c", script); rc != 0 {
		t.Fatalf("start: exit %d\n%s", rc, out)
	}
	var got string
	testutil.WaitFor(t, testutil.WaitLong, "the job to write its niceness", func() (bool, error) {
		b, err := os.ReadFile(marker)
		got = strings.TrimSpace(string(b))
		return err == nil, err
	})
	if got != "19" {
		t.Errorf("the job ran at nice %q, want 19", got)
	}
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	out, rc := background(t, dir, "wait", "niced")
	if rc != 0 {
		t.Fatalf("wait: exit %d\n%s", rc, out)
	}
	// What the job printed after wait gave it the normal priority back, or 19 when it had
	// finished before wait looked: both are right, anything else is not.
	last := strings.TrimSpace(out[strings.LastIndex(out, "[niced] ")+len("[niced] "):])
	last = strings.SplitN(last, "\n", 2)[0]
	if last != "0" && last != "19" {
		t.Errorf("after wait the job printed nice %q, want 0 (or 19 if it had finished)\n%s", last, out)
	}
}

// TestBackgroundJobStopsWithItsOwner: when the process that started a job ends without
// waiting for it, the job and its children are stopped, and a wait says so.
func TestBackgroundJobStopsWithItsOwner(t *testing.T) {
	dir := t.TempDir()
	own := owner(t)
	pidfile := filepath.Join(t.TempDir(), "child")
	script := fmt.Sprintf("sleep 600 & echo $! >%s.tmp && mv %s.tmp %s; wait", pidfile, pidfile, pidfile)
	if out, rc := background(t, dir, "start", strconv.Itoa(own.Process.Pid), "orphan", "bash", "-c", script); rc != 0 {
		t.Fatalf("start: exit %d\n%s", rc, out)
	}
	var child int
	testutil.WaitFor(t, testutil.WaitLong, "the job to start its child", func() (bool, error) {
		b, err := os.ReadFile(pidfile)
		if err != nil {
			return false, err
		}
		child, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil, err
	})
	if out, rc := background(t, dir, "start", strconv.Itoa(own.Process.Pid), "orphan", "true"); rc == 0 || !strings.Contains(out, "job orphan is already running") {
		t.Errorf("a second start of a running job: exit %d, want an error naming it\n%s", rc, out)
	}
	if err := own.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = own.Wait()
	testutil.WaitFor(t, testutil.WaitLong, "the job's child to be stopped", func() (bool, error) {
		err := syscall.Kill(child, 0)
		return err == syscall.ESRCH, fmt.Errorf("pid %d: kill -0: %v", child, err)
	}, testutil.Every(100*time.Millisecond))
	out, rc := background(t, dir, "wait", "orphan")
	if rc == 0 {
		t.Errorf("wait for a stopped job: exit 0, want a failure\n%s", out)
	}
	mustContain(t, "wait orphan", out, "which started this job, has ended without waiting for it", "gone without an exit status")
}

// TestBackgroundUsageErrors: each refusal names what is wrong.
func TestBackgroundUsageErrors(t *testing.T) {
	dir := t.TempDir()
	pid := strconv.Itoa(owner(t).Process.Pid)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"wait", "never-started"}, "no job never-started was started"},
		{[]string{"start", pid, "Bad_Name", "true"}, "job name 'Bad_Name'"},
		{[]string{"start", "999999999", "job", "true"}, "owner pid '999999999' is not a running process"},
		{[]string{"start", pid, "job"}, "usage:"},
		{[]string{"frobnicate"}, "usage:"},
	} {
		out, rc := background(t, dir, c.args...)
		if rc == 0 || !strings.Contains(out, c.want) {
			t.Errorf("background.sh %v: exit %d, want a failure with %q\n%s", c.args, rc, c.want, out)
		}
	}
}
