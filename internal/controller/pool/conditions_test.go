package pool

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/controllertest"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbuild"
)

// The conditions a pool sets, computed from a poolScope alone (no API server), one row
// per situation, as cluster-api's machineset_controller_status_test.go does: Available,
// PlacementValid, Progressing with each of its reasons, the kstatus trio (Ready,
// Reconciling, Stalled) that follows them, EgressExhausted and EgressShared.

// condScope is a pool of replicas (maxSurge 1, maxUnavailable 0) with a child for each
// of kids, kid's flags (g available, r ready only, p booting, f failed, o outdated,
// d deleting).
func condScope(replicas int32, kids ...string) *poolScope {
	pool := controllertest.NewPool("ns", "news", replicas)
	pool.Generation = 3
	s := &poolScope{pool: pool, base: pool.DeepCopy(), now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		replicas: replicas, surge: 1, unavail: 0, deadline: DefaultProgressDeadline}
	for i, flags := range kids {
		c := kid(fmt.Sprintf("c%d", i), i, flags)
		s.children = append(s.children, scopedChild{px: testbuild.Proxy("ns", c.name), poolChild: c})
	}
	return s
}

type wantCond struct {
	status metav1.ConditionStatus
	reason string
	msg    string // a part of the message
}

func TestPoolConditionsTable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		scope func() *poolScope
		want  map[string]wantCond // by type; "" status: absent
	}{
		{"complete", func() *poolScope { return condScope(2, "g", "g") }, map[string]wantCond{
			v1alpha1.PoolConditionAvailable:      {metav1.ConditionTrue, v1alpha1.PoolReasonMinimumAvailable, "2 of 2 children available (at least 2 needed)"},
			v1alpha1.PoolConditionPlacementValid: {metav1.ConditionTrue, v1alpha1.PoolReasonPlacementValid, "every placement names a configured provider and zone"},
			v1alpha1.PoolConditionProgressing:    {metav1.ConditionFalse, v1alpha1.PoolReasonComplete, "2 of 2 children up to date and available"},
			v1alpha1.ConditionReady:              {metav1.ConditionTrue, v1alpha1.PoolReasonComplete, ""},
			v1alpha1.ConditionReconciling:        {},
			v1alpha1.ConditionStalled:            {},
		}},
		{"scaling up from nothing", func() *poolScope { return condScope(3) }, map[string]wantCond{
			v1alpha1.PoolConditionAvailable:   {metav1.ConditionFalse, v1alpha1.PoolReasonMinimumUnavailable, "0 of 3 children available, 3 needed"},
			v1alpha1.PoolConditionProgressing: {metav1.ConditionTrue, v1alpha1.PoolReasonScalingUp, "0 of 3 children exist"},
			v1alpha1.ConditionReady:           {metav1.ConditionFalse, v1alpha1.PoolReasonScalingUp, ""},
			v1alpha1.ConditionReconciling:     {metav1.ConditionTrue, v1alpha1.PoolReasonScalingUp, ""},
			v1alpha1.ConditionStalled:         {},
		}},
		{"waiting for minReadySeconds", func() *poolScope { return condScope(2, "g", "r") }, map[string]wantCond{
			v1alpha1.PoolConditionAvailable:   {metav1.ConditionFalse, v1alpha1.PoolReasonMinimumUnavailable, "1 of 2 children available, 2 needed"},
			v1alpha1.PoolConditionProgressing: {metav1.ConditionTrue, v1alpha1.PoolReasonWaitingForAvailable, "1 of 2 children available (minReadySeconds 0)"},
			v1alpha1.ConditionReconciling:     {metav1.ConditionTrue, v1alpha1.PoolReasonWaitingForAvailable, ""},
		}},
		{"rolling out", func() *poolScope { return condScope(2, "go", "g") }, map[string]wantCond{
			v1alpha1.PoolConditionAvailable:   {metav1.ConditionTrue, v1alpha1.PoolReasonMinimumAvailable, "2 of 2 children available"},
			v1alpha1.PoolConditionProgressing: {metav1.ConditionTrue, v1alpha1.PoolReasonRollingOut, "1 of 2 children up to date, 2 available"},
		}},
		{"replacing a failed child", func() *poolScope { return condScope(2, "g", "f", "p") }, map[string]wantCond{
			v1alpha1.PoolConditionProgressing: {metav1.ConditionTrue, v1alpha1.PoolReasonReplacing, "replacing 1 children (cordoned, failed or past their deadline), 1 of 2 available"},
		}},
		{"scaling down", func() *poolScope { return condScope(1, "g", "g", "rd") }, map[string]wantCond{
			v1alpha1.PoolConditionProgressing: {metav1.ConditionTrue, v1alpha1.PoolReasonScalingDown, "2 children, 1 wanted"},
		}},
		{"stalled", func() *poolScope {
			s := condScope(2, "f", "f")
			s.plan.stalled = true
			return s
		}, map[string]wantCond{
			v1alpha1.PoolConditionProgressing: {metav1.ConditionFalse, v1alpha1.PoolReasonStalled, "2 children need replacing (2 Failed) but none can be replaced now"},
			v1alpha1.ConditionReady:           {metav1.ConditionFalse, v1alpha1.PoolReasonStalled, ""},
			v1alpha1.ConditionStalled:         {metav1.ConditionTrue, v1alpha1.PoolReasonStalled, "none can be replaced now"},
			v1alpha1.ConditionReconciling:     {},
		}},
		{"a spec the controller cannot use", func() *poolScope {
			s := condScope(2, "g", "g")
			s.specErr = errors.New("spec.strategy.rollingUpdate.maxSurge: invalid")
			return s
		}, map[string]wantCond{
			v1alpha1.PoolConditionProgressing: {metav1.ConditionFalse, v1alpha1.PoolReasonStalled, "spec.strategy.rollingUpdate.maxSurge: invalid"},
			v1alpha1.ConditionStalled:         {metav1.ConditionTrue, v1alpha1.PoolReasonStalled, "maxSurge: invalid"},
		}},
		{"credentials unavailable", func() *poolScope {
			s := condScope(2, "g", "g")
			s.credErr = errors.New("secret ns/auth (spec.template.spec.proxy.basicAuth.secretRef) not found")
			return s
		}, map[string]wantCond{
			v1alpha1.PoolConditionProgressing: {metav1.ConditionFalse, v1alpha1.PoolReasonCredentialsUnavailable, "not found; the pool creates and deletes no children until the Secret can be read"},
			v1alpha1.ConditionStalled:         {metav1.ConditionTrue, v1alpha1.PoolReasonCredentialsUnavailable, ""},
			v1alpha1.ConditionReconciling:     {},
		}},
		{"no progress within the deadline", func() *poolScope {
			s := condScope(2, "g", "p")
			s.progressAt = s.now.Add(-DefaultProgressDeadline)
			return s
		}, map[string]wantCond{
			v1alpha1.PoolConditionProgressing: {metav1.ConditionFalse, v1alpha1.PoolReasonProgressDeadlineExceeded, "no child became available and none finished deleting for 600s (progressDeadlineSeconds) since 2025-12-31T23:50:00Z; never Ready: c1 (no status yet)"},
			v1alpha1.ConditionStalled:         {metav1.ConditionTrue, v1alpha1.PoolReasonProgressDeadlineExceeded, ""},
		}},
		{"a placement nowhere", func() *poolScope {
			s := condScope(2, "g", "g")
			s.placementReason, s.placementMessage = v1alpha1.PoolReasonUnknownZone, `spec.spread[0] (provider fake-home, zone attic): zone "attic" is not one of provider fake-home's zones`
			return s
		}, map[string]wantCond{
			v1alpha1.PoolConditionPlacementValid: {metav1.ConditionFalse, v1alpha1.PoolReasonUnknownZone, `zone "attic" is not one of provider fake-home's zones`},
			v1alpha1.PoolConditionProgressing:    {metav1.ConditionFalse, v1alpha1.PoolReasonComplete, ""},
			v1alpha1.ConditionReady:              {metav1.ConditionTrue, v1alpha1.PoolReasonComplete, ""},
		}},
		{"a placement nowhere while scaling", func() *poolScope {
			s := condScope(2, "g")
			s.placementReason, s.placementMessage = v1alpha1.PoolReasonUnknownZone, "spec.spread[0]: nowhere"
			return s
		}, map[string]wantCond{
			v1alpha1.ConditionStalled:     {metav1.ConditionTrue, v1alpha1.PoolReasonUnknownZone, "spec.spread[0]: nowhere"},
			v1alpha1.ConditionReconciling: {},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.scope()
			s.setConditions(s.counts())
			checkConds(t, s.pool.Status.Conditions, s.pool.Generation, tc.want)
		})
	}
}

