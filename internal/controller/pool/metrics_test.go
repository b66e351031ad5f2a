package pool

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// poolSeries gathers the manager's registry (what /metrics serves) and returns the pool
// gauges' series of one pool, by metric name. It fails the test if any series of those
// gauges is not a gauge or carries labels other than namespace and name.
func poolSeries(t testing.TB, ns, name string) map[string]float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering the metrics registry: %v", err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if !isPoolGauge(f.GetName()) {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if len(labels) != 2 || labels["namespace"] == "" || labels["name"] == "" {
				t.Errorf("%s has labels %v, want namespace and name alone", f.GetName(), labels)
			}
			if f.GetType() != dto.MetricType_GAUGE {
				t.Errorf("%s is a %v, want a gauge", f.GetName(), f.GetType())
			}
			if labels["namespace"] == ns && labels["name"] == name {
				out[f.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

func isPoolGauge(name string) bool { return slices.Contains(poolGaugeNames, name) }

var poolGaugeNames = []string{
	"proxy_operator_pool_desired_replicas", "proxy_operator_pool_replicas", "proxy_operator_pool_ready_replicas",
	"proxy_operator_pool_available_replicas", "proxy_operator_pool_up_to_date_replicas",
	"proxy_operator_pool_min_available_replicas", "proxy_operator_pool_stalled",
}

// gauges are the expected values of the pool's gauges, in poolGaugeNames' order.
func gauges(desired, replicas, ready, available, upToDate, minAvailable, stalled float64) map[string]float64 {
	out := map[string]float64{}
	for i, v := range []float64{desired, replicas, ready, available, upToDate, minAvailable, stalled} {
		out[poolGaugeNames[i]] = v
	}
	return out
}

// waitGauges waits until the pool's series are exactly want (none at all when want is nil).
func (e *poolEnv) waitGauges(pool, what string, want map[string]float64) {
	e.T.Helper()
	waitFor(e.T, waitLong, fmt.Sprintf("pool %s's gauges: %s", pool, what), func() (bool, error) {
		got := poolSeries(e.T, e.NS, pool)
		if len(want) == 0 {
			return len(got) == 0, fmt.Errorf("series left: %v", got)
		}
		return maps.Equal(got, want), fmt.Errorf("gauges %v, want %v", got, want)
	})
}

// The pool's gauges follow its status (desired, children, ready, available, up to date,
// the minimum kept available) and go with the pool: a deleted pool leaves no series,
// and another pool's stay.
func testPoolMetrics(t *testing.T, env *testenv.Env) {
	e := newPoolEnv(t, env)
	pool := e.NewPool("gauged", 3)
	one := intstr.FromInt32(1)
	pool.Spec.Strategy.RollingUpdate.MaxUnavailable = &one
	e.CreateSettled(pool)
	e.CreateSettled(e.NewPool("kept", 1))
	e.waitGauges("gauged", "settled at 3", gauges(3, 3, 3, 3, 3, 2, 0))
	e.waitGauges("kept", "settled at 1", gauges(1, 1, 1, 1, 1, 1, 0))

	// A child fails its probes: it is neither ready nor available, and stays a child.
	kids := controllertest.Names(e.Children("gauged"))
	e.setUnhealthy(kids[0])
	e.waitGauges("gauged", "one child unhealthy", gauges(3, 3, 2, 2, 3, 2, 0))
	p := e.GetPool("gauged")
	if st := p.Status; st.ReadyReplicas != 2 || st.AvailableReplicas != 2 || st.Replicas != 3 {
		t.Errorf("status %+v, want what the gauges say: 3 children, 2 ready and available", st)
	}

	// Scaled up with the new children held back from Ready: desired moves at once.
	e.HoldWhere(func(px *v1alpha1.Proxy) bool { return px.Name != kids[1] && px.Name != kids[2] })
	e.Update("gauged", func(p *v1alpha1.ProxyPool) { p.Spec.Replicas = ptr.To[int32](5) })
	e.waitGauges("gauged", "scaled to 5, new children not Ready", gauges(5, 5, 2, 2, 5, 4, 0))

	if err := e.C.Delete(e.Ctx, e.GetPool("gauged")); err != nil {
		t.Fatal(err)
	}
	e.waitGauges("gauged", "the pool deleted", nil)
	e.waitGauges("kept", "the other pool untouched", gauges(1, 1, 1, 1, 1, 1, 0))
}

// The gauges come from the counts and conditions the status computation produced, and
// forgetting a pool removes its series alone (no envtest: the scope is built by hand).
func TestPoolMetricsRecordedAndForgotten(t *testing.T) {
	pool := func(name string) *v1alpha1.ProxyPool {
		p := &v1alpha1.ProxyPool{}
		p.Namespace, p.Name = "metrics-unit", name
		return p
	}
	stuck := &poolScope{pool: pool("stuck"), replicas: 4, unavail: 1}
	stuck.pool.Status.Conditions = []metav1.Condition{{Type: v1alpha1.PoolConditionProgressing,
		Status: metav1.ConditionFalse, Reason: v1alpha1.PoolReasonProgressDeadlineExceeded}}
	recordPoolMetrics(stuck, poolCounts{replicas: 5, ready: 3, available: 2, upToDate: 1})
	done := &poolScope{pool: pool("done"), replicas: 2}
	done.pool.Status.Conditions = []metav1.Condition{{Type: v1alpha1.PoolConditionProgressing,
		Status: metav1.ConditionFalse, Reason: v1alpha1.PoolReasonComplete}}
	recordPoolMetrics(done, poolCounts{replicas: 2, ready: 2, available: 2, upToDate: 2})

	if got, want := poolSeries(t, "metrics-unit", "stuck"), gauges(4, 5, 3, 2, 1, 3, 1); !maps.Equal(got, want) {
		t.Errorf("stalled pool: gauges %v, want %v", got, want)
	}
	if got, want := poolSeries(t, "metrics-unit", "done"), gauges(2, 2, 2, 2, 2, 2, 0); !maps.Equal(got, want) {
		t.Errorf("complete pool: gauges %v, want %v", got, want)
	}
	forgetPoolMetrics(types.NamespacedName{Namespace: "metrics-unit", Name: "stuck"})
	if got := poolSeries(t, "metrics-unit", "stuck"); len(got) != 0 {
		t.Errorf("series left after the pool went: %v", got)
	}
	if got := poolSeries(t, "metrics-unit", "done"); len(got) != len(poolGaugeNames) {
		t.Errorf("the other pool's series: %v, want all %d", got, len(poolGaugeNames))
	}
	forgetPoolMetrics(types.NamespacedName{Namespace: "metrics-unit", Name: "done"})
}
