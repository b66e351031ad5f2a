package testbuild

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

func TestProxyOptions(t *testing.T) {
	ready := metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonProbeSucceeded}
	px := Proxy("ns", "a", External("192.0.2.7"), WithPort(8080), WithLabel("team", "news"), WithAnnotation("x", "y"),
		WithUID("uid-a"), WithBasicAuth("auth"), WithPhase(v1alpha1.PhaseReady), WithIP("192.0.2.7"), Healthy(),
		WithCondition(metav1.Condition{Type: v1alpha1.ConditionHealthy, Status: metav1.ConditionFalse}), WithCondition(ready))
	if px.Namespace != "ns" || px.Name != "a" || px.UID != "uid-a" || px.Labels["team"] != "news" || px.Annotations["x"] != "y" {
		t.Errorf("metadata %+v", px.ObjectMeta)
	}
	if px.Spec.Mode != v1alpha1.ProxyModeExternal || px.Spec.Address != "192.0.2.7" || px.Spec.Port != 8080 ||
		px.Spec.Proxy.BasicAuth.SecretRef.Name != "auth" {
		t.Errorf("spec %+v", px.Spec)
	}
	if px.Status.Phase != v1alpha1.PhaseReady || !px.Status.Healthy || px.Status.IP != "192.0.2.7" ||
		len(px.Status.Conditions) != 1 || px.Status.Conditions[0] != ready {
		t.Errorf("status %+v, want one Healthy=True condition (the second replacing the first)", px.Status)
	}
}

// A spec option sets a pool's template; a status option panics on a pool, naming both.
func TestPoolOptions(t *testing.T) {
	pool := Pool("ns", "news", 3, WithProvider("fake-home"), WithPlacement(v1alpha1.ProxyPlacement{Zone: "beelink"}), WithTemplateLabel("team", "news"))
	if *pool.Spec.Replicas != 3 || pool.Spec.Template.Spec.Provider != "fake-home" || pool.Spec.Template.Spec.Placement.Zone != "beelink" ||
		pool.Spec.Template.Metadata.Labels["team"] != "news" || pool.Labels != nil {
		t.Errorf("pool spec %+v", pool.Spec)
	}
	defer func() {
		if msg, _ := recover().(string); !strings.Contains(msg, "WithPhase does not apply to a *v1alpha1.ProxyPool") {
			t.Errorf("panic %q, want one naming the option and the pool", msg)
		}
	}()
	Pool("ns", "news", 1, WithPhase(v1alpha1.PhaseReady))
}
