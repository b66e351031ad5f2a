package remediation

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The collectors, registered with controller-runtime's registry as the project's other
// packages do. Only the leader, which carries the decisions out, updates them.
var (
	remediationsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_remediations_total",
		Help: "Remediation attempts whose outcome is known, by reason (BootTimeout, Unhealthy), action (Reboot, Replace) and outcome: succeeded (the proxy was healthy again and stayed so for the reset time) or failed (it was still not healthy when its wait ended and another attempt followed).",
	}, []string{"reason", "action", "outcome"})
	faultToServing = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "proxy_operator_remediation_fault_to_serving_seconds",
		Help:    "Time from a remediated fault's start (the instance's start for BootTimeout, the first failure for Unhealthy) to the proxy being healthy again, by reason.",
		Buckets: []float64{60, 120, 300, 600, 900, 1200, 1800, 3600, 7200, 14400},
	}, []string{"reason"})
	brakeEngaged = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "proxy_operator_remediation_brake_engaged",
		Help: "1 while more of the group's proxies than its maxUnhealthy are unhealthy and remediation is held in it, else 0; group is pool/<namespace>/<name> or provider/<provider>[/<zone>].",
	}, []string{"group"})
)

func init() {
	metrics.Registry.MustRegister(remediationsTotal, faultToServing, brakeEngaged)
}

// ObserveConcluded counts c (nil: nothing): call it once the pass that learnt it is
// written, so that a pass refused and planned again does not count twice.
func ObserveConcluded(c *Concluded) {
	if c == nil {
		return
	}
	remediationsTotal.WithLabelValues(c.Reason, string(c.Action), c.Outcome).Inc()
	if c.Outcome == OutcomeSucceeded {
		faultToServing.WithLabelValues(c.Reason).Observe(c.FaultToServing.Seconds())
	}
}

// ObserveGroup sets g's brake gauge.
func ObserveGroup(g GroupState) {
	v := 0.0
	if g.Held {
		v = 1
	}
	brakeEngaged.WithLabelValues(g.Name).Set(v)
}

// ForgetGroup deletes the gauge of a group that is gone (a deleted pool, a host without
// proxies any more).
func ForgetGroup(name string) {
	brakeEngaged.DeleteLabelValues(name)
}
