package bans

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// DefaultUnreachableHoldoff is how long after a probe passed that answered an
// unreachable report further unreachable reports of the proxy are ignored
// (--unreachable-report-holdoff): two default probe intervals. So a crawler that reports
// a healthy proxy unreachable over and over keeps it out of discovery's answers for at
// most the time of one prompt probe (and its write) per holdoff.
const DefaultUnreachableHoldoff = time.Minute

// The result label of unreachableReports.
const (
	// UnreachableMarked: the report opened a mark (status.unreachable), which takes the
	// proxy out of discovery's answers until a probe answers it.
	UnreachableMarked = "marked"
	// UnreachableCounted: the report was added to a mark still open.
	UnreachableCounted = "counted"
	// UnreachableIgnored: a probe answering an earlier report passed within the holdoff.
	UnreachableIgnored = "ignored"
)

// unreachableReports counts the unreachable reports written or ignored, by result.
var unreachableReports = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "proxy_operator_feedback_unreachable_total",
	Help: "Crawler reports that a proxy could not be reached, by what became of them: marked (the proxy left discovery's answers until a probe), counted (added to a mark still open) or ignored (a probe answering an earlier report passed within --unreachable-report-holdoff).",
}, []string{"result"})

func init() {
	metrics.Registry.MustRegister(unreachableReports)
	for _, r := range []string{UnreachableMarked, UnreachableCounted, UnreachableIgnored} {
		unreachableReports.WithLabelValues(r)
	}
}

// UnreachableOpen reports whether st holds an unreachable mark no probe has answered
// yet: discovery hands such a proxy out to nobody.
func UnreachableOpen(st *v1alpha1.ProxyStatus) bool {
	u, p := st.Unreachable, st.UnreachableProbe
	return u != nil && (p == nil || u.ReportedAt.After(p.ReportedAt.Time))
}

// HandedOut reports whether discovery hands px out: it has an address, it is serving
// (v1alpha1's (*Proxy).Serving: healthy, Ready, not deleting, not cordoned) and no
// crawler's unreachable report waits for a probe to answer it (UnreachableOpen).
func HandedOut(px *v1alpha1.Proxy) bool {
	return px.Status.IP != "" && px.Serving() && !UnreachableOpen(&px.Status)
}

// UnreachableAfter returns st's mark with n unreachable reports taken at at laid on it,
// and what became of them (one of the Unreachable* results):
//   - a mark still open counts them;
//   - within holdoff after a passing probe answered the last mark, they are ignored and
//     the mark is returned unchanged;
//   - otherwise they open a new mark at at (kept after the answered one's time, whatever
//     the replicas' clocks), which holds the proxy out until a probe answers it.
func UnreachableAfter(st *v1alpha1.ProxyStatus, at time.Time, n int32, holdoff time.Duration) (*v1alpha1.ProxyUnreachable, string) {
	if n <= 0 {
		n = 1
	}
	if UnreachableOpen(st) {
		u := st.Unreachable.DeepCopy()
		u.Reports += n
		return u, UnreachableCounted
	}
	p := st.UnreachableProbe
	if p != nil && p.Passed && at.Before(p.ProbedAt.Add(holdoff)) {
		return st.Unreachable, UnreachableIgnored
	}
	// The API server keeps a MicroTime to the microsecond: truncate, so that the time the
	// engine copies back from the cache is the same.
	at = at.Truncate(time.Microsecond)
	if p != nil && !at.After(p.ReportedAt.Time) {
		at = p.ReportedAt.Add(time.Microsecond)
	}
	return &v1alpha1.ProxyUnreachable{ReportedAt: metav1.NewMicroTime(at), Reports: n}, UnreachableMarked
}
