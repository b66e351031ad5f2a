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
	Help: "Proxies left out of ?credentials=true answers because their credentials could not be read, by endpoint (list, pick, or gateway: the gateway's choices).",
}, []string{"endpoint"})

// feedbackReports counts the reports POST /v1/feedback took, by outcome, and those it
// rejected (outcome "rejected").
var feedbackReports = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "proxy_operator_feedback_reports_total",
	Help: "Crawler reports taken by POST /v1/feedback, by outcome (banned, throttled, ok, unreachable), and those rejected (outcome rejected).",
}, []string{"outcome"})

// saturatedAnswers counts the 503 answers to ?domain= requests whose site was saturated.
var saturatedAnswers = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "proxy_operator_discovery_saturated_total",
	Help: "Answers 503 to ?domain= requests because more than the allowed share of the matching proxies were cooling for the site, by endpoint (list, pick, or gateway: the gateway's choices).",
}, []string{"endpoint"})

func init() {
	metrics.Registry.MustRegister(credentialsUnavailable, feedbackReports, saturatedAnswers)
}
