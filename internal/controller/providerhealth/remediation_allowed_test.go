package providerhealth

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// The RemediationAllowed condition a provider's ProviderHealth carries (what the
// monitor's Remediation func, the Proxy reconciler's ProviderRemediation, gives each
// round), worked out from the Proxies alone with no API server, one row per situation,
// as cluster-api's machineset_controller_status_test.go does: the Proxies in, the
// condition's status, reason and message out.

var brakeNow = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

// brakeProxy is a Proxy of provider in zone named name, by state: "healthy" (probed
// healthy), "stuck" (running past its boot timeout, never answered: unhealthy to the
// brake), "booting" (running, within its boot timeout: not counted), "external", or
// "pooled" (a pool's child); every other provider's too.
func brakeProxy(name, prov, zone, state string) *v1alpha1.Proxy {
	opts := []testbuild.Option{testbuild.Managed(), testbuild.WithProvider(prov),
		testbuild.WithPlacement(v1alpha1.ProxyPlacement{Zone: zone}), testbuild.WithPort(3128),
		testbuild.WithIP("10.0.0.1"), testbuild.WithStatus(func(st *v1alpha1.ProxyStatus) { st.ProviderID = "id-" + name })}
	running := func(since time.Duration) testbuild.Option {
		return testbuild.WithCondition(metav1.Condition{Type: v1alpha1.ConditionProvisioned, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonInstanceRunning, LastTransitionTime: metav1.NewTime(brakeNow.Add(-since))})
	}
	switch state {
	case "healthy":
		opts = append(opts, running(time.Hour), testbuild.WithPhase(v1alpha1.PhaseReady), testbuild.Healthy(),
			testbuild.WithStatus(func(st *v1alpha1.ProxyStatus) {
				st.ProbeTarget, st.ProbeLatencyMilliseconds = "id-"+name+" 10.0.0.1:3128", 1
			}),
			testbuild.WithCondition(metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue,
				Reason: v1alpha1.ReasonProbeSucceeded, LastTransitionTime: metav1.NewTime(brakeNow.Add(-50 * time.Minute))}))
	case "stuck":
		opts = append(opts, running(remediation.DefaultBootTimeout+time.Minute), testbuild.WithPhase(v1alpha1.PhaseRunning))
	case "booting":
		opts = append(opts, running(time.Minute), testbuild.WithPhase(v1alpha1.PhaseRunning))
	case "external":
		opts = append(opts, testbuild.External("203.0.113.7:3128"))
	case "pooled":
		opts = append(opts, running(remediation.DefaultBootTimeout+time.Minute), testbuild.WithOwners(metav1.OwnerReference{
			APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: "news", UID: "pool-uid", Controller: ptr.To(true)}))
	default:
		panic("brakeProxy: no state " + state)
	}
	return testbuild.Proxy("crawl", name, opts...)
}

