// Package providertest holds an in-memory provider for tests of the code that drives
// providers, and the contract suite every provider.Provider implementation must pass.
package providertest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// IDPrefix starts every providerID the fake hands out: "fake/<instance name>".
const IDPrefix = "fake/"

// Operations recorded in Calls.
const (
	OpCreate = "create"
	OpGet    = "get"
	OpDelete = "delete"
	OpList   = "list"
	OpCheck  = "check"
)

// Call is one recorded provider call. Arg is the provider.CreateRequest of a create, the
// providerID of a get or delete, and nil for list and check.
type Call struct {
	Op  string
	Arg any
}

// CreateHook runs inside Create after the injected error (if any) and before the
// instance is recorded. It may block (honouring ctx), report progress through
// provider.ReportProgress, or fail the call by returning an error.
type CreateHook func(ctx context.Context, req provider.CreateRequest) error

// Fake is a stateful in-memory provider. Instances are keyed by providerID; Create is
// idempotent by name. Every method is safe for concurrent use, including the setters, so
// a test may change the fake while a controller is calling it.
type Fake struct {
	mu        sync.Mutex
	instances map[string]provider.Instance
	calls     []Call
	nextErr   map[string]error
	hook      CreateHook
	check     []provider.TargetStatus
	ipFor     func(provider.CreateRequest) string
	now       func() time.Time
	ipCounter int
	// pend is how many of the next Creates return the pending result; pended counts
	// those returned so far.
	pend, pended int
}

var _ provider.Provider = (*Fake)(nil)

// NewFake returns an empty fake whose Check reports one ready target named "fake".
func NewFake() *Fake {
	f := &Fake{}
	f.Reset()
	return f
}

// DefaultCheckResult is what Check returns until SetCheckResult is called.
func DefaultCheckResult() []provider.TargetStatus {
	return []provider.TargetStatus{{Target: "fake", Ready: true, Reason: "Ready"}}
}

// Reset forgets every instance, call, injected error, hook and setting.
func (f *Fake) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.instances = map[string]provider.Instance{}
	f.calls = nil
	f.nextErr = map[string]error{}
	f.hook = nil
	f.check = DefaultCheckResult()
	f.ipFor = nil
	f.now = time.Now
	f.ipCounter = 0
	f.pend, f.pended = 0, 0
}

// PendCreates makes the next n Creates (of any name) return provider.ErrPending, as a
// provider whose work outlives the call does, with progress of reason
// provider.ReasonImageDownloading counting through them; the Create after them proceeds.
func (f *Fake) PendCreates(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pend, f.pended = n, 0
}

// pending returns the pending result when a Create is still to pend.
func (f *Fake) pending(req provider.CreateRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pended >= f.pend {
		return nil
	}
	f.pended++
	return provider.Pending(provider.Progress{Reason: provider.ReasonImageDownloading,
		Message: fmt.Sprintf("fake: preparing instance %s, step %d of %d", req.Name, f.pended, f.pend),
		Done:    int64(f.pended - 1), Total: int64(f.pend)})
}

// ProviderID returns the providerID the fake gives an instance named name.
func ProviderID(name string) string { return IDPrefix + name }

// NextCreateErr makes the next Create return err (once), before anything else happens.
func (f *Fake) NextCreateErr(err error) { f.setNextErr(OpCreate, err) }

// NextGetErr makes the next Get return err (once).
func (f *Fake) NextGetErr(err error) { f.setNextErr(OpGet, err) }

// NextDeleteErr makes the next Delete return err (once); the instance stays.
func (f *Fake) NextDeleteErr(err error) { f.setNextErr(OpDelete, err) }

// NextListErr makes the next ListByTag return err (once).
func (f *Fake) NextListErr(err error) { f.setNextErr(OpList, err) }

func (f *Fake) setNextErr(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextErr[op] = err
}

// SetCreateHook installs h (nil removes it).
func (f *Fake) SetCreateHook(h CreateHook) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hook = h
}

// SetCheckResult sets what Check returns from now on.
func (f *Fake) SetCheckResult(ts []provider.TargetStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.check = cloneStatuses(ts)
}

// SetIPFunc chooses the IP of each new instance. By default instances get 10.0.x.y
// addresses in creation order.
func (f *Fake) SetIPFunc(fn func(provider.CreateRequest) string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ipFor = fn
}

// SetClock sets the source of CreatedAt for new instances (time.Now by default).
func (f *Fake) SetClock(now func() time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = now
}

// SetInstance puts inst in place as if someone had created or changed it behind the
// operator's back. An empty ProviderID is derived from Name. It returns the providerID.
func (f *Fake) SetInstance(inst provider.Instance) string {
	if inst.ProviderID == "" {
		inst.ProviderID = ProviderID(inst.Name)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.instances[inst.ProviderID] = inst
	return inst.ProviderID
}

// RemoveInstance deletes an instance behind the operator's back and reports whether it
// existed.
func (f *Fake) RemoveInstance(providerID string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.instances[providerID]
	delete(f.instances, providerID)
	return ok
}

// Instance returns the instance stored under providerID, without recording a call.
func (f *Fake) Instance(providerID string) (provider.Instance, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	inst, ok := f.instances[providerID]
	return inst, ok
}

// Instances returns every stored instance sorted by providerID, without recording a call.
func (f *Fake) Instances() []provider.Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sortedLocked()
}