func TestPoolEgressExhaustedTable(t *testing.T) {
	sel := labels.SelectorFromSet(labels.Set{"exits": "news"})
	for _, tc := range []struct {
		name   string
		egress *poolEgress
		want   wantCond
	}{
		{"no egress: no condition", nil, wantCond{}},
		{"nothing matches", &poolEgress{selector: sel, needed: 2},
			wantCond{metav1.ConditionTrue, v1alpha1.PoolReasonNoFreeEgress, "spec.egress.wireguard.secretSelector (exits=news) matches no WireGuard Secret (labelled " + v1alpha1.CredentialsLabel + "=true, holding wg0.conf) in namespace ns; 2 children wait for one each"}},
		{"all held", &poolEgress{selector: sel, matching: 2, needed: 1,
			skipped: []skippedSecret{{"crawl-auth", "no key wg0.conf"}}},
			wantCond{metav1.ConditionTrue, v1alpha1.PoolReasonNoFreeEgress, "has 0 free WireGuard configurations and needs 1: spec.egress.wireguard.secretSelector (exits=news) matches 2, the others held by children (two children never share one: two peers with one key break each other's tunnel); add Secrets that match; it also matches 1 Secrets that are not WireGuard exits and are never handed out: crawl-auth (no key wg0.conf)"}},
		{"free ones", &poolEgress{selector: sel, matching: 3, free: []string{"exit-3"}, needed: 1, freeBefore: 2},
			wantCond{metav1.ConditionFalse, v1alpha1.PoolReasonEgressAvailable, "1 of the 3 WireGuard configurations spec.egress.wireguard.secretSelector matches are free"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := condScope(2, "g", "g")
			meta.SetStatusCondition(&s.pool.Status.Conditions, metav1.Condition{Type: v1alpha1.PoolConditionEgressExhausted, Status: metav1.ConditionUnknown, Reason: "Before"})
			s.egress = tc.egress
			s.setEgressExhausted()
			checkConds(t, s.pool.Status.Conditions, s.pool.Generation, map[string]wantCond{v1alpha1.PoolConditionEgressExhausted: tc.want})
		})
	}
}