func TestRemediationAllowedTable(t *testing.T) {
	const prov = "home"
	for _, tc := range []struct {
		name    string
		proxies []*v1alpha1.Proxy
		status  metav1.ConditionStatus
		reason  string
		msg     string // the whole message
	}{
		{"no standalone proxies", nil, metav1.ConditionTrue, common.PoolReasonWithinMaxUnhealthy,
			"no standalone Managed proxies of provider home: remediation allowed"},
		{"only other providers', external and pooled proxies", []*v1alpha1.Proxy{
			brakeProxy("a", "away", "beelink", "stuck"), brakeProxy("b", prov, "", "external"), brakeProxy("c", prov, "beelink", "pooled"),
		}, metav1.ConditionTrue, common.PoolReasonWithinMaxUnhealthy,
			"no standalone Managed proxies of provider home: remediation allowed"},
		{"all healthy", []*v1alpha1.Proxy{
			brakeProxy("a", prov, "beelink", "healthy"), brakeProxy("b", prov, "beelink", "healthy"),
		}, metav1.ConditionTrue, common.PoolReasonWithinMaxUnhealthy,
			"standalone proxies of provider/home/beelink: 0 of 2 unhealthy, at most maxUnhealthy 40% (1): remediation allowed"},
		{"one of two unhealthy: within 40%, rounded up", []*v1alpha1.Proxy{
			brakeProxy("a", prov, "beelink", "healthy"), brakeProxy("b", prov, "beelink", "stuck"),
		}, metav1.ConditionTrue, common.PoolReasonWithinMaxUnhealthy,
			"standalone proxies of provider/home/beelink: 1 of 2 unhealthy, at most maxUnhealthy 40% (1): remediation allowed"},
		{"a proxy still within its boot timeout is not counted", []*v1alpha1.Proxy{
			brakeProxy("a", prov, "beelink", "booting"), brakeProxy("b", prov, "beelink", "stuck"),
		}, metav1.ConditionTrue, common.PoolReasonWithinMaxUnhealthy,
			"standalone proxies of provider/home/beelink: 1 of 2 unhealthy, at most maxUnhealthy 40% (1): remediation allowed"},
		{"two of two unhealthy: held", []*v1alpha1.Proxy{
			brakeProxy("a", prov, "beelink", "stuck"), brakeProxy("b", prov, "beelink", "stuck"),
		}, metav1.ConditionFalse, remediation.ReasonTooManyUnhealthy,
			"standalone proxies of provider/home/beelink: 2 of 2 unhealthy, more than maxUnhealthy 40% (1): remediation held; it resumes when at most 1 are unhealthy"},
		{"one zone held names that zone alone", []*v1alpha1.Proxy{
			brakeProxy("a", prov, "beelink", "stuck"), brakeProxy("b", prov, "beelink", "stuck"), brakeProxy("c", prov, "nuc", "healthy"),
		}, metav1.ConditionFalse, remediation.ReasonTooManyUnhealthy,
			"standalone proxies of provider/home/beelink: 2 of 2 unhealthy, more than maxUnhealthy 40% (1): remediation held; it resumes when at most 1 are unhealthy"},
		{"every zone allowed is named", []*v1alpha1.Proxy{
			brakeProxy("a", prov, "beelink", "healthy"), brakeProxy("c", prov, "nuc", "stuck"), brakeProxy("d", prov, "nuc", "healthy"),
		}, metav1.ConditionTrue, common.PoolReasonWithinMaxUnhealthy,
			"standalone proxies of provider/home/beelink: 0 of 1 unhealthy, at most maxUnhealthy 40% (1): remediation allowed; " +
				"standalone proxies of provider/home/nuc: 1 of 2 unhealthy, at most maxUnhealthy 40% (1): remediation allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := make([]client.Object, len(tc.proxies))
			for i, px := range tc.proxies {
				objs[i] = px
			}
			r := &proxy.ProxyReconciler{Client: testenv.FakeClient(t, interceptor.Funcs{}, objs...),
				Providers: map[string]provider.Provider{prov: providertest.NewFake()}}
			c, err := r.ProviderRemediation(context.Background(), prov, brakeNow)
			if err != nil {
				t.Fatal(err)
			}
			if c.Type != common.ConditionRemediationAllowed || c.Status != tc.status || c.Reason != tc.reason || c.Message != tc.msg {
				t.Errorf("%s %s %s %q,\nwant %s %s %s %q", c.Type, c.Status, c.Reason, c.Message,
					common.ConditionRemediationAllowed, tc.status, tc.reason, tc.msg)
			}
		})
	}
}

// A failed read of the Proxies is an error naming the provider, never a condition:
// the monitor then keeps the one the ProviderHealth has.
func TestRemediationAllowedReadError(t *testing.T) {
	c := testenv.FakeClient(t, interceptor.Funcs{List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error {
		return fmt.Errorf("the cache is not synced")
	}})
	r := &proxy.ProxyReconciler{Client: c}
	_, err := r.ProviderRemediation(context.Background(), "home", brakeNow)
	if err == nil || !strings.Contains(err.Error(), "remediation brake of provider home") || !strings.Contains(err.Error(), "not synced") {
		t.Errorf("error %v, want one naming provider home and the failed read", err)
	}
}
