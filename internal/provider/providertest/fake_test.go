package providertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

func TestFakePassesContract(t *testing.T) {
	RunContract(t, func(t *testing.T) ContractEnv {
		f := NewFake()
		return ContractEnv{
			Provider:    f,
			Request:     provider.CreateRequest{Name: "proxy-0000000000000000", UID: "u", CloudInit: []byte("#cloud-config\n"), Port: 3128},
			MissingID:   ProviderID("proxy-ffffffffffffffff"),
			MalformedID: "gce/zone/x",
			Targets:     []string{"fake"},

			Restarts:        f.Reboots,
			Stop:            func(t *testing.T, id string) { fakeStop(t, f, id) },
			ForeignInstance: func(t *testing.T, _ context.Context) (string, func(*testing.T)) { return fakeForeign(f) },
		}
	})
}

// A fake whose first Creates pend passes the same suite: every case repeats a pending
// Create until it settles.
func TestFakePassesContractWhilePending(t *testing.T) {
	RunContract(t, func(t *testing.T) ContractEnv {
		f := NewFake()
		f.PendCreates(3)
		return ContractEnv{
			Provider:    f,
			Request:     provider.CreateRequest{Name: "proxy-0000000000000000", UID: "u", CloudInit: []byte("#cloud-config\n"), Port: 3128},
			MissingID:   ProviderID("proxy-ffffffffffffffff"),
			MalformedID: "gce/zone/x",
			Targets:     []string{"fake"},
		}
	})
}

func TestFakePendCreates(t *testing.T) {
	ctx := t.Context()
	f := NewFake()
	f.PendCreates(2)
	req := provider.CreateRequest{Name: "a", UID: "u"}
	for i := 1; i <= 2; i++ {
		_, err := f.Create(ctx, req)
		pr, ok := provider.PendingProgress(err)
		if !errors.Is(err, provider.ErrPending) || provider.ClassName(err) != "pending" || !ok ||
			pr.Reason != provider.ReasonImageDownloading || pr.Done != int64(i-1) || pr.Total != 2 ||
			err.Error() != fmt.Sprintf("fake: preparing instance a, step %d of 2", i) {
			t.Fatalf("create %d: %v, progress %+v", i, err, pr)
		}
		if len(f.Instances()) != 0 {
			t.Fatalf("create %d made an instance while pending", i)
		}
	}
	inst, err := f.Create(ctx, req)
	if err != nil || inst.ProviderID != ProviderID("a") {
		t.Fatalf("third create: %+v, %v", inst, err)
	}
	if n := f.CountOf(OpCreate); n != 3 {
		t.Fatalf("%d recorded creates, want 3", n)
	}
	f.PendCreates(1)
	f.Reset()
	if _, err := f.Create(ctx, req); err != nil {
		t.Fatalf("Reset must clear PendCreates: %v", err)
	}
}

func TestFakeOneShotErrors(t *testing.T) {
	ctx := t.Context()
	f := NewFake()
	boom := provider.Transient(errors.New("boom"))
	req := provider.CreateRequest{Name: "a", UID: "u"}

	f.NextCreateErr(boom)
	if _, err := f.Create(ctx, req); !errors.Is(err, boom) {
		t.Fatalf("first create: got %v, want the injected error", err)
	}
	if len(f.Instances()) != 0 {
		t.Fatal("a create that failed by injection left an instance")
	}
	inst, err := f.Create(ctx, req)
	if err != nil {
		t.Fatalf("second create: injected error was not one-shot: %v", err)
	}

	f.NextGetErr(boom)
	if _, err := f.Get(ctx, inst.ProviderID); !errors.Is(err, boom) {
		t.Fatalf("get: got %v, want injected", err)
	}
	if _, err := f.Get(ctx, inst.ProviderID); err != nil {
		t.Fatalf("get after injected error: %v", err)
	}

	f.NextDeleteErr(boom)
	if err := f.Delete(ctx, inst.ProviderID); !errors.Is(err, boom) {
		t.Fatalf("delete: got %v, want injected", err)
	}
	if _, ok := f.Instance(inst.ProviderID); !ok {
		t.Fatal("a delete that failed by injection removed the instance")
	}

	f.NextListErr(boom)
	if l, err := f.ListByTag(ctx); !errors.Is(err, boom) || l != nil {
		t.Fatalf("list: got %v, %v; want nil and the injected error", l, err)
	}
	if l, err := f.ListByTag(ctx); err != nil || len(l) != 1 {
		t.Fatalf("list after injected error: %v, %v", l, err)
	}
}