// checkConds fails the test unless each condition in want is as it says (absent for an
// empty status), at generation gen.
func checkConds(t *testing.T, conds []metav1.Condition, gen int64, want map[string]wantCond) {
	t.Helper()
	for typ, w := range want {
		c := meta.FindStatusCondition(conds, typ)
		switch {
		case w.status == "" && c != nil:
			t.Errorf("%s %+v, want none", typ, *c)
		case w.status == "":
		case c == nil:
			t.Errorf("no %s, want %s %s", typ, w.status, w.reason)
		case c.Status != w.status || c.Reason != w.reason || !strings.Contains(c.Message, w.msg) || c.ObservedGeneration != gen:
			t.Errorf("%s %s %s %q (generation %d), want %s %s with %q (generation %d)", typ, c.Status, c.Reason, c.Message, c.ObservedGeneration, w.status, w.reason, w.msg, gen)
		}
	}
}

// EgressShared and status.distinctEgressIPs from the available children's egress
// addresses: kids as condScope's flags, ips the egress address each one's probe saw
// ("" not known yet).
func TestPoolEgressSharedTable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		kids     []string
		ips      []string
		distinct int32
		want     wantCond
	}{
		{"no children", nil, nil, 0,
			wantCond{metav1.ConditionFalse, v1alpha1.PoolReasonDistinctEgressIPs, "0 available children leave from 0 distinct egress addresses"}},
		{"each its own address", []string{"g", "g"}, []string{"198.51.100.1", "198.51.100.2"}, 2,
			wantCond{metav1.ConditionFalse, v1alpha1.PoolReasonDistinctEgressIPs, "2 available children leave from 2 distinct egress addresses"}},
		{"two share one", []string{"g", "g", "g"}, []string{"198.51.100.7", "198.51.100.9", "198.51.100.7"}, 2,
			wantCond{metav1.ConditionTrue, v1alpha1.PoolReasonSharedEgressIP, "available children share egress addresses, so sites see them as one proxy each: 198.51.100.7 (c0, c2)"}},
		{"an address not known yet", []string{"g", "g"}, []string{"198.51.100.1", ""}, 1,
			wantCond{metav1.ConditionFalse, v1alpha1.PoolReasonDistinctEgressIPs, "1 available children leave from 1 distinct egress addresses; 1 more available children have no egress address known yet (the probe target did not report one)"}},
		{"shared, and one not known yet", []string{"g", "g", "g"}, []string{"198.51.100.7", "198.51.100.7", ""}, 1,
			wantCond{metav1.ConditionTrue, v1alpha1.PoolReasonSharedEgressIP, "one proxy each: 198.51.100.7 (c0, c1); 1 more available children have no egress address known yet"}},
		{"children not available do not count", []string{"g", "r", "gc", "gd", "f"}, []string{"198.51.100.7", "198.51.100.7", "198.51.100.7", "198.51.100.7", "198.51.100.7"}, 1,
			wantCond{metav1.ConditionFalse, v1alpha1.PoolReasonDistinctEgressIPs, "1 available children leave from 1 distinct egress addresses"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := condScope(int32(len(tc.kids)), tc.kids...)
			for i, ip := range tc.ips {
				s.children[i].px.Status.EgressIP = ip
			}
			s.setEgressIdentities()
			checkConds(t, s.pool.Status.Conditions, s.pool.Generation, map[string]wantCond{v1alpha1.PoolConditionEgressShared: tc.want})
			if got := s.pool.Status.DistinctEgressIPs; got != tc.distinct {
				t.Errorf("status.distinctEgressIPs %d, want %d", got, tc.distinct)
			}
		})
	}
}
