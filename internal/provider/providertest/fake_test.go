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
		return ContractEnv{
			Provider:    NewFake(),
			Request:     provider.CreateRequest{Name: "proxy-0000000000000000", UID: "u", CloudInit: []byte("#cloud-config\n"), Port: 3128},
			MissingID:   ProviderID("proxy-ffffffffffffffff"),
			MalformedID: "gce/zone/x",
			Targets:     []string{"fake"},
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
