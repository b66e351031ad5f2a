//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

// durationEnv reads a duration in seconds from name, or returns def.
func durationEnv(name string, def time.Duration) time.Duration {
	if s, err := strconv.Atoi(os.Getenv(name)); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return def
}

// Guests boot under TCG here: a minute on a quiet machine, several under load.
var (
	bootDeadline  = durationEnv("E2E_BOOT_DEADLINE", 15*time.Minute)
	shortDeadline = durationEnv("E2E_SHORT_DEADLINE", 3*time.Minute)
)

// story holds what every step of the end-to-end test uses.
type story struct {
	t    *testing.T
	c    client.Client
	host *framework.Host
	mgr  *manager
	key  types.NamespacedName
	vm   string
}

func (s *story) proxy() (*v1alpha1.Proxy, error) {
	var px v1alpha1.Proxy
	err := s.c.Get(context.Background(), s.key, &px)
	return &px, err
}

// describe is the Proxy's status as a user would read it, for progress and failure output.
func (s *story) describe() string {
	px, err := s.proxy()
	if err != nil {
		return fmt.Sprintf("(reading Proxy %s: %v)", s.key, err)
	}
	b, _ := yaml.Marshal(px.Status)
	return string(b)
}

func (s *story) phaseLine() string {
	px, err := s.proxy()
	if err != nil {
		return err.Error()
	}
	return framework.PhaseLine(px)
}

// diagnostics is what a failed wait shows after what it waited for: head (the object's
// status), the manager's last log lines and the host's domains.
func diagnostics(host *framework.Host, mgr *manager, head string) string {
	virshList, err := host.Virsh("list --all")
	if err != nil {
		virshList += err.Error()
	}
	return fmt.Sprintf("%s\n--- manager log (last 40 lines):\n%s\n--- virsh list --all:\n%s", head, mgr.tail(40), virshList)
}

// waitOptions log progress every 30 s and, on a timeout, add the Proxy's status, the
// manager's last log lines and the host's domains.
func (s *story) waitOptions(poll time.Duration) []testutil.WaitOption {
	return []testutil.WaitOption{testutil.Every(poll), testutil.LogEvery(30 * time.Second), testutil.OnTimeout(func() string {
		return diagnostics(s.host, s.mgr, fmt.Sprintf("--- Proxy %s status:\n%s", s.key, s.describe()))
	})}
}

// waitFor waits (testutil.WaitFor) for cond, polling every poll and logging the Proxy's
// phase every 30s. When timeout passes it fails the test with what it waited for, cond's
// last error and the Proxy's phase, and the diagnostics of waitOptions.
func (s *story) waitFor(what string, timeout, poll time.Duration, cond func() (bool, error)) time.Duration {
	s.t.Helper()
	return testutil.WaitFor(s.t, timeout, what, func() (bool, error) {
		ok, err := cond()
		// The Proxy's phase is read only when a progress line or the failure shows it.
		return ok, framework.LazyState(func() string { return fmt.Sprintf("%s (last error: %v)", s.phaseLine(), err) })
	}, s.waitOptions(poll)...)
}

// waitProxy waits until the Proxy satisfies ok and returns it (framework.WaitProxy, with
// the diagnostics of waitOptions).
func (s *story) waitProxy(what string, timeout time.Duration, ok func(*v1alpha1.Proxy) bool) *v1alpha1.Proxy {
	s.t.Helper()
	return framework.WaitProxy(s.t, s.c, s.key, what, timeout, ok, s.waitOptions(500*time.Millisecond)...)
}

// hungBootAfter is how long a guest may go without an address before waitBooted looks
// for a boot hang: three times a slow first boot under emulation here.
var hungBootAfter = durationEnv("E2E_HUNG_BOOT_AFTER", 8*time.Minute)

// waitBooted is waitProxy up to bootDeadline for a Proxy whose VM is booting, with one
// allowance for the emulator: a guest that has reported no address after hungBootAfter
// and has written nothing to its disk is stuck before its root file system was mounted
// (seen once in ten boots under TCG: the kernel idle, only the firmware's reads of the
// boot partition done). Then the test removes the domain, once, and says so; the
// reconciler finds the instance gone and creates it again, a path of its own, and the
// wait goes on for a full bootDeadline. A guest that boots and then misbehaves has
// written to its disk and is not touched.
func (s *story) waitBooted(what string, ok func(*v1alpha1.Proxy) bool) *v1alpha1.Proxy {
	s.t.Helper()
	var got *v1alpha1.Proxy
	start, removed := time.Now(), false
	s.waitFor(what, bootDeadline+hungBootAfter, 500*time.Millisecond, func() (bool, error) {
		px, err := s.proxy()
		if err != nil {
			return false, err
		}
		got = px
		if ok(px) {
			return true, nil
		}
		if !removed && time.Since(start) > hungBootAfter && px.Status.IP == "" {
			if writes, err := s.host.DiskWrites(s.vm); err == nil && writes == 0 {
				s.t.Logf("BOOT HANG: the guest of %s has reported no address after %s and has written nothing to its disk; removing domain %s once, for the reconciler to create it again",
					s.key, time.Since(start).Round(time.Second), s.vm)
				s.host.RemoveInstance(s.vm)
				removed = true
			}
		}
		if !removed && time.Since(start) > bootDeadline {
			return false, fmt.Errorf("no boot hang seen, and past the boot deadline %s", bootDeadline)
		}
		return false, nil
	})
	return got
}
