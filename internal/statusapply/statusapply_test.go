package statusapply

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// A field the manager stops applying is gone from the object, the object passed in holds
// the server's answer, and nothing outside status is written. (The fake client keeps no
// managedFields; the envtest tests of the writers check the field managers.)
func TestStatusAppliesOwnedFieldsOnly(t *testing.T) {
	ctx := context.Background()
	ph := &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: "home", Labels: map[string]string{"keep": "me"}}}
	c := testenv.FakeClient(t, interceptor.Funcs{}, ph.DeepCopy())
	now := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))

	obj := &v1alpha1.ProviderHealth{ObjectMeta: metav1.ObjectMeta{Name: "home"}}
	if err := Status(ctx, c, obj, &v1alpha1.ProviderHealthStatus{Ready: "1/1", ReadyTargets: 1, TotalTargets: 1, LastChecked: &now}, ProviderHealth); err != nil {
		t.Fatal(err)
	}
	if obj.Status.Ready != "1/1" || obj.Labels["keep"] != "me" {
		t.Errorf("after the first apply the object holds %+v", obj)
	}

	if err := Status(ctx, c, obj, &v1alpha1.ProviderHealthStatus{Ready: "0/1", TotalTargets: 1}, ProviderHealth); err != nil {
		t.Fatal(err)
	}
	got := &v1alpha1.ProviderHealth{}
	if err := c.Get(ctx, client.ObjectKey{Name: "home"}, got); err != nil {
		t.Fatal(err)
	}
	if st := got.Status; st.Ready != "0/1" || st.ReadyTargets != 0 || st.LastChecked != nil || st.TotalTargets != 1 {
		t.Errorf("status %+v, want 0/1 with readyTargets and lastChecked removed", st)
	}
	if got.Labels["keep"] != "me" {
		t.Errorf("labels %v: the apply touched metadata", got.Labels)
	}
}