func TestFakeRecordsCalls(t *testing.T) {
	ctx := t.Context()
	f := NewFake()
	req := provider.CreateRequest{Name: "a", UID: "u", CloudInit: []byte("x")}
	inst, _ := f.Create(ctx, req)
	req.CloudInit[0] = 'y' // the recorded request must not alias the caller's bytes
	_, _ = f.Get(ctx, inst.ProviderID)
	_ = f.Delete(ctx, inst.ProviderID)
	_, _ = f.ListByTag(ctx)
	_ = f.Check(ctx)

	calls := f.Calls()
	var ops []string
	for _, c := range calls {
		ops = append(ops, c.Op)
	}
	if diff := cmp.Diff([]string{OpCreate, OpGet, OpDelete, OpList, OpCheck}, ops); diff != "" {
		t.Fatalf("recorded calls (-want +got):\n%s", diff)
	}
	if got := calls[0].Arg.(provider.CreateRequest); string(got.CloudInit) != "x" || got.Name != "a" {
		t.Fatalf("recorded create request %+v", got)
	}
	if calls[1].Arg != inst.ProviderID || calls[2].Arg != inst.ProviderID {
		t.Fatalf("get/delete recorded %v/%v, want %q", calls[1].Arg, calls[2].Arg, inst.ProviderID)
	}
	if f.CountOf(OpGet) != 1 {
		t.Fatalf("CountOf(get) = %d", f.CountOf(OpGet))
	}
	f.Reset()
	if len(f.Calls()) != 0 || len(f.Instances()) != 0 {
		t.Fatal("Reset kept calls or instances")
	}
}

func TestFakeCreateHookBlocksAndReportsProgress(t *testing.T) {
	f := NewFake()
	release := make(chan struct{})
	entered := make(chan struct{})
	f.SetCreateHook(func(ctx context.Context, req provider.CreateRequest) error {
		provider.ReportProgress(ctx, provider.Progress{Reason: provider.ReasonImageDownloading, Message: "fetching"})
		close(entered)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return provider.Transient(ctx.Err())
		}
	})
	var mu sync.Mutex
	var reports []provider.Progress
	ctx := provider.WithProgress(t.Context(), func(p provider.Progress) {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, p)
	})
	done := make(chan error, 1)
	go func() {
		_, err := f.Create(ctx, provider.CreateRequest{Name: "a", UID: "u"})
		done <- err
	}()
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("create hook never ran")
	}
	if len(f.Instances()) != 0 {
		t.Fatal("instance recorded before the hook returned")
	}
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("create: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("create did not return after the hook was released")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 1 || reports[0].Reason != provider.ReasonImageDownloading {
		t.Fatalf("progress reports %+v", reports)
	}
}

func TestFakeBehindTheBack(t *testing.T) {
	ctx := t.Context()
	f := NewFake()
	old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	id := f.SetInstance(provider.Instance{Name: "orphan", UID: "gone", State: provider.StateRunning, CreatedAt: old})
	if id != "fake/orphan" {
		t.Fatalf("SetInstance id %q", id)
	}
	got, err := f.Get(ctx, id)
	if err != nil || !got.CreatedAt.Equal(old) || got.UID != "gone" {
		t.Fatalf("get of a set instance: %+v, %v", got, err)
	}
	if !f.RemoveInstance(id) {
		t.Fatal("RemoveInstance reported the instance missing")
	}
	if _, err := f.Get(ctx, id); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("get after RemoveInstance: %v, want ErrNotFound", err)
	}
}

