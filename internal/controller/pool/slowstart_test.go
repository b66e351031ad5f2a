package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
)

// slowStartEnv is a pool and a reconciler of its own (no manager: the test runs each
// pass) whose child creates go through create, in a namespace of the test's own.
type slowStartEnv struct {
	*poolEnv
	r   *ProxyPoolReconciler
	req ctrl.Request
}

func newSlowStartEnv(t *testing.T, replicas int32,
	create func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error) *slowStartEnv {
	env := shared.Env(t)
	ctx := testContext(t)
	e := &poolEnv{&controllertest.PoolEnv{T: t, Ctx: ctx, Env: env, C: env.Client, NS: env.Namespace(t, ctx, "slowstart")}}
	pool := e.Create(e.NewPool("p", replicas))
	c := interceptor.NewClient(controllertest.NoWatch{Client: env.Client}, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*v1alpha1.Proxy); !ok {
				return c.Create(ctx, obj, opts...)
			}
			return create(ctx, c, obj, opts...)
		},
	})
	return &slowStartEnv{poolEnv: e,
		r: &ProxyPoolReconciler{Client: c, APIReader: env.Client, Scheme: env.Scheme, Zones: controllertest.PoolZones,
			Clock: clocktesting.NewFakeClock(time.Now())},
		req: ctrl.Request{NamespacedName: types.NamespacedName{Namespace: e.NS, Name: pool.Name}}}
}

func (e *slowStartEnv) children() int {
	e.T.Helper()
	list := &v1alpha1.ProxyList{}
	if err := e.C.List(e.Ctx, list, client.InNamespace(e.NS)); err != nil {
		e.T.Fatal(err)
	}
	return len(list.Items)
}

// A pass creates its children with a slow start: one create in flight, then 2, 4, …, up
// to createBatchLimit at once, with no barrier between those groups. Each create here is
// held until the test lets it through, so the numbers in flight are exact.
func TestPoolCreateSlowStart(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var held []chan struct{}
	inFlight, sent := 0, 0
	e := newSlowStartEnv(t, 70, func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		gate := make(chan struct{})
		mu.Lock()
		held, inFlight, sent = append(held, gate), inFlight+1, sent+1
		mu.Unlock()
		defer func() { mu.Lock(); inFlight--; mu.Unlock() }()
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
		return c.Create(ctx, obj, opts...)
	})
	done := make(chan error, 1)
	go func() { _, err := e.r.Reconcile(e.Ctx, e.req); done <- err }()

	// settle waits until want creates are held and no other is in flight or sent beyond
	// wantSent, then lets the first release of them through.
	settle := func(what string, want, wantSent, release int) {
		t.Helper()
		waitFor(t, 30*time.Second, what, func() (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			return len(held) == want && inFlight == want && sent == wantSent,
				fmt.Errorf("%d held, %d in flight, %d sent", len(held), inFlight, sent)
		})
		time.Sleep(50 * time.Millisecond) // room for a create beyond these to show up
		mu.Lock()
		defer mu.Unlock()
		if len(held) != want || sent != wantSent {
			t.Fatalf("%s: %d creates in flight and %d sent, want %d and %d", what, len(held), sent, want, wantSent)
		}
		for _, gate := range held[:release] {
			close(gate)
		}
		held = held[release:]
	}
	total := 0
	for _, n := range []int{1, 2, 4, 8, 16} {
		total += n
		settle(fmt.Sprintf("%d creates in flight", n), n, total, n)
	}
	// 31 made; 32 at once, the limit. One answer lets exactly one more create out, without
	// waiting for the other 31.
	settle("32 creates in flight", 32, 63, 1)
	settle("one more create for the one answered", 32, 64, 32)
	settle("the 6 left", 6, 70, 6)
	if err := <-done; err != nil {
		t.Fatalf("the pass: %v", err)
	}
	if n := e.children(); n != 70 {
		t.Errorf("%d children after the pass, want 70", n)
	}
}

// The first refused create stops a pass's creates: a template every create fails costs
// one request; a quota reached after a few children stops the creates once the first
// refusal is answered, the status counts what was made, and the next pass makes the rest
// from its own live list.
func TestPoolCreateFailureStopsSlowStart(t *testing.T) {
	t.Parallel()
	refused := func(obj client.Object) error {
		return apierrors.NewForbidden(schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "proxies"}, obj.GetName(),
			errors.New(`admission webhook "deny.example.com" denied the request`))
	}
	t.Run("bad template", func(t *testing.T) {
		var calls atomic.Int32
		e := newSlowStartEnv(t, 10, func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
			calls.Add(1)
			return refused(obj)
		})
		if _, err := e.r.Reconcile(e.Ctx, e.req); !apierrors.IsForbidden(err) {
			t.Fatalf("the pass returned %v, want the Forbidden error", err)
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("%d creates sent, want 1", n)
		}
		if n := e.children(); n != 0 {
			t.Errorf("%d children, want none", n)
		}
	})
	t.Run("quota after 3", func(t *testing.T) {
		var calls atomic.Int32
		var refuse atomic.Bool
		refuse.Store(true)
		e := newSlowStartEnv(t, 10, func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if calls.Add(1) > 3 && refuse.Load() {
				return refused(obj)
			}
			return c.Create(ctx, obj, opts...)
		})
		if _, err := e.r.Reconcile(e.Ctx, e.req); !apierrors.IsForbidden(err) {
			t.Fatalf("the pass returned %v, want the Forbidden error", err)
		}
		// 3 successes make room for at most 1+3 creates in flight when the first refusal
		// comes back.
		if n := calls.Load(); n < 4 || n > 7 {
			t.Errorf("%d creates sent, want 4 to 7", n)
		}
		if n := e.children(); n != 3 {
			t.Errorf("%d children after the pass, want the 3 the API server accepted", n)
		}
		if got := e.GetPool("p").Status.Replicas; got != 3 {
			t.Errorf("status.replicas %d after the pass, want 3", got)
		}
		refuse.Store(false)
		calls.Store(0)
		if _, err := e.r.Reconcile(e.Ctx, e.req); err != nil {
			t.Fatalf("the next pass: %v", err)
		}
		if n := calls.Load(); n != 7 {
			t.Errorf("the next pass sent %d creates, want the 7 missing", n)
		}
		if n := e.children(); n != 10 {
			t.Errorf("%d children after the next pass, want 10", n)
		}
	})
}
