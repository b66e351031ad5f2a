package proxybans

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
)

// A pool's children are retired within its retirement budget (bans.PlanRetirements):
// the pool's ban controller, which sees all of them at once, decides, records each
// retirement in the pool's status.retirements first and cordons the child after. The
// count lives in the pool's status, not in the manager's memory, and outlives the
// retired child, so neither a restart nor the replacement of a retired child frees the
// budget early; a child recorded but not cordoned yet (a restart, a refused patch) is
// cordoned on the next pass without taking more of the budget. A standalone Proxy has
// no budget: retiring it only cordons it, nothing replaces it.

// ReasonRetirementHeldBack is the reason of the Warning Event on a pool whose spent
// budget holds back children due for retirement.
const ReasonRetirementHeldBack = "RetirementHeldBack"

var poolRetirementsHeldBack = common.PoolGauge(prometheus.GaugeOpts{Name: "proxy_operator_pool_retirements_held_back",
	Help: "Children of the pool due for retirement that its retirement budget (spec.bans.maxRetirementsPerHour) holds back (status.retirements.heldBack)."})

func init() {
	metrics.Registry.MustRegister(poolRetirementsHeldBack)
}

// dueChild is a child banned on enough sites to be retired.
type dueChild struct {
	px    *v1alpha1.Proxy
	sites []string
}

// retirementPass is what one pass of a pool's budget decided.
type retirementPass struct {
	status *v1alpha1.PoolRetirements // nil: retirement is off
	retire []dueChild
	held   []string
	policy bans.Policy
	// budget describes the budget for messages: "1 per hour, 10% of 3 replicas".
	budget string
}

// planPoolRetirements decides which of the pool's children (kids, controlled by it) are
// retired now, by the pool's policy and budget, at now.
func (r *BansReconciler) planPoolRetirements(pool *v1alpha1.ProxyPool, kids []*v1alpha1.Proxy, now time.Time) (*retirementPass, error) {
	pass := &retirementPass{policy: bans.PoolPolicy(pool.Spec.Bans, r.Policy)}
	if pass.policy.RetireAfterSites <= 0 {
		return pass, nil
	}
	spec := bans.DefaultMaxRetirementsPerHour
	if r.MaxRetirementsPerHour != nil {
		spec = *r.MaxRetirementsPerHour
	}
	if b := pool.Spec.Bans; b != nil && b.MaxRetirementsPerHour != nil {
		spec = *b.MaxRetirementsPerHour
	}
	replicas := int(ptr.Deref(pool.Spec.Replicas, 1))
	budget, err := bans.RetirementBudget(spec, replicas)
	if err != nil {
		return nil, fmt.Errorf("proxy pool %s/%s: spec.bans.maxRetirementsPerHour %s: %w", pool.Namespace, pool.Name, spec.String(), err)
	}
	pass.budget = fmt.Sprintf("%d per hour", budget)
	if spec.Type == intstr.String {
		pass.budget += fmt.Sprintf(", %s of %d replicas", spec.StrVal, replicas)
	}

	var due []dueChild
	for _, px := range kids {
		if !px.DeletionTimestamp.IsZero() || px.Annotations[v1alpha1.RetiredAnnotation] != "" {
			continue
		}
		if sites, ok := bans.Retire(px.Status.Cooldowns, now, pass.policy); ok {
			due = append(due, dueChild{px, sites})
		}
	}
	// The most burnt first.
	slices.SortFunc(due, func(a, b dueChild) int {
		return cmp.Or(cmp.Compare(len(b.sites), len(a.sites)), strings.Compare(a.px.Name, b.px.Name))
	})
	names := make([]string, len(due))
	for i, d := range due {
		names[i] = d.px.Name
	}
	var recent []bans.Retirement
	if st := pool.Status.Retirements; st != nil {
		for _, rt := range st.Recent {
			recent = append(recent, bans.Retirement{Proxy: rt.Proxy, At: rt.At.Time})
		}
	}
	// The API server keeps times to the second; so does the record, so that it compares
	// equal once written.
	plan := bans.PlanRetirements(names, recent, budget, now.Truncate(time.Second))
	for _, d := range due {
		if slices.Contains(plan.Retire, d.px.Name) {
			pass.retire = append(pass.retire, d)
		}
	}
	pass.held = plan.HeldBack
	pass.status = &v1alpha1.PoolRetirements{PerHour: int32(budget), HeldBack: int32(len(plan.HeldBack))}
	for _, rt := range plan.Recent {
		pass.status.Recent = append(pass.status.Recent, v1alpha1.PoolRetirement{Proxy: rt.Proxy, At: metav1.NewTime(rt.At)})
	}
	if !plan.NextFree.IsZero() {
		pass.status.NextFreeAt = &metav1.Time{Time: plan.NextFree}
	}
	return pass, nil
}

// carryOut says which children the pass held back, then cordons the children it
// retires, once their retirements are recorded in the pool's status. The held-back
// Event comes first: it reports the status just written, and a retirement that fails
// (a child's copy in the cache older than a retirement already made, refused by the
// patch's lock) must not lose it, since the next pass finds the same count in the
// status and says nothing.
func (r *BansReconciler) carryOut(ctx context.Context, pool *v1alpha1.ProxyPool, pass *retirementPass, heldBefore int32, now time.Time) error {
	poolRetirementsHeldBack.WithLabelValues(pool.Namespace, pool.Name).Set(float64(len(pass.held)))
	if len(pass.held) > 0 && int32(len(pass.held)) > heldBefore {
		r.sayHeldBack(ctx, pool, pass)
	}
	for _, d := range pass.retire {
		if err := r.retire(ctx, d.px, d.sites, pass.policy, now); err != nil {
			return err
		}
	}
	return nil
}

// sayHeldBack records the Warning Event and log line for the children the budget holds
// back.
func (r *BansReconciler) sayHeldBack(ctx context.Context, pool *v1alpha1.ProxyPool, pass *retirementPass) {
	frees := "never: the budget is 0"
	if at := pass.status.NextFreeAt; at != nil {
		frees = "at " + at.UTC().Format(time.RFC3339)
	}
	recent := make([]string, len(pass.status.Recent))
	for i, rt := range pass.status.Recent {
		recent[i] = rt.Proxy
	}
	note := fmt.Sprintf("retirement held back for %s by the budget (spec.bans.maxRetirementsPerHour: %s); retired within the last hour: %s; "+
		"the budget frees %s; they keep serving, cooling for each site they were banned on",
		common.NameList(pass.held), pass.budget, common.NameList(recent), frees)
	if r.Recorder != nil {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, ReasonRetirementHeldBack, "Retire", "%s", note)
	}
	ctrl.LoggerFrom(ctx).Info("retirements held back by the pool's retirement budget", "pool", pool.Name,
		"heldBack", pass.held, "budget", pass.budget, "frees", frees)
}
