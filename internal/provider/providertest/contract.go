package providertest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// ContractEnv is what RunContract needs from one provider under test. newEnv is called
// once per case, so every case starts from an empty provider.
type ContractEnv struct {
	// Provider is the implementation under test.
	Provider provider.Provider
	// Request is a valid CreateRequest. The suite copies it and changes only Name and UID,
	// and SpecHash in the case that checks a change of spec.
	Request provider.CreateRequest
	// MissingID is a well-formed providerID of an instance that does not exist.
	MissingID string
	// MalformedID, when set, is a providerID the provider cannot interpret; Get and Delete
	// of it must fail with ErrPermanent.
	MalformedID string
	// Targets are the target names Check must report, in order. When nil, the suite only
	// checks that Check returns at least one status with a name.
	Targets []string
	// Timeout bounds each case (default one minute).
	Timeout time.Duration
	// PendingRequest, when set, is a valid CreateRequest whose first Create may return
	// the pending result (for kvm2: one needing a base image not cached yet). The case
	// on pending uses it, or Request when it is nil; a provider that never pends passes
	// that case all the same.
	PendingRequest *provider.CreateRequest
	// PendingRetry is the wait between two Creates of a pending request (default 10ms).
	PendingRetry time.Duration

	// The Reboot cases run only for a provider that can reboot (provider.RebooterOf).
	//
	// Restarts, when set, reports how many times the backend has restarted (reset, or
	// started) the instance providerID names; the Reboot cases then check that a reboot
	// restarted it exactly once and that a refused one did not.
	Restarts func(providerID string) int
	// Stop, when set, stops the instance providerID names behind the provider's back (as
	// someone on the host or in the console would); the case that a Reboot starts a
	// stopped instance needs it and is skipped without it.
	Stop func(t *testing.T, providerID string)
	// ForeignInstance, when set, puts in place an instance of another install of the
	// operator that the provider under test could reach (same host or project, another
	// install identity) and returns its providerID and a check that fails t unless that
	// instance is still there, untouched. The case that Reboot refuses it needs it and is
	// skipped without it.
	ForeignInstance func(t *testing.T, ctx context.Context) (providerID string, untouched func(t *testing.T))
}

// RunContract runs the suite every provider.Provider must pass.
func RunContract(t *testing.T, newEnv func(t *testing.T) ContractEnv) {
	t.Helper()
	cases := []struct {
		name string
		run  func(t *testing.T, ctx context.Context, env ContractEnv)
	}{
		{"CreateIsIdempotentByName", contractCreateIdempotent},
		{"PendingCreateSettlesOnRepeat", contractPending},
		{"ConcurrentCreatesOfOneNameMakeOneInstance", contractConcurrentCreate},
		{"CreateOfNameOwnedByAnotherUIDIsPermanent", contractForeignOwner},
		{"CreateWithAnotherSpecHashLeavesOneInstance", contractSpecHashChange},
		{"GetAfterCreate", contractGetAfterCreate},
		{"GetOfMissingIDIsNotFound", contractGetMissing},
		{"DeleteTwiceSucceeds", contractDeleteTwice},
		{"DeleteOfMissingIDSucceeds", contractDeleteMissing},
		{"MalformedIDIsPermanent", contractMalformed},
		{"ListByTagHoldsCreatedInstances", contractList},
		{"CheckReturnsOneStatusPerTarget", contractCheck},
		{"RebootKeepsTheInstance", contractRebootKeeps},
		{"RebootStartsAStoppedInstance", contractRebootStopped},
		{"RebootOfDeletedInstanceIsNotFound", contractRebootDeleted},
		{"RebootOfMalformedIDIsPermanent", contractRebootMalformed},
		{"RebootOfAnotherInstallsInstanceIsRefused", contractRebootForeign},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := newEnv(t)
			if env.Provider == nil {
				t.Fatal("ContractEnv.Provider is nil")
			}
			timeout := env.Timeout
			if timeout == 0 {
				timeout = time.Minute
			}
			ctx, cancel := context.WithTimeout(t.Context(), timeout)
			defer cancel()
			c.run(t, ctx, env)
		})
	}
}