func TestFakeSettings(t *testing.T) {
	ctx := t.Context()
	f := NewFake()
	at := time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC)
	f.SetClock(func() time.Time { return at })
	f.SetIPFunc(func(req provider.CreateRequest) string { return "127.0.0.1" })
	inst, err := f.Create(ctx, provider.CreateRequest{Name: "a", UID: "u"})
	if err != nil || inst.IP != "127.0.0.1" || !inst.CreatedAt.Equal(at) || inst.State != provider.StateRunning {
		t.Fatalf("create with settings: %+v, %v", inst, err)
	}
	ts := []provider.TargetStatus{{Target: "h1", Ready: false, Reason: "Unreachable", Details: map[string]string{"k": "v"}}, {Target: "h2", Ready: true}}
	f.SetCheckResult(ts)
	ts[0].Details["k"] = "changed"
	got := f.Check(ctx)
	if len(got) != 2 || got[0].Target != "h1" || got[0].Details["k"] != "v" {
		t.Fatalf("check: %+v", got)
	}
	if _, err := f.Create(ctx, provider.CreateRequest{UID: "u"}); !errors.Is(err, provider.ErrPermanent) {
		t.Fatalf("create without a name: %v, want ErrPermanent", err)
	}
}

func TestFakeConcurrentUse(t *testing.T) {
	ctx := t.Context()
	f := NewFake()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			name := fmt.Sprintf("p%d", i%3)
			inst, err := f.Create(ctx, provider.CreateRequest{Name: name, UID: name})
			if err != nil {
				t.Errorf("create %s: %v", name, err)
				return
			}
			_, _ = f.Get(ctx, inst.ProviderID)
			_, _ = f.ListByTag(ctx)
			f.NextGetErr(nil)
			_ = f.Calls()
		})
	}
	wg.Wait()
	if n := len(f.Instances()); n != 3 {
		t.Fatalf("got %d instances, want 3", n)
	}
	if n := f.CountOf(OpCreate); n != 8 {
		t.Fatalf("recorded %d creates, want 8", n)
	}
}

// fakeStop stops instance id behind the fake's back.
func fakeStop(t *testing.T, f *Fake, id string) {
	t.Helper()
	inst, ok := f.Instance(id)
	if !ok {
		t.Fatalf("no instance %s to stop", id)
	}
	inst.State, inst.IP = provider.StateStopped, ""
	f.SetInstance(inst)
}

// fakeForeign adds an instance of another install and returns the check that it is as added.
func fakeForeign(f *Fake) (string, func(*testing.T)) {
	id := f.AddForeignInstance("proxy-f0f0f0f0f0f0f0f0")
	want, _ := f.ForeignInstance(id)
	return id, func(t *testing.T) {
		t.Helper()
		got, ok := f.ForeignInstance(id)
		if !ok || got != want || f.Reboots(id) != 0 {
			t.Fatalf("another install's instance %s is %+v (there: %v, reboots %d), want it untouched: %+v", id, got, ok, f.Reboots(id), want)
		}
	}
}

