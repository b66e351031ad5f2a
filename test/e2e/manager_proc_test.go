//go:build e2e

package e2e

import (
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestManagerOutlivesTheThreadThatStartedIt: the manager process must not get its
// Pdeathsig when the OS thread it was started from ends. Here that thread is made to end
// at once (start is called from a goroutine that returns locked to it, as the edge
// namespace's listeners do); the manager (a sleep standing in for it) must still be
// running a while later.
func TestManagerOutlivesTheThreadThatStartedIt(t *testing.T) {
	m := &manager{t: t, bin: "/bin/sleep", args: []string{"60"}, logPath: filepath.Join(t.TempDir(), "manager.log")}
	// The thread must not be the main one, which Go never ends (a goroutine returning
	// locked to it leaves it parked). The test holds its own thread, so the goroutine
	// below cannot run on it; should it land on the main thread, it keeps that thread
	// (locked, parked until the test ends) and a second goroutine is started, which can
	// then run on neither.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	holdMain := make(chan struct{})
	defer close(holdMain)
	for try := 1; ; try++ {
		onMain := make(chan bool)
		go func() {
			runtime.LockOSThread()
			if unix.Gettid() == unix.Getpid() {
				onMain <- true
				<-holdMain
				runtime.UnlockOSThread()
				return
			}
			m.start()
			onMain <- false
			// returns locked: this thread ends now
		}()
		if !<-onMain {
			break
		}
		if try == 2 {
			t.Fatal("a goroutine ran on the main thread while another held it locked")
		}
	}
	t.Cleanup(func() { m.kill(syscall.SIGKILL) })
	m.mu.Lock()
	exited := m.exited
	m.mu.Unlock()
	select {
	case <-exited:
		t.Fatal("the manager process ended when the thread that started it did (Pdeathsig)")
	case <-time.After(2 * time.Second): // the signal comes within milliseconds of the thread's end
	}
}