// RequireOneClass fails t unless err carries exactly one of the error classes (the four
// failures and the pending result).
func RequireOneClass(t testing.TB, op string, err error) {
	t.Helper()
	n := 0
	for _, c := range []error{provider.ErrPermanent, provider.ErrQuotaExceeded, provider.ErrNotFound, provider.ErrTransient, provider.ErrPending} {
		if errors.Is(err, c) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%s: error %q carries %d classes, want exactly one", op, err, n)
	}
}

// requireClass fails t unless err carries exactly one class and it is want.
func requireClass(t testing.TB, op string, err, want error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: got no error, want %s", op, provider.ClassName(want))
	}
	RequireOneClass(t, op, err)
	if !errors.Is(err, want) {
		t.Fatalf("%s: error %q has class %s, want %s", op, err, provider.ClassName(err), provider.ClassName(want))
	}
}

// noErr fails t on err, naming its class (and refusing ErrNotFound from Create/Delete).
func noErr(t testing.TB, op string, err error) {
	t.Helper()
	if err != nil {
		RequireOneClass(t, op, err)
		t.Fatalf("%s: %v (class %s)", op, err, provider.ClassName(err))
	}
}

// request returns env.Request with a distinct deterministic name and UID for key.
func request(env ContractEnv, key string) provider.CreateRequest {
	req := env.Request
	sum := sha256.Sum256([]byte(key))
	req.Name = "proxy-" + hex.EncodeToString(sum[:8])
	req.UID = fmt.Sprintf("%x-uid-%s", sum[8:12], key)
	return req
}

// CreateSettled calls p.Create with req, and again after every (10ms when 0) for as long
// as the result is pending and ctx lasts, as the reconciler does; it returns the first
// result that is not pending (or ctx's end, as a transient error).
func CreateSettled(ctx context.Context, p provider.Provider, req provider.CreateRequest, every time.Duration) (provider.Instance, error) {
	if every <= 0 {
		every = 10 * time.Millisecond
	}
	for {
		inst, err := p.Create(ctx, req)
		if !errors.Is(err, provider.ErrPending) {
			return inst, err
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return provider.Instance{}, provider.Transient(fmt.Errorf("create %s still pending (%v): %w", req.Name, err, ctx.Err()))
		case <-t.C:
		}
	}
}

func create(t *testing.T, ctx context.Context, env ContractEnv, req provider.CreateRequest) provider.Instance {
	t.Helper()
	inst, err := CreateSettled(ctx, env.Provider, req, env.PendingRetry)
	noErr(t, "create "+req.Name, err)
	if inst.ProviderID == "" || inst.Name != req.Name || inst.UID != req.UID {
		t.Fatalf("create %s: got instance %+v, want a providerID, name %q and uid %q", req.Name, inst, req.Name, req.UID)
	}
	return inst
}

func contractCreateIdempotent(t *testing.T, ctx context.Context, env ContractEnv) {
	req := request(env, "idempotent")
	first := create(t, ctx, env, req)
	second := create(t, ctx, env, req)
	if second.ProviderID != first.ProviderID {
		t.Fatalf("second create of %s: providerID %q, first was %q", req.Name, second.ProviderID, first.ProviderID)
	}
	requireListedOnce(t, ctx, env, req.Name, "two creates")
}

func contractConcurrentCreate(t *testing.T, ctx context.Context, env ContractEnv) {
	req := request(env, "concurrent")
	const n = 4
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			inst, err := env.Provider.Create(ctx, req)
			ids[i], errs[i] = inst.ProviderID, err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			RequireOneClass(t, "concurrent create", err)
			if errors.Is(err, provider.ErrNotFound) || errors.Is(err, provider.ErrPermanent) {
				t.Fatalf("concurrent create %d of %s: %v (class %s)", i, req.Name, err, provider.ClassName(err))
			}
		}
	}
	// A transient failure is allowed under contention; a retry must then converge.
	inst := create(t, ctx, env, req)
	for i, id := range ids {
		if errs[i] == nil && id != inst.ProviderID {
			t.Fatalf("concurrent create %d of %s returned %q, later create %q", i, req.Name, id, inst.ProviderID)
		}
	}
	list, err := env.Provider.ListByTag(ctx)
	noErr(t, "list", err)
	if c := countName(list, req.Name); c != 1 {
		t.Fatalf("after concurrent creates of %s, ListByTag holds it %d times, want 1", req.Name, c)
	}
}

