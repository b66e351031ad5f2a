package remediation

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// SetRecord writes r to px's RecordAnnotation, or removes the annotation for nil, and
// says whether px changed (the controller patches its metadata then).
func SetRecord(px *v1alpha1.Proxy, r *Record) bool {
	old, had := px.Annotations[RecordAnnotation]
	if r == nil {
		if had {
			delete(px.Annotations, RecordAnnotation)
		}
		return had
	}
	v := r.Encode()
	if had && old == v {
		return false
	}
	if px.Annotations == nil {
		px.Annotations = map[string]string{}
	}
	px.Annotations[RecordAnnotation] = v
	return true
}

// SetCondition sets the Remediating condition c (nil: removes it) in px's status, with
// px's generation as its observedGeneration and now as its lastTransitionTime if its
// status changes (the controller's clock, not the machine's), and says whether the
// status changed.
func SetCondition(px *v1alpha1.Proxy, c *metav1.Condition, now time.Time) bool {
	if c == nil {
		return meta.RemoveStatusCondition(&px.Status.Conditions, ConditionRemediating)
	}
	cc := *c
	cc.ObservedGeneration, cc.LastTransitionTime = px.Generation, metav1.NewTime(now)
	return meta.SetStatusCondition(&px.Status.Conditions, cc)
}
