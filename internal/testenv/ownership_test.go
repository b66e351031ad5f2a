package testenv

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

func entry(manager string, op metav1.ManagedFieldsOperationType, fields string) metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, Subresource: "status",
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields)}
}

func TestStatusOwnershipFindsEveryFault(t *testing.T) {
	clean := []metav1.ManagedFieldsEntry{
		entry("a", metav1.ManagedFieldsOperationApply, `{"f:status":{".":{},"f:phase":{},"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},"f:type":{},"f:status":{}}}}}`),
		entry("b", metav1.ManagedFieldsOperationApply, `{"f:status":{"f:healthy":{},"f:conditions":{"k:{\"type\":\"Healthy\"}":{".":{},"f:type":{},"f:status":{}}}}}`),
	}
	px := &v1alpha1.Proxy{}
	px.SetManagedFields(clean)
	if faults := StatusOwnership(px, "a", "b"); len(faults) != 0 {
		t.Errorf("clean ownership reported %v", faults)
	}
	px.SetManagedFields(append(clean,
		entry("old-release", metav1.ManagedFieldsOperationUpdate, `{"f:status":{"f:phase":{}}}`)))
	faults := strings.Join(StatusOwnership(px, "a", "b"), "\n")
	for _, want := range []string{
		"old-release writes status by Update",
		"old-release owns status fields",
		"status.f:phase is owned by [a old-release]",
	} {
		if !strings.Contains(faults, want) {
			t.Errorf("faults lack %q:\n%s", want, faults)
		}
	}
}
