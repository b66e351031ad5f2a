package libvirtfake

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"sync"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"go.uber.org/goleak"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// backendMethods reads the method names of kvm2's backend interface from its
// source, so the check below follows the interface as it changes.
func backendMethods(t *testing.T) []string {
	t.Helper()
	file, err := parser.ParseFile(token.NewFileSet(), "../backend.go", nil, 0)
	if err != nil {
		t.Fatalf("parsing ../backend.go: %v", err)
	}
	var names []string
	ast.Inspect(file, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "backend" {
			return true
		}
		for _, m := range ts.Type.(*ast.InterfaceType).Methods.List {
			for _, id := range m.Names {
				names = append(names, id.Name)
			}
		}
		return false
	})
	if len(names) == 0 {
		t.Fatal("no backend interface found in ../backend.go")
	}
	return names
}

// The backend interface is unexported, so the fake cannot name it; kvm2's
// tests assert it. Here: every backend method exists on *Fake with exactly
// the signature *libvirt.Libvirt has (the interface is written against it),
// and every one of them is accepted by the fault hooks.
func TestFakeHasEveryBackendMethod(t *testing.T) {
	fake := reflect.TypeOf((*Fake)(nil))
	real := reflect.TypeOf((*libvirt.Libvirt)(nil))
	for _, name := range backendMethods(t) {
		fm, ok := fake.MethodByName(name)
		if !ok {
			t.Errorf("*Fake has no method %s", name)
			continue
		}
		rm, _ := real.MethodByName(name)
		if got, want := withoutReceiver(fm.Type), withoutReceiver(rm.Type); got != want {
			t.Errorf("%s: fake %s, go-libvirt %s", name, got, want)
		}
		if !methods[name] {
			t.Errorf("%s is not accepted by the hooks", name)
		}
	}
}

func withoutReceiver(m reflect.Type) reflect.Type {
	in := make([]reflect.Type, 0, m.NumIn()-1)
	for i := 1; i < m.NumIn(); i++ {
		in = append(in, m.In(i))
	}
	out := make([]reflect.Type, 0, m.NumOut())
	for i := range m.NumOut() {
		out = append(out, m.Out(i))
	}
	return reflect.FuncOf(in, out, m.IsVariadic())
}

func TestUnknownMethodNamePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("FailNext with a misspelt method did not panic")
		}
	}()
	New().FailNext("DomainCreat", errors.New("x"))
}

func TestFailNextQueuesAndPrecedesFail(t *testing.T) {
	f := New()
	first := Errorf(libvirt.ErrInternalError, "first")
	second := Errorf(libvirt.ErrInternalError, "second")
	always := Errorf(libvirt.ErrOperationFailed, "always")
	f.FailNext("ConnectGetHostname", first)
	f.FailNext("ConnectGetHostname", second)
	f.Fail("ConnectGetHostname", always)
	for i, want := range []error{first, second, always, always} {
		if _, err := f.ConnectGetHostname(); !errors.Is(err, want) {
			t.Fatalf("call %d: got %v, want %v", i, err, want)
		}
	}
	f.Fail("ConnectGetHostname", nil)
	if h, err := f.ConnectGetHostname(); err != nil || h != DefaultHostname {
		t.Fatalf("after clearing: %q, %v", h, err)
	}
	if got := f.Calls("ConnectGetHostname"); got != 5 {
		t.Fatalf("Calls = %d, want 5 (failed calls count)", got)
	}
}

func TestInjectedFaultHasNoEffect(t *testing.T) {
	f := New()
	f.FailNext("DomainDefineXMLFlags", Errorf(libvirt.ErrInternalError, "boom"))
	if _, err := f.DomainDefineXMLFlags(domXML("vm1", ""), 0); err == nil {
		t.Fatal("define succeeded despite the injected fault")
	}
	if _, ok := f.Domain("vm1"); ok {
		t.Fatal("a failed define left a domain behind")
	}
}

