package health

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	probesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_proxy_probes_total",
		Help: "Probes through proxies, by result (success or failure) and provider (external for External proxies).",
	}, []string{"result", "provider"})
	probeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "proxy_operator_proxy_probe_duration_seconds",
		Help:    "Duration of probes through proxies, successful or not, by provider (external for External proxies).",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"provider"})
	statusWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_proxy_health_status_writes_total",
		Help: "Probe results written to a Proxy's status, by why: transition (something a user sees changed), unreachable (the probe answered a crawler's unreachable report, and nothing else changed) or heartbeat (lastProbeTime refreshed).",
	}, []string{"why"})
	unreachableProbes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_proxy_unreachable_probes_total",
		Help: "Probes that answered a crawler's unreachable report (status.unreachable), by result: passed (the proxy is handed out again) or failed (it is taken out as unhealthy at once).",
	}, []string{"result"})
	targetUp = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "proxy_operator_probe_target_up",
		Help: "1 while the health engine holds the probe target up, 0 while it holds it down: probes failed, none reached it through any proxy and the manager could not reach it directly either (failed probes are then not counted against the proxies).",
	})
	uncountedRounds = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "proxy_operator_probe_target_down_rounds_total",
		Help: "Probe rounds whose failed probes were not counted against the proxies because the probe target itself was down.",
	})
	targetChecks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_probe_target_checks_total",
		Help: "Direct checks of the probe target from the manager (made when probes fail and none reached the target), by result: up or down.",
	}, []string{"result"})
)

func init() {
	metrics.Registry.MustRegister(probesTotal, probeDuration, statusWrites, unreachableProbes, targetUp, uncountedRounds, targetChecks)
}
