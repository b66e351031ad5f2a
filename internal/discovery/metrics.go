package discovery

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The endpoint label of credentialsUnavailable.
const (
	endpointList = "list"
	endpointPick = "pick"
)

// credentialsUnavailable counts the proxies a ?credentials=true answer left out because
// their credentials could not be read.
var credentialsUnavailable = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "proxy_operator_discovery_credentials_unavailable_total",
	Help: "Proxies left out of ?credentials=true answers because their credentials could not be read, by endpoint (list or pick).",
}, []string{"endpoint"})

func init() {
	metrics.Registry.MustRegister(credentialsUnavailable)
}
