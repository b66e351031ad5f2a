package proxybans

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// A pass whose retirement is refused (the child's cached copy is older than the
// retirement already made, so the patch's lock fails) still says which children it held
// back: the status it just wrote holds the new count, so the next pass would find nothing
// new to say. The conflict is returned, for the caller to read again.
func TestHeldBackSaidWhenARetirementConflicts(t *testing.T) {
	ctx := context.Background()
	stale := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: "1"}}
	c := testenv.FakeClient(t, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			return apierrors.NewConflict(schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "proxies"}, obj.GetName(),
				errors.New("the object has been modified"))
		},
	}, stale.DeepCopy())
	rec := events.NewFakeRecorder(10)
	r := &BansReconciler{Client: c, Recorder: rec}
	now := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	pool := &v1alpha1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
	pass := &retirementPass{
		retire: []dueChild{{px: stale, sites: []string{"a.com", "b.com", "c.com"}}},
		held:   []string{"b", "c"},
		policy: bans.DefaultPolicy,
		budget: "1 per hour",
		status: &v1alpha1.PoolRetirements{PerHour: 1, HeldBack: 2,
			Recent:     []v1alpha1.PoolRetirement{{Proxy: "a", At: metav1.NewTime(now)}},
			NextFreeAt: &metav1.Time{Time: now.Add(time.Hour)}},
	}
	err := r.carryOut(ctx, pool, pass, 1, now)
	if !apierrors.IsConflict(err) {
		t.Fatalf("carryOut = %v, want the retirement's conflict", err)
	}
	select {
	case ev := <-rec.Events:
		if !strings.Contains(ev, ReasonRetirementHeldBack) || !strings.Contains(ev, "held back for b, c") {
			t.Errorf("event %q, want %s naming b and c", ev, ReasonRetirementHeldBack)
		}
	default:
		t.Fatalf("no %s event for the two children held back", ReasonRetirementHeldBack)
	}
}