// Calls returns a copy of every recorded call, oldest first.
func (f *Fake) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// CallsOf returns the recorded calls of one operation, oldest first.
func (f *Fake) CallsOf(op string) []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Call
	for _, c := range f.calls {
		if c.Op == op {
			out = append(out, c)
		}
	}
	return out
}

// CountOf returns how many calls of op were recorded.
func (f *Fake) CountOf(op string) int { return len(f.CallsOf(op)) }

// record appends a call and takes the one-shot error of op, if any.
func (f *Fake) record(op string, arg any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, Call{Op: op, Arg: arg})
	err := f.nextErr[op]
	delete(f.nextErr, op)
	return err
}

// Create implements provider.Provider.
func (f *Fake) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	req.CloudInit = slices.Clone(req.CloudInit)
	if err := f.record(OpCreate, req); err != nil {
		return provider.Instance{}, err
	}
	if req.Name == "" {
		return provider.Instance{}, provider.Errorf(provider.ErrPermanent, "fake: create: instance name is empty")
	}
	if err := f.pending(req); err != nil {
		return provider.Instance{}, err
	}
	f.mu.Lock()
	hook := f.hook
	f.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, req); err != nil {
			return provider.Instance{}, err
		}
	}
	if err := ctx.Err(); err != nil {
		return provider.Instance{}, provider.Transient(fmt.Errorf("fake: create %s: %w", req.Name, err))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	id := ProviderID(req.Name)
	if inst, ok := f.instances[id]; ok {
		if inst.UID != req.UID {
			return provider.Instance{}, provider.OwnedByOther(fmt.Errorf(
				"fake: instance %s is owned by uid %q, not %q", req.Name, inst.UID, req.UID))
		}
		return inst, nil
	}
	inst := provider.Instance{
		ProviderID: id,
		Name:       req.Name,
		UID:        req.UID,
		State:      provider.StateRunning,
		IP:         f.nextIPLocked(req),
		CreatedAt:  f.now(),
	}
	f.instances[id] = inst
	return inst, nil
}

func (f *Fake) nextIPLocked(req provider.CreateRequest) string {
	if f.ipFor != nil {
		return f.ipFor(req)
	}
	f.ipCounter++
	return fmt.Sprintf("10.0.%d.%d", f.ipCounter/250, f.ipCounter%250+1)
}

// parseID returns the instance name of a fake providerID.
func parseID(providerID string) (string, error) {
	name, ok := strings.CutPrefix(providerID, IDPrefix)
	if !ok || name == "" || strings.Contains(name, "/") {
		return "", provider.Errorf(provider.ErrPermanent, "fake: malformed providerID %q (want %s<name>)", providerID, IDPrefix)
	}
	return name, nil
}

// Get implements provider.Provider.
func (f *Fake) Get(_ context.Context, providerID string) (provider.Instance, error) {
	if err := f.record(OpGet, providerID); err != nil {
		return provider.Instance{}, err
	}
	if _, err := parseID(providerID); err != nil {
		return provider.Instance{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	inst, ok := f.instances[providerID]
	if !ok {
		return provider.Instance{}, provider.Errorf(provider.ErrNotFound, "fake: instance %s not found", providerID)
	}
	return inst, nil
}

// Delete implements provider.Provider.
func (f *Fake) Delete(_ context.Context, providerID string) error {
	if err := f.record(OpDelete, providerID); err != nil {
		return err
	}
	if _, err := parseID(providerID); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.instances, providerID)
	return nil
}

// ListByTag implements provider.Provider: every stored instance, sorted by providerID.
func (f *Fake) ListByTag(_ context.Context) ([]provider.Instance, error) {
	if err := f.record(OpList, nil); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sortedLocked(), nil
}

func (f *Fake) sortedLocked() []provider.Instance {
	out := make([]provider.Instance, 0, len(f.instances))
	for _, inst := range f.instances {
		out = append(out, inst)
	}
	slices.SortFunc(out, func(a, b provider.Instance) int { return strings.Compare(a.ProviderID, b.ProviderID) })
	return out
}

// Check implements provider.Provider.
func (f *Fake) Check(_ context.Context) []provider.TargetStatus {
	_ = f.record(OpCheck, nil)
	f.mu.Lock()
	defer f.mu.Unlock()
	return cloneStatuses(f.check)
}

func cloneStatuses(ts []provider.TargetStatus) []provider.TargetStatus {
	out := slices.Clone(ts)
	for i := range out {
		if out[i].Details != nil {
			d := make(map[string]string, len(out[i].Details))
			for k, v := range out[i].Details {
				d[k] = v
			}
			out[i].Details = d
		}
	}
	return out
}