func contractForeignOwner(t *testing.T, ctx context.Context, env ContractEnv) {
	req := request(env, "owned")
	create(t, ctx, env, req)
	other := req
	other.UID = req.UID + "-other"
	_, err := env.Provider.Create(ctx, other)
	requireClass(t, "create of "+req.Name+" by another uid", err, provider.ErrPermanent)
}

// contractSpecHashChange: a repeat Create for the same name and UID with another spec
// hash succeeds (a provider that records the hash replaces the instance) and leaves
// exactly one instance of that name, which Get describes.
func contractSpecHashChange(t *testing.T, ctx context.Context, env ContractEnv) {
	req := request(env, "respec")
	req.SpecHash = "spec-a"
	create(t, ctx, env, req)
	req.SpecHash = "spec-b"
	inst := create(t, ctx, env, req)
	list, err := env.Provider.ListByTag(ctx)
	noErr(t, "list", err)
	if n := countName(list, req.Name); n != 1 {
		t.Fatalf("after creates of %s with two spec hashes, ListByTag holds it %d times, want 1", req.Name, n)
	}
	got, err := env.Provider.Get(ctx, inst.ProviderID)
	noErr(t, "get "+inst.ProviderID, err)
	if got.Name != req.Name || got.UID != req.UID {
		t.Fatalf("get %s after the spec change: %+v", inst.ProviderID, got)
	}
}

func contractGetAfterCreate(t *testing.T, ctx context.Context, env ContractEnv) {
	req := request(env, "get")
	created := create(t, ctx, env, req)
	got, err := env.Provider.Get(ctx, created.ProviderID)
	noErr(t, "get "+created.ProviderID, err)
	if got.ProviderID != created.ProviderID || got.Name != req.Name || got.UID != req.UID {
		t.Fatalf("get %s: got %+v, want name %q uid %q", created.ProviderID, got, req.Name, req.UID)
	}
	if got.State == "" {
		t.Fatalf("get %s: empty state", created.ProviderID)
	}
}

func contractGetMissing(t *testing.T, ctx context.Context, env ContractEnv) {
	if env.MissingID == "" {
		t.Fatal("ContractEnv.MissingID is empty")
	}
	_, err := env.Provider.Get(ctx, env.MissingID)
	requireClass(t, "get "+env.MissingID, err, provider.ErrNotFound)
}

func contractDeleteTwice(t *testing.T, ctx context.Context, env ContractEnv) {
	req := request(env, "delete")
	inst := create(t, ctx, env, req)
	noErr(t, "delete "+inst.ProviderID, env.Provider.Delete(ctx, inst.ProviderID))
	noErr(t, "second delete "+inst.ProviderID, env.Provider.Delete(ctx, inst.ProviderID))
	_, err := env.Provider.Get(ctx, inst.ProviderID)
	requireClass(t, "get after delete "+inst.ProviderID, err, provider.ErrNotFound)
	list, err := env.Provider.ListByTag(ctx)
	noErr(t, "list", err)
	if countName(list, req.Name) != 0 {
		t.Fatalf("ListByTag still holds %s after delete", req.Name)
	}
}

func contractDeleteMissing(t *testing.T, ctx context.Context, env ContractEnv) {
	noErr(t, "delete "+env.MissingID, env.Provider.Delete(ctx, env.MissingID))
}

func contractMalformed(t *testing.T, ctx context.Context, env ContractEnv) {
	if env.MalformedID == "" {
		t.Skip("ContractEnv.MalformedID not set")
	}
	_, err := env.Provider.Get(ctx, env.MalformedID)
	requireClass(t, "get "+env.MalformedID, err, provider.ErrPermanent)
	err = env.Provider.Delete(ctx, env.MalformedID)
	requireClass(t, "delete "+env.MalformedID, err, provider.ErrPermanent)
}

func contractList(t *testing.T, ctx context.Context, env ContractEnv) {
	a := create(t, ctx, env, request(env, "list-a"))
	b := create(t, ctx, env, request(env, "list-b"))
	list, err := env.Provider.ListByTag(ctx)
	noErr(t, "list", err)
	for _, want := range []provider.Instance{a, b} {
		found := false
		for _, got := range list {
			if got.Name == want.Name {
				found = true
				if got.ProviderID != want.ProviderID || got.UID != want.UID {
					t.Fatalf("ListByTag entry %+v, want providerID %q uid %q", got, want.ProviderID, want.UID)
				}
			}
		}
		if !found {
			t.Fatalf("ListByTag %+v lacks %s", list, want.Name)
		}
	}
}

