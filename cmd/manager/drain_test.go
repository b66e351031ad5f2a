package main

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// On SIGTERM the manager releases the lease at once, while the discovery API goes on
// answering for --discovery-drain-delay (so that a Service has dropped the pod before its
// port closes), and then exits 0. Without the drain the port closed with the manager, and
// a crawler whose connection kube-proxy still sent to the going pod was refused.
func TestDiscoveryDrainsAfterSIGTERM(t *testing.T) {
	const drain = 4 * time.Second
	env := testenv.StartT(t)
	providers := writeFile(t, "providers.yaml", fmt.Sprintf(goodConfig, t.TempDir()))
	probe, disc := freeAddr(t), freeAddr(t)
	mgr := startManager(t, env, "--providers-config", providers,
		"--health-probe-bind-address", probe, "--metrics-bind-address", "0", "--discovery-bind-address", disc, "--discovery-kubernetes-auth=false",
		"--discovery-drain-delay", drain.String(), "--leader-elect", "--leader-election-namespace", "default")

	hc := &http.Client{Timeout: time.Second}
	get := func() error {
		res, err := hc.Get("http://" + disc + "/v1/proxies")
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("answered %d", res.StatusCode)
		}
		return nil
	}
	holder := func() (string, error) {
		var l coordinationv1.Lease
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "egress-proxies-operator.egress.hrajfrisbee.cz"}, &l)
		if err != nil || l.Spec.HolderIdentity == nil {
			return "", err
		}
		return *l.Spec.HolderIdentity, nil
	}
	mgr.waitUntil("the manager to hold the lease and answer discovery", func() (bool, error) {
		if h, err := holder(); h == "" {
			return false, fmt.Errorf("lease held by %q (%v)", h, err)
		}
		return get() == nil, get()
	})

	type answer struct {
		at  time.Duration
		err error
	}
	var (
		mu       sync.Mutex
		answers  []answer
		released time.Duration
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	if err := mgr.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	wg.Add(2)
	go func() { // discovery, every 50 ms
		defer wg.Done()
		for {
			err := get()
			mu.Lock()
			answers = append(answers, answer{time.Since(start), err})
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	go func() { // the lease, until released
		defer wg.Done()
		for {
			if h, err := holder(); err == nil && h == "" {
				mu.Lock()
				released = time.Since(start)
				mu.Unlock()
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	var exitErr error
	select {
	case exitErr = <-mgr.exited:
	case <-time.After(drain + time.Minute):
		close(stop)
		wg.Wait()
		t.Fatalf("the manager still runs %s after SIGTERM; stderr:\n%s", drain+time.Minute, mgr.stderr.String())
	}
	exited := time.Since(start)
	close(stop)
	wg.Wait()
	if exitErr != nil {
		t.Fatalf("the manager exited with %v, want 0; stderr:\n%s", exitErr, mgr.stderr.String())
	}
	if released == 0 || released >= drain {
		t.Errorf("the lease was released %s after SIGTERM (0: never seen), want within the drain of %s", released, drain)
	}
	if exited < drain {
		t.Errorf("the manager exited %s after SIGTERM, before its drain of %s", exited, drain)
	}
	ok, afterRelease := 0, 0
	for _, a := range answers {
		if a.at >= drain-500*time.Millisecond {
			break // the port may close from here on
		}
		if a.err != nil {
			t.Errorf("discovery at +%s after SIGTERM: %v, want an answer until the drain ends", a.at.Round(time.Millisecond), a.err)
			continue
		}
		ok++
		if a.at > released {
			afterRelease++
		}
	}
	if ok == 0 || afterRelease == 0 {
		t.Errorf("%d answers after SIGTERM, %d of them after the lease was released at +%s: want some of each", ok, afterRelease, released)
	}
	t.Logf("lease released at +%s, %d discovery answers while draining, exited at +%s", released.Round(time.Millisecond), ok, exited.Round(time.Millisecond))
}
