package proxy

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/providertest"
)

func TestPendingRetryDefault(t *testing.T) {
	r := &ProxyReconciler{}
	r.setDefaults()
	if got := r.PendingRetry; got != 10*time.Second {
		t.Fatalf("PendingRetry after setDefaults = %s, want DefaultPendingRetry (10s)", got)
	}
}

// TestPendingCreateWaitsOffTheBackoffCurve: a pending Create keeps the Proxy
// Provisioning with the work's progress on the Provisioned condition, is asked again
// after PendingRetry with no error (so not on the backoff curve) and without a Warning
// event, and the Proxy goes Running once the provider's work is done.
func TestPendingCreateWaitsOffTheBackoffCurve(t *testing.T) {
	t.Parallel()
	const retry = 300 * time.Millisecond
	e := newProxyEnv(t, withReconciler(func(r *ProxyReconciler, _ ctrl.Manager) { r.PendingRetry = retry }))
	e.fake.PendCreates(1000)
	px := e.create(e.newProxy("pending"))
	name := px.InstanceName()
	got := e.waitProxy("pending", "Provisioned reason ImageDownloading", func(px *v1alpha1.Proxy) bool {
		return provisioned(px).Reason == provider.ReasonImageDownloading
	})
	c := provisioned(got)
	if got.Status.Phase != v1alpha1.PhaseProvisioning || c.Status != metav1.ConditionFalse ||
		!strings.HasPrefix(c.Message, "fake: preparing instance "+name+", step ") || !strings.HasSuffix(c.Message, "%)") ||
		got.Status.Message != c.Message {
		t.Fatalf("phase %s, message %q, Provisioned %+v; want Provisioning with the progress and its percentage",
			got.Status.Phase, got.Status.Message, c)
	}

	res, err := e.reconcileNow("pending")
	if err != nil || res.RequeueAfter != retry {
		t.Fatalf("reconcile on pending = %+v, %v; want RequeueAfter %s and no error", res, err, retry)
	}
	// Asked again at the fixed interval: a few Creates a second, not a backoff burst.
	before := e.fake.CountOf(providertest.OpCreate)
	waitFor(t, waitLong, "two more creates", func() (bool, error) {
		return e.fake.CountOf(providertest.OpCreate) >= before+2, nil
	})
	evs, err := e.events("pending")
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs {
		if ev.Type == "Warning" {
			t.Fatalf("a pending Create raised a Warning event: %s %s", ev.Reason, ev.Note)
		}
	}

	e.fake.PendCreates(0)
	done := e.waitPhase("pending", v1alpha1.PhaseRunning)
	if c := provisioned(done); c.Reason != v1alpha1.ReasonInstanceRunning {
		t.Fatalf("Provisioned = %+v once the work was done", c)
	}
}