func contractCheck(t *testing.T, ctx context.Context, env ContractEnv) {
	got := env.Provider.Check(ctx)
	if env.Targets == nil {
		if len(got) == 0 {
			t.Fatal("Check returned no status")
		}
		for i, s := range got {
			if s.Target == "" {
				t.Fatalf("Check status %d has no target name", i)
			}
		}
		return
	}
	if len(got) != len(env.Targets) {
		t.Fatalf("Check returned %d statuses, want %d (%v)", len(got), len(env.Targets), env.Targets)
	}
	for i, want := range env.Targets {
		if got[i].Target != want {
			t.Fatalf("Check status %d is for %q, want %q (config order)", i, got[i].Target, want)
		}
	}
}

func countName(list []provider.Instance, name string) int {
	n := 0
	for _, inst := range list {
		if inst.Name == name {
			n++
		}
	}
	return n
}

// contractPending: a Create may return the pending result, carrying the progress of its
// work, and then a repeat of the same request must settle, on the instance a further
// Create returns again without pending.
func contractPending(t *testing.T, ctx context.Context, env ContractEnv) {
	base := env.Request
	if env.PendingRequest != nil {
		base = *env.PendingRequest
	}
	env.Request = base
	req := request(env, "pending")
	_, err := env.Provider.Create(ctx, req)
	if err != nil {
		RequireOneClass(t, "first create", err)
		if !errors.Is(err, provider.ErrPending) {
			t.Fatalf("first create of %s: %v (class %s)", req.Name, err, provider.ClassName(err))
		}
		if pr, ok := provider.PendingProgress(err); !ok || err.Error() == "" || pr.Total < 0 || pr.Done < 0 {
			t.Fatalf("first create of %s: pending result %q carries no usable progress (%+v, %v)", req.Name, err, pr, ok)
		}
	}
	first := create(t, ctx, env, req)
	again, err := env.Provider.Create(ctx, req)
	noErr(t, "create after it settled", err)
	if again.ProviderID != first.ProviderID {
		t.Fatalf("create of %s after it settled: providerID %q, was %q", req.Name, again.ProviderID, first.ProviderID)
	}
	requireListedOnce(t, ctx, env, req.Name, "a pending create settled")
}

// requireListedOnce fails t unless ListByTag holds name exactly once, after what happened.
func requireListedOnce(t *testing.T, ctx context.Context, env ContractEnv, name, after string) {
	t.Helper()
	list, err := env.Provider.ListByTag(ctx)
	noErr(t, "list", err)
	if n := countName(list, name); n != 1 {
		t.Fatalf("after %s, ListByTag holds %s %d times, want 1", after, name, n)
	}
}

// rebooter returns the provider's Rebooter, skipping the case when it has none.
func rebooter(t *testing.T, env ContractEnv) provider.Rebooter {
	t.Helper()
	r, ok := provider.RebooterOf(env.Provider)
	if !ok {
		t.Skip("the provider cannot reboot (no provider.Rebooter)")
	}
	return r
}

// requireRestarts fails t unless env.Restarts (when set) says id was restarted want times.
func requireRestarts(t *testing.T, env ContractEnv, id string, want int, after string) {
	t.Helper()
	if env.Restarts == nil {
		return
	}
	if got := env.Restarts(id); got != want {
		t.Fatalf("after %s, the backend restarted %s %d times, want %d", after, id, got, want)
	}
}

