package pool

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
)

// spec.remediation of a Proxy (and so of a pool's template) and a pool's
// spec.remediation.maxUnhealthy, as the API server checks them.
func TestRemediationValidation(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	d := func(s string) *metav1.Duration {
		v, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		return &metav1.Duration{Duration: v}
	}
	for _, tc := range []struct {
		name string
		rem  v1alpha1.ProxyRemediation
		want string
	}{
		{"timeouts", v1alpha1.ProxyRemediation{BootTimeout: d("15m"), UnhealthyTimeout: d("2m30s"), MaxAttempts: ptr.To[int32](3)}, ""},
		{"disabled", v1alpha1.ProxyRemediation{Disabled: true}, ""},
		{"boot timeout too short", v1alpha1.ProxyRemediation{BootTimeout: d("30s")}, "spec.remediation.bootTimeout must be a duration from 1m to 24h"},
		{"boot timeout too long", v1alpha1.ProxyRemediation{BootTimeout: d("25h")}, "spec.remediation.bootTimeout must be a duration from 1m to 24h"},
		{"unhealthy timeout zero", v1alpha1.ProxyRemediation{UnhealthyTimeout: d("0s")}, "spec.remediation.unhealthyTimeout must be a duration from 1m to 24h"},
		{"no attempts", v1alpha1.ProxyRemediation{MaxAttempts: ptr.To[int32](0)}, "spec.remediation.maxAttempts in body should be greater than or equal to 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rem := tc.rem
			controllertest.CheckAdmission(t, ctx, shared.Client(t), v1alpha1.ProxySpec{Provider: "kvm2-home", Remediation: &rem}, tc.want)
		})
	}
	for _, tc := range []struct {
		v    intstr.IntOrString
		want string
	}{
		{intstr.FromInt32(2), ""},
		{intstr.FromInt32(0), ""},
		{intstr.FromString("40%"), ""},
		{intstr.FromString("100%"), ""},
		{intstr.FromInt32(-1), "spec.remediation.maxUnhealthy must be a count of children (0 or more) or a percentage from 0% to 100%"},
		{intstr.FromString("101%"), "spec.remediation.maxUnhealthy must be a count"},
		{intstr.FromString("half"), "spec.remediation.maxUnhealthy must be a count"},
	} {
		t.Run("maxUnhealthy "+tc.v.String(), func(t *testing.T) {
			v := tc.v
			pool := &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Name: "v", Namespace: "default"}, Spec: v1alpha1.ProxyPoolSpec{
				Replicas: ptr.To[int32](3), Template: v1alpha1.ProxyTemplate{Spec: v1alpha1.ProxySpec{Provider: "kvm2-home",
					Remediation: &v1alpha1.ProxyRemediation{BootTimeout: d("20m")}}},
				Remediation: &v1alpha1.PoolRemediation{MaxUnhealthy: &v}}}
			err := shared.Client(t).Create(ctx, pool, client.DryRunAll)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// A pool's template's remediation settings are read by each child's reconcile: changing
// them changes no template hash, so no child is replaced for it.
func TestRemediationLeavesTemplateHash(t *testing.T) {
	tmpl := &v1alpha1.ProxyTemplate{Spec: v1alpha1.ProxySpec{Provider: "kvm2-home"}}
	before := TemplateHash(tmpl)
	tmpl.Spec.Remediation = &v1alpha1.ProxyRemediation{BootTimeout: &metav1.Duration{Duration: 20 * time.Minute}, Disabled: true}
	if got := TemplateHash(tmpl); got != before {
		t.Errorf("template hash %s with spec.remediation, %s without: a change of remediation would replace every child", got, before)
	}
	if tmpl.Spec.Remediation == nil {
		t.Error("TemplateHash cleared the template's spec.remediation")
	}
	tmpl.Spec.Placement.Zone = "nuc"
	if TemplateHash(tmpl) == before {
		t.Error("a placement change left the hash as it was")
	}
}