// BlockNext holds one call per gate, in the order the calls arrive, and lets the rest
// through; the held calls go on in the order their gates are released.
func TestBlockNextHoldsOneCallEach(t *testing.T) {
	f := New()
	first, second := f.BlockNext("ConnectGetLibVersion"), f.BlockNext("ConnectGetLibVersion")
	defer first.Release()
	defer second.Release()
	done := make(chan int, 2)
	go func() { _, _ = f.ConnectGetLibVersion(); done <- 1 }()
	<-first.Entered()
	go func() { _, _ = f.ConnectGetLibVersion(); done <- 2 }()
	<-second.Entered()
	// Both gates are taken: a third call passes straight through.
	if _, err := f.ConnectGetLibVersion(); err != nil {
		t.Fatal(err)
	}
	second.Release()
	if got := <-done; got != 2 {
		t.Fatalf("call %d returned first, want the one behind the released gate", got)
	}
	select {
	case <-done:
		t.Fatal("the call behind the first gate returned before its release")
	default:
	}
	first.Release()
	if got := <-done; got != 1 {
		t.Fatalf("call %d returned, want 1", got)
	}
	// A gate released before any call reached it takes none.
	unused := f.BlockNext("ConnectGetHostname")
	unused.Release()
	if _, err := f.ConnectGetHostname(); err != nil {
		t.Fatal(err)
	}
}

func TestBlockHoldsCallsUntilReleased(t *testing.T) {
	f := New()
	g := f.Block("ConnectGetLibVersion")
	defer g.Release()
	var wg sync.WaitGroup
	done := make(chan struct{}, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = f.ConnectGetLibVersion()
			done <- struct{}{}
		}()
	}
	<-g.Entered()
	testutil.WaitFor(t, waitLong, "two calls held at the gate", func() (bool, error) {
		return g.Waiting() == 2, fmt.Errorf("%d calls held", g.Waiting())
	})
	select {
	case <-done:
		t.Fatal("a blocked call returned before the release")
	default:
	}
	// Other methods are not held.
	if _, err := f.ConnectGetHostname(); err != nil {
		t.Fatal(err)
	}
	g.Release()
	wg.Wait()
	if _, err := f.ConnectGetLibVersion(); err != nil {
		t.Fatalf("call after release: %v", err)
	}
}

func TestBlockReturnAppliesBeforeHolding(t *testing.T) {
	f := New()
	g := f.BlockReturn("DomainDefineXMLFlags")
	res := make(chan error, 1)
	go func() {
		_, err := f.DomainDefineXMLFlags(domXML("vm1", ""), 0)
		res <- err
	}()
	<-g.Entered()
	if _, ok := f.Domain("vm1"); !ok {
		t.Fatal("the held define had not taken effect")
	}
	g.Release()
	if err := <-res; err != nil {
		t.Fatal(err)
	}
}

func TestCallCounters(t *testing.T) {
	f := New()
	_, _ = f.ConnectGetLibVersion()
	_, _ = f.ConnectGetLibVersion()
	_, _ = f.DomainLookupByName("nope")
	if got := f.CallCounts(); got["ConnectGetLibVersion"] != 2 || got["DomainLookupByName"] != 1 {
		t.Fatalf("CallCounts = %v", got)
	}
	if f.TotalCalls() != 3 {
		t.Fatalf("TotalCalls = %d", f.TotalCalls())
	}
	f.ResetCalls()
	if f.TotalCalls() != 0 {
		t.Fatal("ResetCalls left counts")
	}
}

func TestErrorfUsesLibvirtWording(t *testing.T) {
	err := Errorf(libvirt.ErrAccessDenied, "'%s' denied access", "novakj")
	if err.Message != "access denied: 'novakj' denied access" || err.Code != uint32(libvirt.ErrAccessDenied) {
		t.Fatalf("got %+v", err)
	}
	if e := Errorf(libvirt.ErrSystemError, "raw"); e.Message != "raw" {
		t.Fatalf("code without prefix: %q", e.Message)
	}
}

// waitLong is the deadline of a wait on the fake's state (testutil.WaitFor): one only a
// broken test reaches.
const waitLong = testutil.WaitLong

func libvirtCode(err error) libvirt.ErrorNumber {
	var e libvirt.Error
	if errors.As(err, &e) {
		return libvirt.ErrorNumber(e.Code)
	}
	return -1
}
