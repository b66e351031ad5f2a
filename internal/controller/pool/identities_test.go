package pool

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// A pool counts the distinct egress addresses of its available children and says, in
// EgressShared, which children leave from one address: before the probe has reported
// any address, when two children share one, when they no longer do, and when a child
// sharing one stops being available.
func testPoolEgressIdentities(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	e.CreateSettled(e.NewPool("crawl", 3))
	kids := controllertest.Names(e.Children("crawl"))
	a, b, c := kids[0], kids[1], kids[2]

	egress := func(want int32, status metav1.ConditionStatus, reason string, msgHas ...string) func(*v1alpha1.ProxyPool, []v1alpha1.Proxy) bool {
		return func(p *v1alpha1.ProxyPool, _ []v1alpha1.Proxy) bool {
			cond := controllertest.PoolCondition(p, v1alpha1.PoolConditionEgressShared)
			if p.Status.DistinctEgressIPs != want || cond.Status != status || cond.Reason != reason {
				return false
			}
			for _, s := range msgHas {
				if !strings.Contains(cond.Message, s) {
					return false
				}
			}
			return true
		}
	}
	e.WaitPool("crawl", "no egress address known yet", egress(0, metav1.ConditionFalse, v1alpha1.PoolReasonDistinctEgressIPs,
		"0 available children leave from 0 distinct egress addresses", "3 more available children have no egress address known yet"))

	setEgress := func(name, ip string) {
		e.PatchChild(name, true, func(px *v1alpha1.Proxy) { px.Status.EgressIP = ip })
	}
	setEgress(a, "198.51.100.7")
	setEgress(b, "198.51.100.7")
	setEgress(c, "198.51.100.9")
	p := e.WaitPool("crawl", "two children sharing 198.51.100.7", egress(2, metav1.ConditionTrue, v1alpha1.PoolReasonSharedEgressIP,
		fmt.Sprintf("198.51.100.7 (%s, %s)", a, b)))
	if msg := controllertest.PoolCondition(p, v1alpha1.PoolConditionEgressShared).Message; strings.Contains(msg, "198.51.100.9") || strings.Contains(msg, c) {
		t.Errorf("EgressShared names the address no one shares: %q", msg)
	}

	setEgress(b, "198.51.100.8")
	e.WaitPool("crawl", "three distinct addresses", egress(3, metav1.ConditionFalse, v1alpha1.PoolReasonDistinctEgressIPs,
		"3 available children leave from 3 distinct egress addresses"))

	// A child that is not available does not count, even on a shared address.
	setEgress(b, "198.51.100.7")
	e.WaitPool("crawl", "sharing again", egress(2, metav1.ConditionTrue, v1alpha1.PoolReasonSharedEgressIP, "198.51.100.7 ("))
	e.setUnhealthy(b)
	e.WaitPool("crawl", "the unhealthy child not counted", egress(2, metav1.ConditionFalse, v1alpha1.PoolReasonDistinctEgressIPs,
		"2 available children leave from 2 distinct egress addresses"))
}

// The message names at most common.MaxNamed addresses and common.MaxNamed children of each.
func TestSharedEgressMessage(t *testing.T) {
	byIP := map[string][]string{"198.51.100.1": {"solo"}}
	for i := 0; i < common.MaxNamed+2; i++ {
		ip := fmt.Sprintf("203.0.113.%02d", i)
		byIP[ip] = []string{"a", "b"}
	}
	for i := 0; i < common.MaxNamed+3; i++ {
		byIP["203.0.113.00"] = append(byIP["203.0.113.00"], fmt.Sprintf("px-%02d", i))
	}
	got := sharedEgress(byIP)
	for _, want := range []string{"203.0.113.00 (a, b, px-00, px-01, px-02, px-03, px-04, px-05, px-06, px-07 and 5 more)",
		"203.0.113.09 (a, b)", "; and 2 more addresses"} {
		if !strings.Contains(got, want) {
			t.Errorf("sharedEgress = %q, lacks %q", got, want)
		}
	}
	for _, not := range []string{"198.51.100.1", "solo", "203.0.113.10"} {
		if strings.Contains(got, not) {
			t.Errorf("sharedEgress = %q, names %q", got, not)
		}
	}
	if got := sharedEgress(map[string][]string{"198.51.100.1": {"a"}, "198.51.100.2": {"b"}}); got != "" {
		t.Errorf("sharedEgress of distinct addresses = %q, want empty", got)
	}
}
