package libvirtfake

import (
	"crypto/rand"
	"fmt"
	"sort"
	"sync"

	"github.com/digitalocean/go-libvirt"
)

// Defaults of a new Fake.
const (
	DefaultHostname   = "fakehost"
	DefaultLibVersion = uint64(9_000_000) // 9.0.0, the version Debian bookworm ships
	DefaultPool       = "default"
	DefaultPoolPath   = "/var/lib/libvirt/images"
	DefaultPoolSize   = uint64(100 << 30)
)

// methods lists every name the fault and blocking hooks accept: the backend
// methods plus the connection procedures the RPC server answers.
var methods = map[string]bool{
	"ConnectOpen": true, "ConnectClose": true, "AuthList": true,
	"ConnectGetLibVersion": true, "ConnectGetHostname": true, "ConnectListAllDomains": true,
	"StoragePoolLookupByName": true, "StoragePoolGetInfo": true, "StoragePoolRefresh": true,
	"StorageVolLookupByName": true, "StorageVolCreateXML": true, "StorageVolGetPath": true,
	"StorageVolGetInfo": true, "StorageVolDelete": true, "StorageVolUpload": true,
	"StorageVolDownload": true,
	"DomainLookupByName": true, "DomainDefineXMLFlags": true, "DomainCreate": true,
	"DomainGetState": true, "DomainGetMetadata": true, "DomainInterfaceAddresses": true,
	"DomainDestroyFlags": true, "DomainReset": true, "DomainUndefineFlags": true,
}

// Fake is a stateful in-memory libvirt daemon. The zero value is not usable;
// create one with New. All methods are safe for concurrent use.
type Fake struct {
	mu          sync.Mutex
	hostname    string
	libVersion  uint64
	pools       map[string]*pool
	domains     map[string]*domain // by name
	nextID      int32
	uploads     []Upload
	calls       map[string]int
	failNext    map[string][]error
	failAlways  map[string]error
	gates       map[string]*Gate   // before the call takes effect
	nextGates   map[string][]*Gate // one call each, in order, before it takes effect
	returnGates map[string]*Gate   // after it took effect, before it returns
	afterCreate map[string]libvirt.DomainState
	leases      *leases // AssignAddresses; nil: starts give no address

	srv serverState
}

// New returns a Fake with hostname DefaultHostname, version DefaultLibVersion
// and one running pool, DefaultPool at DefaultPoolPath with DefaultPoolSize
// bytes of capacity. No domains or volumes exist.
func New() *Fake {
	f := &Fake{
		hostname:    DefaultHostname,
		libVersion:  DefaultLibVersion,
		pools:       map[string]*pool{},
		domains:     map[string]*domain{},
		calls:       map[string]int{},
		failNext:    map[string][]error{},
		failAlways:  map[string]error{},
		gates:       map[string]*Gate{},
		nextGates:   map[string][]*Gate{},
		returnGates: map[string]*Gate{},
		afterCreate: map[string]libvirt.DomainState{},
	}
	f.AddPool(DefaultPool, DefaultPoolPath, DefaultPoolSize)
	return f
}

func checkMethod(method string) {
	if !methods[method] {
		panic(fmt.Sprintf("libvirtfake: unknown method %q", method))
	}
}

// FailNext makes the next call of method fail with err, before it has any
// effect. Several calls queue up and are used in order; they take precedence
// over an error set with Fail. method is a backend method name such as
// "DomainCreate" (or "ConnectOpen", "ConnectClose", "AuthList" for the RPC
// server); an unknown name panics.
func (f *Fake) FailNext(method string, err error) {
	checkMethod(method)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext[method] = append(f.failNext[method], err)
}

// Fail makes every call of method fail with err, before it has any effect,
// until Fail is called again; a nil err clears it.
func (f *Fake) Fail(method string, err error) {
	checkMethod(method)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.failAlways, method)
		return
	}
	f.failAlways[method] = err
}

// Calls returns how many times method has been called, failed calls included.
func (f *Fake) Calls(method string) int {
	checkMethod(method)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// CallCounts returns a copy of every method's call count.
func (f *Fake) CallCounts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.calls))
	for k, v := range f.calls {
		out[k] = v
	}
	return out
}

// TotalCalls returns the number of calls of all methods together.
func (f *Fake) TotalCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, v := range f.calls {
		n += v
	}
	return n
}

// ResetCalls sets every call count to zero.
func (f *Fake) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = map[string]int{}
}

