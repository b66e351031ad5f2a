package pool

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
)

// The per-pool gauges. Each carries the pool's namespace and name and nothing else, so
// there is one series per gauge and pool: the cardinality is the number of pools. They
// are set each time the pool's status is computed (by the leader) and deleted when the
// pool is deleted.
var (
	poolDesiredReplicas = common.PoolGauge(prometheus.GaugeOpts{Name: "proxy_operator_pool_desired_replicas",
		Help: "The children the pool wants (spec.replicas)."})
	poolReplicas = common.PoolGauge(prometheus.GaugeOpts{Name: "proxy_operator_pool_replicas",
		Help: "The pool's children, those being deleted included (status.replicas)."})
	poolReadyReplicas = common.PoolGauge(prometheus.GaugeOpts{Name: "proxy_operator_pool_ready_replicas",
		Help: "The pool's children that are Ready and not being deleted (status.readyReplicas)."})
	poolAvailableReplicas = common.PoolGauge(prometheus.GaugeOpts{Name: "proxy_operator_pool_available_replicas",
		Help: "The pool's children Ready for at least minReadySeconds, not cordoned, not being deleted (status.availableReplicas)."})
	poolUpToDateReplicas = common.PoolGauge(prometheus.GaugeOpts{Name: "proxy_operator_pool_up_to_date_replicas",
		Help: "The pool's children built from its current template, on a placement it still uses, and not ConfigOutdated (status.upToDateReplicas)."})
	poolMinAvailableReplicas = common.PoolGauge(prometheus.GaugeOpts{Name: "proxy_operator_pool_min_available_replicas",
		Help: "The fewest available children the pool keeps during a rollout: replicas - maxUnavailable (the Available condition is False below it)."})
	poolStalled = common.PoolGauge(prometheus.GaugeOpts{Name: "proxy_operator_pool_stalled",
		Help: "1 when the pool cannot proceed without a change (Progressing=False with reason Stalled, CredentialsUnavailable or ProgressDeadlineExceeded), else 0."})

	poolGauges = []*prometheus.GaugeVec{poolDesiredReplicas, poolReplicas, poolReadyReplicas,
		poolAvailableReplicas, poolUpToDateReplicas, poolMinAvailableReplicas, poolStalled}
)

func init() {
	for _, g := range poolGauges {
		metrics.Registry.MustRegister(g)
	}
}

// recordPoolMetrics sets the pool's gauges from the status just computed (n, and the
// Progressing condition) and the scope's desired and minimum available counts.
func recordPoolMetrics(s *poolScope, n poolCounts) {
	pool := s.pool
	stalled := 0.0
	if c := meta.FindStatusCondition(pool.Status.Conditions, v1alpha1.PoolConditionProgressing); c != nil &&
		c.Status == metav1.ConditionFalse && c.Reason != v1alpha1.PoolReasonComplete {
		stalled = 1
	}
	for g, v := range map[*prometheus.GaugeVec]float64{
		poolDesiredReplicas:      float64(s.replicas),
		poolReplicas:             float64(n.replicas),
		poolReadyReplicas:        float64(n.ready),
		poolAvailableReplicas:    float64(n.available),
		poolUpToDateReplicas:     float64(n.upToDate),
		poolMinAvailableReplicas: float64(max(s.replicas-s.unavail, 0)),
		poolStalled:              stalled,
	} {
		g.WithLabelValues(pool.Namespace, pool.Name).Set(v)
	}
}

// forgetPoolMetrics deletes the pool's series: a deleted pool leaves none behind.
func forgetPoolMetrics(key types.NamespacedName) {
	for _, g := range poolGauges {
		g.DeleteLabelValues(key.Namespace, key.Name)
	}
}
