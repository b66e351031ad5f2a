package health

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	probesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_proxy_probes_total",
		Help: "Probes through proxies, by result (success or failure).",
	}, []string{"result"})
	probeDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "proxy_operator_proxy_probe_duration_seconds",
		Help:    "Duration of probes through proxies, successful or not.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})
)

func init() {
	metrics.Registry.MustRegister(probesTotal, probeDuration)
}
