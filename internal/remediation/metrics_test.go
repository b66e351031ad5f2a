package remediation

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetrics(t *testing.T) {
	before := testutil.ToFloat64(remediationsTotal.WithLabelValues(ReasonBootTimeout, "Reboot", OutcomeFailed))
	ObserveConcluded(nil)
	ObserveConcluded(&Concluded{Reason: ReasonBootTimeout, Action: ActionReboot, Outcome: OutcomeFailed})
	if got := testutil.ToFloat64(remediationsTotal.WithLabelValues(ReasonBootTimeout, "Reboot", OutcomeFailed)); got != before+1 {
		t.Errorf("remediations failed after one: %v, want %v", got, before+1)
	}
	// The package's collectors are global: start from none, so that the test reads the
	// same with -count above 1.
	faultToServing.Reset()
	remediationsTotal.Reset()
	ObserveConcluded(&Concluded{Reason: ReasonUnhealthy, Action: ActionReplace, Outcome: OutcomeSucceeded, FaultToServing: 7 * time.Minute})
	want := `
# HELP proxy_operator_remediation_fault_to_serving_seconds Time from a remediated fault's start (the instance's start for BootTimeout, the first failure for Unhealthy) to the proxy being healthy again, by reason.
# TYPE proxy_operator_remediation_fault_to_serving_seconds histogram
proxy_operator_remediation_fault_to_serving_seconds_bucket{reason="Unhealthy",le="60"} 0
proxy_operator_remediation_fault_to_serving_seconds_bucket{reason="Unhealthy",le="120"} 0
proxy_operator_remediation_fault_to_serving_seconds_bucket{reason="Unhealthy",le="300"} 0
proxy_operator_remediation_fault_to_serving_seconds_bucket{reason="Unhealthy",le="600"} 1
proxy_operator_remediation_fault_to_serving_seconds_bucket{reason="Unhealthy",le="900"} 1
proxy_operator_remediation_fault_to_serving_seconds_bucket{reason="Unhealthy",le="1200"} 1
proxy_operator_remediation_fault_to_serving_seconds_bucket{reason="Unhealthy",le="1800"} 1
proxy_operator_remediation_fault_to_serving_seconds_bucket{reason="Unhealthy",le="3600"} 1
proxy_operator_remediation_fault_to_serving_seconds_bucket{reason="Unhealthy",le="7200"} 1
proxy_operator_remediation_fault_to_serving_seconds_bucket{reason="Unhealthy",le="14400"} 1
proxy_operator_remediation_fault_to_serving_seconds_bucket{reason="Unhealthy",le="+Inf"} 1
proxy_operator_remediation_fault_to_serving_seconds_sum{reason="Unhealthy"} 420
proxy_operator_remediation_fault_to_serving_seconds_count{reason="Unhealthy"} 1
`
	if err := testutil.CollectAndCompare(faultToServing, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if got := testutil.ToFloat64(remediationsTotal.WithLabelValues(ReasonUnhealthy, "Replace", OutcomeSucceeded)); got != 1 {
		t.Errorf("remediations succeeded: %v, want 1", got)
	}

	ObserveGroup(GroupState{Name: "pool/default/news", Held: true})
	ObserveGroup(GroupState{Name: "provider/kvm2/nuc"})
	if a, b := testutil.ToFloat64(brakeEngaged.WithLabelValues("pool/default/news")), testutil.ToFloat64(brakeEngaged.WithLabelValues("provider/kvm2/nuc")); a != 1 || b != 0 {
		t.Errorf("brake gauges %v and %v, want 1 and 0", a, b)
	}
	ForgetGroup("pool/default/news")
	if n := testutil.CollectAndCount(brakeEngaged); n != 1 {
		t.Errorf("%d brake series after forgetting one of two, want 1", n)
	}
}
