package access

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Values of the kind label.
const (
	kindToken  = "tokenreview"
	kindAccess = "subjectaccessreview"
)

// reviews counts the reviews sent to the API server, by kind and result: authenticated,
// unauthenticated, allowed, denied or error.
var reviews = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "proxy_operator_access_reviews_total",
	Help: "TokenReviews and SubjectAccessReviews sent to the API server, by kind (tokenreview, subjectaccessreview) and result (authenticated, unauthenticated, allowed, denied, error).",
}, []string{"kind", "result"})

// cacheLookups counts the look-ups of the review caches, by kind and result (hit, miss).
var cacheLookups = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "proxy_operator_access_cache_lookups_total",
	Help: "Look-ups of the cached TokenReview and SubjectAccessReview answers, by kind (tokenreview, subjectaccessreview) and result (hit, miss).",
}, []string{"kind", "result"})

var (
	tokenHit   = cacheLookups.WithLabelValues(kindToken, "hit")
	tokenMiss  = cacheLookups.WithLabelValues(kindToken, "miss")
	accessHit  = cacheLookups.WithLabelValues(kindAccess, "hit")
	accessMiss = cacheLookups.WithLabelValues(kindAccess, "miss")
)

func init() {
	metrics.Registry.MustRegister(reviews, cacheLookups)
}
