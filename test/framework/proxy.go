package framework

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// NewClient is an uncached client for cfg that knows client-go's types and the
// project's.
func NewClient(t testing.TB, cfg *rest.Config) client.Client {
	t.Helper()
	scheme, err := testenv.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("client for %s: %v", cfg.Host, err)
	}
	return c
}

// IsReady: the Proxy is Ready and healthy (its probe went through the guest's proxy),
// with an address.
func IsReady(px *v1alpha1.Proxy) bool {
	return px.Status.Phase == v1alpha1.PhaseReady && px.Status.Healthy && px.Status.IP != "" &&
		meta.IsStatusConditionTrue(px.Status.Conditions, v1alpha1.ConditionHealthy)
}

// IsRunning: the Proxy's VM runs (Running or Ready) with an address.
func IsRunning(px *v1alpha1.Proxy) bool {
	return (px.Status.Phase == v1alpha1.PhaseRunning || px.Status.Phase == v1alpha1.PhaseReady) && px.Status.IP != ""
}

// PhaseLine is the Proxy's status in one line, as progress and failures show it.
func PhaseLine(px *v1alpha1.Proxy) string {
	line := fmt.Sprintf("phase=%s ip=%s healthy=%t", px.Status.Phase, px.Status.IP, px.Status.Healthy)
	if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned); c != nil {
		line += fmt.Sprintf(" provisioned=%s/%s %q", c.Status, c.Reason, c.Message)
	}
	if px.Status.Message != "" {
		line += fmt.Sprintf(" message=%q", px.Status.Message)
	}
	return line
}

// LazyState is a state for testutil.WaitFor worked out only when it is shown (a progress
// line, the failure).
type LazyState func() string

func (f LazyState) Error() string { return f() }

// WaitProxy waits (testutil.WaitFor, polling every 500 ms unless opts say otherwise)
// until Proxy key satisfies ok and returns it. Each change of the Proxy's PhaseLine is
// logged; the failure names what was awaited and the last line seen.
func WaitProxy(t testing.TB, c client.Client, key types.NamespacedName, what string, timeout time.Duration,
	ok func(*v1alpha1.Proxy) bool, opts ...testutil.WaitOption) *v1alpha1.Proxy {
	t.Helper()
	var got *v1alpha1.Proxy
	last := ""
	opts = append([]testutil.WaitOption{testutil.Every(500 * time.Millisecond)}, opts...)
	testutil.WaitFor(t, timeout, "Proxy "+key.String()+" "+what, func() (bool, error) {
		px := &v1alpha1.Proxy{}
		if err := c.Get(context.Background(), key, px); err != nil {
			return false, fmt.Errorf("reading Proxy %s: %w", key, err)
		}
		if line := PhaseLine(px); line != last {
			t.Logf("Proxy %s: %s", key, line)
			last = line
		}
		got = px
		return ok(px), fmt.Errorf("%s", last)
	}, opts...)
	return got
}
