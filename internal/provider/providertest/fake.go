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
	OpReboot = "reboot"
)

// Call is one recorded provider call. Arg is the provider.CreateRequest of a create, the
// providerID of a get, delete or reboot, and nil for list and check.
type Call struct {
	Op  string
	Arg any
}

// CreateHook runs inside Create after the injected error (if any) and before the
// instance is recorded. It may block (honouring ctx), report progress through
// provider.ReportProgress, or fail the call by returning an error.
type CreateHook func(ctx context.Context, req provider.CreateRequest) error

// RebootHook runs inside Reboot after the injected error (if any) and the checks (the
// instance exists and is this install's), before the instance is restarted. It may
// block (honouring ctx) or fail the call by returning an error, which leaves the
// instance as it was.
type RebootHook func(ctx context.Context, providerID string) error

// Fake is a stateful in-memory provider. Instances are keyed by providerID; Create is
// idempotent by name. Every method is safe for concurrent use, including the setters, so
// a test may change the fake while a controller is calling it.
type Fake struct {
	mu        sync.Mutex
	instances map[string]provider.Instance
	calls     []Call
	nextErr   map[string]error
	hook      CreateHook
	// foreign are instances of another install, by providerID: Get does not see them,
	// Create of their name and Reboot are refused, Delete leaves them alone.
	foreign    map[string]provider.Instance
	rebootHook RebootHook
	rebootErr  error          // every Reboot fails with it while set
	reboots    map[string]int // completed reboots by providerID
	check      []provider.TargetStatus
	ipFor      func(provider.CreateRequest) string
	now        func() time.Time
	ipCounter  int
	// pend is how many of the next Creates return the pending result; pended counts
	// those returned so far.
	pend, pended int
}

var (
	_ provider.Provider = (*Fake)(nil)
	_ provider.Rebooter = (*Fake)(nil)
)

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
	f.foreign = map[string]provider.Instance{}
	f.rebootHook, f.rebootErr = nil, nil
	f.reboots = map[string]int{}
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

// NextRebootErr makes the next Reboot return err (once); the instance is not restarted.
func (f *Fake) NextRebootErr(err error) { f.setNextErr(OpReboot, err) }

// FailReboots makes every Reboot return err, after it is recorded and before it has any
// effect, until it is called again; nil clears it. A one-shot NextRebootErr goes first.
func (f *Fake) FailReboots(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rebootErr = err
}

// SetRebootHook installs h (nil removes it).
func (f *Fake) SetRebootHook(h RebootHook) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rebootHook = h
}

// Reboots returns how many Reboots of providerID have restarted it (refused and failed
// ones not counted).
func (f *Fake) Reboots(providerID string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reboots[providerID]
}

// AddForeignInstance puts an instance called name in place that another install of the
// operator made, and returns its providerID. As the real providers do, Get reports it
// not found, ListByTag leaves it out, Delete leaves it alone (success), and Create of its
// name and Reboot of it are ErrPermanent. ForeignInstance tells whether it is still
// there, unchanged.
func (f *Fake) AddForeignInstance(name string) string {
	id := ProviderID(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.foreign[id] = provider.Instance{ProviderID: id, Name: name, UID: "uid-of-another-install",
		State: provider.StateRunning, IP: "10.255.0.1", CreatedAt: f.now()}
	return id
}

// ForeignInstance returns the instance of another install stored under providerID.
func (f *Fake) ForeignInstance(providerID string) (provider.Instance, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	inst, ok := f.foreign[providerID]
	return inst, ok
}

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
	if _, ok := f.foreign[id]; ok {
		return provider.Instance{}, provider.Errorf(provider.ErrPermanent,
			"fake: instance %s belongs to another install of the operator", req.Name)
	}
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

// Reboot implements provider.Rebooter: a stored instance is restarted in place, keeping its
// providerID, name, UID, IP and creation time, and runs afterwards (a stopped one is
// started, and given an address when it has none, as SetIPFunc or the 10.0.x.y sequence
// says); Reboots counts it. A missing one is ErrNotFound, an instance of another
// install (AddForeignInstance) ErrPermanent and untouched.
func (f *Fake) Reboot(ctx context.Context, providerID string) error {
	if err := f.record(OpReboot, providerID); err != nil {
		return err
	}
	if _, err := parseID(providerID); err != nil {
		return err
	}
	f.mu.Lock()
	hook, failing := f.rebootHook, f.rebootErr
	_, foreign := f.foreign[providerID]
	_, exists := f.instances[providerID]
	f.mu.Unlock()
	switch {
	case failing != nil:
		return failing
	case foreign:
		return provider.Errorf(provider.ErrPermanent,
			"fake: instance %s belongs to another install of the operator; not rebooted", providerID)
	case !exists:
		return provider.Errorf(provider.ErrNotFound, "fake: instance %s not found", providerID)
	}
	if hook != nil {
		if err := hook(ctx, providerID); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return provider.Transient(fmt.Errorf("fake: reboot %s: %w", providerID, err))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	inst, ok := f.instances[providerID]
	if !ok {
		return provider.Errorf(provider.ErrNotFound, "fake: instance %s not found", providerID)
	}
	inst.State = provider.StateRunning
	if inst.IP == "" {
		inst.IP = f.nextIPLocked(provider.CreateRequest{Name: inst.Name, UID: inst.UID})
	}
	f.instances[providerID] = inst
	f.reboots[providerID]++
	return nil
}

// WithoutReboot hides the Rebooter of p: the result is p's plain provider.Provider, for
// tests of callers facing a provider that cannot reboot.
func WithoutReboot(p provider.Provider) provider.Provider { return noReboot{p} }

type noReboot struct{ provider.Provider }

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
