package remediation

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A decision's record and condition go onto the Proxy, read back by FromProxy, and a
// second pass with the same decision changes nothing.
func TestSetRecordAndCondition(t *testing.T) {
	px := proxy(t0, nil, 0)
	px.Generation = 3
	res, err := Plan(Input{Now: at(10 * time.Minute), Proxies: []State{{Key: "default/a", Started: t0, CanReboot: true}}})
	if err != nil {
		t.Fatal(err)
	}
	d := res.Decisions[0]
	if !SetRecord(px, d.Record) || !SetCondition(px, d.Condition, at(10*time.Minute)) {
		t.Fatal("the first record or condition changed nothing")
	}
	if SetRecord(px, d.Record) || SetCondition(px, d.Condition, at(12*time.Minute)) {
		t.Error("the same record or condition again changed the Proxy")
	}
	st, err := FromProxy(px)
	if err != nil || st.Record == nil || *st.Record != *d.Record {
		t.Errorf("FromProxy read back %+v, %v; want %+v", st.Record, err, d.Record)
	}
	c := meta.FindStatusCondition(px.Status.Conditions, ConditionRemediating)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonBootTimeout || c.ObservedGeneration != 3 || !c.LastTransitionTime.Time.Equal(at(10*time.Minute)) || c.Message != d.Condition.Message {
		t.Errorf("Remediating condition %+v", c)
	}
	if !SetRecord(px, nil) || !SetCondition(px, nil, at(11*time.Minute)) {
		t.Error("removing the record or condition changed nothing")
	}
	if _, ok := px.Annotations[RecordAnnotation]; ok || meta.FindStatusCondition(px.Status.Conditions, ConditionRemediating) != nil {
		t.Errorf("after removal: annotations %v, conditions %v", px.Annotations, px.Status.Conditions)
	}
	if SetRecord(px, nil) || SetCondition(px, nil, at(11*time.Minute)) {
		t.Error("removing what is not there changed the Proxy")
	}
}