// contractRebootKeeps: a reboot of a running instance restarts it in place: Get answers
// the same providerID, name, owner and address, and the instance runs; a second reboot
// (a retry) succeeds too.
func contractRebootKeeps(t *testing.T, ctx context.Context, env ContractEnv) {
	r := rebooter(t, env)
	req := request(env, "reboot")
	inst := create(t, ctx, env, req)
	before, err := env.Provider.Get(ctx, inst.ProviderID)
	noErr(t, "get before the reboot", err)
	base := 0
	if env.Restarts != nil {
		base = env.Restarts(inst.ProviderID)
	}
	noErr(t, "reboot "+inst.ProviderID, r.Reboot(ctx, inst.ProviderID))
	requireRestarts(t, env, inst.ProviderID, base+1, "one reboot")
	after, err := env.Provider.Get(ctx, inst.ProviderID)
	noErr(t, "get after the reboot", err)
	if after.ProviderID != before.ProviderID || after.Name != req.Name || after.UID != req.UID ||
		!after.CreatedAt.Equal(before.CreatedAt) {
		t.Fatalf("after the reboot get returned %+v, before it %+v: want the same instance", after, before)
	}
	if after.State != provider.StateRunning && after.State != provider.StatePending {
		t.Fatalf("after the reboot the instance is %s, want Running (or Pending while it comes up)", after.State)
	}
	if before.IP != "" && after.IP != "" && after.IP != before.IP {
		t.Fatalf("the reboot changed the address from %s to %s", before.IP, after.IP)
	}
	noErr(t, "second reboot "+inst.ProviderID, r.Reboot(ctx, inst.ProviderID))
	requireRestarts(t, env, inst.ProviderID, base+2, "two reboots")
	requireListedOnce(t, ctx, env, req.Name, "two reboots")
}

// contractRebootStopped: a reboot of an instance stopped behind the provider's back starts
// it, in place.
func contractRebootStopped(t *testing.T, ctx context.Context, env ContractEnv) {
	r := rebooter(t, env)
	if env.Stop == nil {
		t.Skip("ContractEnv.Stop not set")
	}
	req := request(env, "reboot-stopped")
	inst := create(t, ctx, env, req)
	env.Stop(t, inst.ProviderID)
	stopped, err := env.Provider.Get(ctx, inst.ProviderID)
	noErr(t, "get of the stopped instance", err)
	if stopped.State != provider.StateStopped {
		t.Fatalf("get after Stop: state %s, want Stopped", stopped.State)
	}
	noErr(t, "reboot of the stopped "+inst.ProviderID, r.Reboot(ctx, inst.ProviderID))
	after, err := env.Provider.Get(ctx, inst.ProviderID)
	noErr(t, "get after the reboot", err)
	if after.ProviderID != inst.ProviderID || after.UID != req.UID ||
		(after.State != provider.StateRunning && after.State != provider.StatePending) {
		t.Fatalf("after rebooting a stopped instance get returned %+v, want it running", after)
	}
	requireListedOnce(t, ctx, env, req.Name, "a reboot of a stopped instance")
}

// contractRebootDeleted: a reboot of an instance that was deleted, or never existed, is
// ErrNotFound and makes nothing.
func contractRebootDeleted(t *testing.T, ctx context.Context, env ContractEnv) {
	r := rebooter(t, env)
	req := request(env, "reboot-deleted")
	inst := create(t, ctx, env, req)
	noErr(t, "delete "+inst.ProviderID, env.Provider.Delete(ctx, inst.ProviderID))
	requireClass(t, "reboot of the deleted "+inst.ProviderID, r.Reboot(ctx, inst.ProviderID), provider.ErrNotFound)
	if env.MissingID != "" {
		requireClass(t, "reboot "+env.MissingID, r.Reboot(ctx, env.MissingID), provider.ErrNotFound)
	}
	list, err := env.Provider.ListByTag(ctx)
	noErr(t, "list", err)
	if n := countName(list, req.Name); n != 0 {
		t.Fatalf("after a reboot of the deleted %s, ListByTag holds it %d times, want 0", req.Name, n)
	}
}

// contractRebootMalformed: a providerID the provider cannot read is ErrPermanent.
func contractRebootMalformed(t *testing.T, ctx context.Context, env ContractEnv) {
	r := rebooter(t, env)
	if env.MalformedID == "" {
		t.Skip("ContractEnv.MalformedID not set")
	}
	requireClass(t, "reboot "+env.MalformedID, r.Reboot(ctx, env.MalformedID), provider.ErrPermanent)
}

// contractRebootForeign: an instance another install of the operator made is never
// rebooted: ErrPermanent, and it stays as it was.
func contractRebootForeign(t *testing.T, ctx context.Context, env ContractEnv) {
	r := rebooter(t, env)
	if env.ForeignInstance == nil {
		t.Skip("ContractEnv.ForeignInstance not set")
	}
	id, untouched := env.ForeignInstance(t, ctx)
	base := 0
	if env.Restarts != nil {
		base = env.Restarts(id)
	}
	requireClass(t, "reboot of another install's "+id, r.Reboot(ctx, id), provider.ErrPermanent)
	requireRestarts(t, env, id, base, "a refused reboot")
	untouched(t)
}
