package kvm2

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/libvirtfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

func TestCheckReasons(t *testing.T) {
	tests := []struct {
		name    string
		arrange func(t *testing.T, e *testEnv) context.Context
		reason  string
		// details the status must carry beyond user and pool
		details []string
	}{
		{"reachable", nil, reasonReachable, []string{"libvirtVersion", "hostname", "poolState", "poolCapacityGiB", "poolAvailableGiB"}},
		{"key file missing", func(t *testing.T, e *testEnv) context.Context {
			os.Remove(e.ssh.KeyFile)
			return nil
		}, reasonCredentialsUnavailable, nil},
		{"known_hosts does not parse", func(t *testing.T, e *testEnv) context.Context {
			writeFile(t, e.ssh.KnownHostsFile, []byte("host ssh-ed25519 !!!\n"))
			return nil
		}, reasonCredentialsUnavailable, nil},
		{"nothing listening", func(t *testing.T, e *testEnv) context.Context {
			e.hs.cfg.Hosts[0].Address = closedPort(t)
			return nil
		}, reasonUnreachable, nil},
		{"forwarding refused", func(t *testing.T, e *testEnv) context.Context {
			e.ssh.RefuseForwarding(true)
			return nil
		}, reasonUnreachable, nil},
		{"handshake stalls past the dial budget", func(t *testing.T, e *testEnv) context.Context {
			e.ssh.StallHandshakes(true)
			e.hs.budgets.dial = 100 * time.Millisecond
			return nil
		}, reasonUnreachable, nil},
		{"link dies mid-check", func(t *testing.T, e *testEnv) context.Context {
			e.fake.DropNext("ConnectGetHostname")
			return nil
		}, reasonUnreachable, []string{"libvirtVersion"}},
		{"unknown user key", func(t *testing.T, e *testEnv) context.Context {
			e.ssh.Revoke(e.ssh.Signer().PublicKey())
			return nil
		}, reasonUnauthorized, nil},
		{"host key changed", func(t *testing.T, e *testEnv) context.Context {
			must(e.ssh.RotateHostKey())
			return nil
		}, reasonUnauthorized, nil},
		{"libvirt refuses the user", func(t *testing.T, e *testEnv) context.Context {
			e.fake.FailNext("ConnectOpen", libvirtfake.Errorf(libvirt.ErrAccessDenied, "access denied"))
			return nil
		}, reasonForbidden, nil},
		{"round timeout during a stalled handshake", func(t *testing.T, e *testEnv) context.Context {
			e.ssh.StallHandshakes(true)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			t.Cleanup(cancel)
			return ctx
		}, reasonTimeout, nil},
		{"rpc over its budget", func(t *testing.T, e *testEnv) context.Context {
			g := e.fake.Block("StoragePoolGetInfo")
			t.Cleanup(g.Release)
			e.hs.budgets.rpc = 100 * time.Millisecond
			return nil
		}, reasonTimeout, []string{"libvirtVersion", "hostname"}},
		{"pool missing", func(t *testing.T, e *testEnv) context.Context {
			e.fake.RemovePool(libvirtfake.DefaultPool)
			return nil
		}, reasonPoolNotFound, []string{"libvirtVersion", "hostname"}},
		{"pool stopped", func(t *testing.T, e *testEnv) context.Context {
			if err := e.fake.SetPoolActive(libvirtfake.DefaultPool, false); err != nil {
				t.Fatal(err)
			}
			return nil
		}, reasonPoolNotActive, []string{"poolState", "poolCapacityGiB"}},
		{"other libvirt error", func(t *testing.T, e *testEnv) context.Context {
			e.fake.FailNext("ConnectGetHostname", libvirtfake.Errorf(libvirt.ErrInternalError, "hostname lookup broke"))
			return nil
		}, reasonAPIError, []string{"libvirtVersion"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(1))
			ctx := context.Background()
			if tt.arrange != nil {
				if c := tt.arrange(t, e); c != nil {
					ctx = c
				}
			}
			sts := e.hs.check(ctx)
			if len(sts) != 1 {
				t.Fatalf("%d statuses for one host", len(sts))
			}
			st := sts[0]
			if st.Reason != tt.reason {
				t.Fatalf("reason %s, want %s (message: %s)", st.Reason, tt.reason, st.Message)
			}
			if st.Ready != (tt.reason == reasonReachable) || st.Target != e.host || st.Latency <= 0 {
				t.Errorf("status %+v", st)
			}
			if !st.Ready && !strings.Contains(st.Message, e.host) {
				t.Errorf("message %q does not name the host", st.Message)
			}
			if st.Details["user"] != e.ssh.User || st.Details["pool"] != provider.DefaultPool {
				t.Errorf("details %v lack user or pool", st.Details)
			}
			for _, k := range tt.details {
				if st.Details[k] == "" {
					t.Errorf("details %v lack %s", st.Details, k)
				}
			}
			if len(e.logs.find(`"msg":"kvm2 host checked"`, `"reason":"`+tt.reason+`"`)) != 1 {
				t.Errorf("no kvm2 host checked line: %q", e.logs.all())
			}
		})
	}
}

