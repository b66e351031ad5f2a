package proxy

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// A Proxy failing transiently for a long time is retried at least every maxErrorBackoff,
// not after controller-runtime's default ceiling of about 17 minutes.
func TestErrorBackoffIsCapped(t *testing.T) {
	rl := errorBackoff()
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "px"}}
	var last time.Duration
	for i := 0; i < 40; i++ {
		last = rl.When(req)
	}
	if last != maxErrorBackoff {
		t.Fatalf("delay after 40 failures = %v, want the cap %v", last, maxErrorBackoff)
	}
	rl.Forget(req)
	if d := rl.When(req); d > time.Second {
		t.Fatalf("delay after Forget = %v, want the curve to start again near 5ms", d)
	}
}