// Block makes every call of method wait, before it has any effect, until the
// returned Gate is released. Over the RPC server the client sees a call that
// never answers. Release the gate (for example in t.Cleanup) before the test
// ends, or the blocked calls leak.
func (f *Fake) Block(method string) *Gate {
	return f.installGate(f.gates, method)
}

// BlockNext holds only the next call of method, before it has any effect,
// until the returned Gate is released; the calls after it pass (or meet the
// gate of a later BlockNext: each one takes the next call in turn). This is
// how a test stops one of two concurrent callers at a chosen step and lets
// the other run on. A Block gate on the same method holds a call first.
func (f *Fake) BlockNext(method string) *Gate {
	checkMethod(method)
	g := newGate()
	g.remove = func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		q := f.nextGates[method]
		for i, o := range q {
			if o == g {
				f.nextGates[method] = append(q[:i:i], q[i+1:]...)
				break
			}
		}
		if len(f.nextGates[method]) == 0 {
			delete(f.nextGates, method)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextGates[method] = append(f.nextGates[method], g)
	return g
}

// BlockReturn lets every call of method take effect and then holds its return
// (over the RPC server: its reply) until the returned Gate is released: the
// state has changed but the caller does not know.
func (f *Fake) BlockReturn(method string) *Gate {
	return f.installGate(f.returnGates, method)
}

func (f *Fake) installGate(set map[string]*Gate, method string) *Gate {
	checkMethod(method)
	g := newGate()
	g.remove = func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if set[method] == g {
			delete(set, method)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	set[method] = g
	return g
}

// SetStateAfterCreate makes the next successful DomainCreate of the domain
// called name leave it in state (DomainShutoff, DomainCrashed, DomainPaused,
// ...) instead of running, as a guest that dies right after its start does.
func (f *Fake) SetStateAfterCreate(name string, state libvirt.DomainState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.afterCreate[name] = state
}

// enter counts a call, waits at the method's Block gate and returns the
// injected error, if any. Every public libvirt method starts with it.
func (f *Fake) enter(method string) error {
	f.mu.Lock()
	f.calls[method]++
	g := f.gates[method]
	f.mu.Unlock()
	if g != nil {
		g.wait()
	}
	f.mu.Lock()
	var next *Gate
	if q := f.nextGates[method]; len(q) > 0 {
		next = q[0]
		if len(q) == 1 {
			delete(f.nextGates, method)
		} else {
			f.nextGates[method] = q[1:]
		}
	}
	f.mu.Unlock()
	if next != nil {
		next.wait()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if q := f.failNext[method]; len(q) > 0 {
		err := q[0]
		if len(q) == 1 {
			delete(f.failNext, method)
		} else {
			f.failNext[method] = q[1:]
		}
		return err
	}
	return f.failAlways[method]
}

// leave waits at the method's BlockReturn gate. Every public libvirt method
// defers it.
func (f *Fake) leave(method string) {
	f.mu.Lock()
	g := f.returnGates[method]
	f.mu.Unlock()
	if g != nil {
		g.wait()
	}
}

// Gate holds the calls of one method until it is released.
type Gate struct {
	entered     chan struct{}
	enteredOnce sync.Once
	released    chan struct{}
	releaseOnce sync.Once
	mu          sync.Mutex
	waiting     int
	remove      func()
}

func newGate() *Gate {
	return &Gate{entered: make(chan struct{}), released: make(chan struct{})}
}

// Entered is closed once the first call has reached the gate.
func (g *Gate) Entered() <-chan struct{} { return g.entered }

// Waiting returns how many calls are held at the gate right now.
func (g *Gate) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting
}

// Release lets the held calls go on and removes the gate, so later calls
// pass straight through. It is idempotent.
func (g *Gate) Release() {
	g.releaseOnce.Do(func() {
		g.remove()
		close(g.released)
	})
}

func (g *Gate) wait() {
	g.mu.Lock()
	g.waiting++
	g.mu.Unlock()
	g.enteredOnce.Do(func() { close(g.entered) })
	<-g.released
	g.mu.Lock()
	g.waiting--
	g.mu.Unlock()
}

func newUUID() libvirt.UUID {
	var u libvirt.UUID
	_, _ = rand.Read(u[:])
	u[6] = (u[6] & 0x0f) | 0x40
	u[8] = (u[8] & 0x3f) | 0x80
	return u
}

// FormatUUID renders a UUID the way libvirt prints it.
func FormatUUID(u libvirt.UUID) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