func TestFakeReboot(t *testing.T) {
	ctx := t.Context()
	f := NewFake()
	inst, err := f.Create(ctx, provider.CreateRequest{Name: "a", UID: "u"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Reboot(ctx, inst.ProviderID); err != nil {
		t.Fatalf("reboot: %v", err)
	}

	// A one-shot error is returned once and restarts nothing.
	f.NextRebootErr(provider.Transient(errors.New("host away")))
	if err := f.Reboot(ctx, inst.ProviderID); !errors.Is(err, provider.ErrTransient) || err.Error() != "host away" {
		t.Fatalf("reboot with an injected error: %v", err)
	}
	// A standing error holds until cleared.
	f.FailReboots(provider.Permanent(errors.New("cannot reset")))
	for range 2 {
		if err := f.Reboot(ctx, inst.ProviderID); !errors.Is(err, provider.ErrPermanent) {
			t.Fatalf("reboot while failing: %v", err)
		}
	}
	f.FailReboots(nil)
	// The hook sees the call and can fail it.
	var hooked []string
	f.SetRebootHook(func(_ context.Context, id string) error {
		hooked = append(hooked, id)
		if len(hooked) == 1 {
			return provider.Transient(errors.New("hook says no"))
		}
		return nil
	})
	if err := f.Reboot(ctx, inst.ProviderID); !errors.Is(err, provider.ErrTransient) {
		t.Fatalf("reboot failed by the hook: %v", err)
	}
	if err := f.Reboot(ctx, inst.ProviderID); err != nil {
		t.Fatalf("reboot through the hook: %v", err)
	}
	if diff := cmp.Diff([]string{inst.ProviderID, inst.ProviderID}, hooked); diff != "" {
		t.Errorf("hook calls (-want +got):\n%s", diff)
	}
	if got := f.Reboots(inst.ProviderID); got != 2 {
		t.Errorf("Reboots = %d, want 2 (failed and refused reboots not counted)", got)
	}
	if got := f.CountOf(OpReboot); got != 6 {
		t.Errorf("%d reboot calls recorded, want 6 (every call, failed ones too)", got)
	}
	if c := f.CallsOf(OpReboot)[0]; c.Arg != inst.ProviderID {
		t.Errorf("reboot call recorded with arg %v, want the providerID", c.Arg)
	}
	got, _ := f.Instance(inst.ProviderID)
	if got != inst {
		t.Errorf("after reboots the instance is %+v, want it unchanged %+v", got, inst)
	}

	// A stopped instance runs after a reboot; a cancelled context restarts nothing.
	fakeStop(t, f, inst.ProviderID)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := f.Reboot(cancelled, inst.ProviderID); !errors.Is(err, provider.ErrTransient) || !errors.Is(err, context.Canceled) {
		t.Fatalf("reboot on a cancelled context: %v", err)
	}
	if err := f.Reboot(ctx, inst.ProviderID); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.Instance(inst.ProviderID); got.State != provider.StateRunning || got.IP == "" || got.IP == inst.IP {
		t.Errorf("a rebooted stopped instance is %s on %q, want Running on a new address (it had %s before it stopped)", got.State, got.IP, inst.IP)
	}
}

func TestFakeForeignInstance(t *testing.T) {
	ctx := t.Context()
	f := NewFake()
	id := f.AddForeignInstance("theirs")
	if _, err := f.Get(ctx, id); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("get of another install's instance: %v, want ErrNotFound", err)
	}
	if _, err := f.Create(ctx, provider.CreateRequest{Name: "theirs", UID: "u"}); !errors.Is(err, provider.ErrPermanent) {
		t.Errorf("create over another install's instance: %v, want ErrPermanent", err)
	}
	if err := f.Reboot(ctx, id); !errors.Is(err, provider.ErrPermanent) {
		t.Errorf("reboot of another install's instance: %v, want ErrPermanent", err)
	}
	if err := f.Delete(ctx, id); err != nil {
		t.Errorf("delete of another install's instance: %v, want success (left alone)", err)
	}
	if list, _ := f.ListByTag(ctx); len(list) != 0 {
		t.Errorf("ListByTag lists %+v, want nothing of another install", list)
	}
	if _, ok := f.ForeignInstance(id); !ok || f.Reboots(id) != 0 {
		t.Error("another install's instance was touched")
	}
}

func TestWithoutReboot(t *testing.T) {
	f := NewFake()
	if _, ok := provider.RebooterOf(f); !ok {
		t.Fatal("the fake is not a Rebooter")
	}
	hidden := WithoutReboot(f)
	if _, ok := provider.RebooterOf(hidden); ok {
		t.Fatal("WithoutReboot still reboots")
	}
	if _, ok := provider.RebooterOf(provider.Observe("x", "fake", hidden)); ok {
		t.Fatal("Observe over WithoutReboot reboots")
	}
	if _, err := hidden.Create(t.Context(), provider.CreateRequest{Name: "a", UID: "u"}); err != nil || f.CountOf(OpCreate) != 1 {
		t.Fatalf("WithoutReboot does not pass Create through: %v", err)
	}
}