func TestCheckDetailsValues(t *testing.T) {
	e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(0), withEmptyPools())
	e.fake.SetLibVersion(10_002_003)
	e.fake.SetHostname("beelink")
	st := e.hs.check(context.Background())[0]
	want := map[string]string{
		"user": e.ssh.User, "pool": "default", "libvirtVersion": "10.2.3", "hostname": "beelink",
		"poolState": "running", "poolCapacityGiB": "100.0", "poolAvailableGiB": "100.0",
	}
	if diff := cmp.Diff(want, st.Details); diff != "" {
		t.Errorf("details (-want +got):\n%s", diff)
	}
	if !st.Ready || st.Message != "" {
		t.Errorf("status %+v, want ready without message", st)
	}
}

func TestCheckAllHostsConcurrentlyInConfigOrder(t *testing.T) {
	e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(0))
	good := e.hs.cfg.Hosts[0]
	bad := good
	bad.Name, bad.Address = "hv-down", closedPort(t)
	slow := good
	slow.Name = "hv-slow"
	e.hs.cfg.Hosts = []provider.KVMHost{slow, bad, good}
	// hv-slow's check holds until hv's has finished: run one after the other they
	// would deadlock; concurrently, both finish.
	g := e.fake.Block("ConnectGetHostname")
	t.Cleanup(g.Release)
	checked := make(chan []provider.TargetStatus, 1)
	go func() { checked <- e.hs.check(context.Background()) }()
	testutil.WaitFor(t, waitLong, "two checks to reach the hostname call at once", func() (bool, error) {
		n := g.Waiting()
		return n >= 2, fmt.Errorf("%d checks at the hostname call", n)
	})
	g.Release()
	sts := <-checked
	var got []string
	for _, st := range sts {
		got = append(got, st.Target+"="+st.Reason)
	}
	if diff := cmp.Diff([]string{"hv-slow=Reachable", "hv-down=Unreachable", good.Name + "=Reachable"}, got); diff != "" {
		t.Fatalf("statuses, want config order with each host's own reason (-want +got):\n%s", diff)
	}
}

func TestCheckNeverTouchesThePooledConnection(t *testing.T) {
	e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(0))
	b := must(e.hs.pooled(context.Background(), e.host))
	must(b.ConnectGetHostname())
	pooled := e.pooledConn()
	// A check that runs out of the round's time mid-RPC kills its own connection only.
	g := e.fake.Block("StoragePoolGetInfo")
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-g.Entered(); cancel() }()
	st := e.hs.check(ctx)[0]
	g.Release()
	if st.Reason != reasonTimeout {
		t.Fatalf("reason %s, want Timeout (message %s)", st.Reason, st.Message)
	}
	if !pooled.alive() || e.pooledConn() != pooled {
		t.Fatal("the health check disturbed the pooled connection")
	}
	if _, err := b.ConnectGetHostname(); err != nil {
		t.Fatalf("pooled call after the check: %v", err)
	}
	if n := e.ssh.Stats().SSHConns; n != 2 {
		t.Fatalf("%d SSH connections, want 2: the pooled one and the check's own", n)
	}
}

func TestCheckReasonTable(t *testing.T) {
	// The parts of the table the wire tests cannot reach on their own.
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		ctx  context.Context
		err  error
		want string
	}{
		{live, nil, reasonReachable},
		{ended, &dialError{stage: stageTCP, err: context.Canceled}, reasonTimeout},
		{ended, lverr(libvirt.ErrNoStoragePool), reasonTimeout},
		{live, &dialError{stage: stageSocket, err: lverr(libvirt.ErrAuthFailed)}, reasonForbidden},
		{live, &dialError{stage: stageSocket, err: lverr(libvirt.ErrInternalError)}, reasonAPIError},
		{live, lverr(libvirt.ErrAccessDenied), reasonForbidden},
		{live, classify(lverr(libvirt.ErrNoStoragePool)), reasonPoolNotFound},
		{live, provider.Transient(libvirt.ErrInterrupted), reasonUnreachable},
	}
	for _, c := range cases {
		if got := checkReason(c.ctx, c.err); got != c.want {
			t.Errorf("checkReason(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}
