package demand

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/autoscale"
)

func TestLeaseNameIsNamespacePoolDemandSourceAndFits(t *testing.T) {
	for _, tc := range []struct{ ns, pool, source, want string }{
		{"team-a", "crawl", "egress-gw-7d9f-x2", "team-a.crawl.demand.egress-gw-7d9f-x2"},
		{"team-a", "crawl", "discovery-Manager_0", "team-a.crawl.demand.discovery-manager-0"},
		{"team-b", "crawl", "--gw--", "team-b.crawl.demand.gw"},
	} {
		if got := LeaseName(poolKey(tc.ns, tc.pool), tc.source); got != tc.want {
			t.Errorf("LeaseName(%s/%s, %q) = %q, want %q", tc.ns, tc.pool, tc.source, got, tc.want)
		}
	}
	pool := poolKey(strings.Repeat("n", 63), strings.Repeat("p", 63))
	long, other := strings.Repeat("g", 240), strings.Repeat("g", 239)+"h"
	a, b := LeaseName(pool, long), LeaseName(pool, other)
	for _, n := range []string{a, b} {
		if len(n) > 253 || !strings.HasPrefix(n, pool.Namespace+"."+pool.Name+".demand.") {
			t.Errorf("LeaseName of a long source = %q (%d characters), want <namespace>.<pool>.demand.<shortened> within 253", n, len(n))
		}
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("LeaseName %q is not a valid name: %v", n, errs)
		}
	}
	if a == b {
		t.Errorf("two long sources sharing their head got one Lease name %q", a)
	}
}

// lease is a demand Lease in the demand namespace "ns" for pool team-a/crawl.
func lease(annotations map[string]string, holder string, at *time.Time) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "crawl.demand.gw-1", Annotations: annotations,
		Labels: map[string]string{LabelFor: "crawl", LabelNamespace: "team-a", LabelSource: KindGateway}}}
	if holder != "" {
		l.Spec.HolderIdentity = ptr.To(holder)
	}
	if at != nil {
		l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(*at))
	}
	return l
}

func TestParseReadsTheLeaseFormat(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 600000, time.UTC)
	got, err := Parse(lease(map[string]string{AnnotationSessions: "12.5", AnnotationHeld: "3", AnnotationRequestsPerSecond: "40.25"}, "gw-1", &at))
	if err != nil {
		t.Fatal(err)
	}
	want := autoscale.Sample{Source: "gw-1", At: at, Sessions: 12.5, Held: 3, RequestsPerSecond: 40.25}
	if !got.At.Equal(want.At) || got.Source != want.Source || got.Sessions != want.Sessions || got.Held != want.Held || got.RequestsPerSecond != want.RequestsPerSecond {
		t.Errorf("Parse = %+v, want %+v", got, want)
	}
	// Missing annotations are zero, a missing holder is the Lease's name.
	got, err = Parse(lease(nil, "", &at))
	if err != nil || got.Source != "crawl.demand.gw-1" || got.Sessions != 0 || got.Held != 0 || got.RequestsPerSecond != 0 {
		t.Errorf("Parse of a bare Lease = %+v, %v; want zero demand from crawl.demand.gw-1", got, err)
	}
}

func TestParseRefusesBadLeasesNamingTheField(t *testing.T) {
	at := time.Now()
	for _, tc := range []struct {
		name string
		l    *coordinationv1.Lease
		want string
	}{
		{"no renewTime", lease(nil, "gw", nil), "spec.renewTime"},
		{"sessions not a number", lease(map[string]string{AnnotationSessions: "many"}, "gw", &at), AnnotationSessions},
		{"negative sessions", lease(map[string]string{AnnotationSessions: "-1"}, "gw", &at), AnnotationSessions},
		{"held a decimal", lease(map[string]string{AnnotationHeld: "1.5"}, "gw", &at), AnnotationHeld},
		{"negative held", lease(map[string]string{AnnotationHeld: "-2"}, "gw", &at), AnnotationHeld},
		{"rate infinite", lease(map[string]string{AnnotationRequestsPerSecond: "+Inf"}, "gw", &at), AnnotationRequestsPerSecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.l)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "ns/crawl.demand.gw-1") {
				t.Fatalf("Parse = %v, want an error naming the Lease ns/crawl.demand.gw-1 and %s", err, tc.want)
			}
		})
	}
}

func TestSamplesLeavesOutBadLeases(t *testing.T) {
	at := time.Now()
	good := lease(map[string]string{AnnotationSessions: "2"}, "gw-1", &at)
	bad := lease(map[string]string{AnnotationHeld: "x"}, "gw-2", &at)
	got := Samples(poolKey("team-a", "crawl"), []coordinationv1.Lease{*good, *bad})
	if len(got) != 1 || got[0].Source != "gw-1" || got[0].Sessions != 2 {
		t.Fatalf("Samples = %+v, want the one good Lease's sample (gw-1, 2 sessions)", got)
	}
}

// The pool's namespace is the Lease's demand-namespace label, never the Lease's own
// namespace: a Lease in namespace team-a labelled for pool team-b/crawl is team-b's demand,
// not team-a's; and a Lease without the label measures no pool.
func TestSamplesTakeThePoolsNamespaceFromTheLabel(t *testing.T) {
	at := time.Now()
	l := lease(map[string]string{AnnotationSessions: "3"}, "gw-1", &at)
	l.Namespace = "team-a"
	l.Labels[LabelNamespace] = "team-b"
	if p, ok := PoolOf(l); !ok || p != poolKey("team-b", "crawl") {
		t.Errorf("PoolOf = %v, %v; want team-b/crawl from the labels", p, ok)
	}
	if got := Samples(poolKey("team-b", "crawl"), []coordinationv1.Lease{*l}); len(got) != 1 || got[0].Sessions != 3 {
		t.Errorf("Samples for team-b/crawl = %+v, want the Lease's 3 sessions", got)
	}
	if got := Samples(poolKey("team-a", "crawl"), []coordinationv1.Lease{*l}); len(got) != 0 {
		t.Errorf("Samples for team-a/crawl (the Lease's own namespace) = %+v, want none", got)
	}
	bare := lease(map[string]string{AnnotationSessions: "3"}, "gw-1", &at)
	delete(bare.Labels, LabelNamespace)
	bare.Namespace = "team-a"
	if p, ok := PoolOf(bare); ok {
		t.Errorf("PoolOf a Lease without %s = %v, want none", LabelNamespace, p)
	}
	if got := Samples(poolKey("team-a", "crawl"), []coordinationv1.Lease{*bare}); len(got) != 0 {
		t.Errorf("Samples of a Lease without %s = %+v, want none", LabelNamespace, got)
	}
}

func TestLeaseRoundsAndFormats(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	l := Lease("operator", poolKey("ns", "crawl"), KindGateway, "GW_1", Measure{Sessions: 1.23456, Held: -1, RequestsPerSecond: 1e-9}, at)
	if *l.Name != "ns.crawl.demand.gw-1" || *l.Namespace != "operator" {
		t.Errorf("Lease %s/%s, want operator/ns.crawl.demand.gw-1 (in the demand namespace)", *l.Namespace, *l.Name)
	}
	wantLabels := map[string]string{LabelFor: "crawl", LabelNamespace: "ns", LabelSource: KindGateway}
	wantAnn := map[string]string{AnnotationSessions: "1.235", AnnotationHeld: "0", AnnotationRequestsPerSecond: "0"}
	for k, v := range wantLabels {
		if l.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, l.Labels[k], v)
		}
	}
	for k, v := range wantAnn {
		if l.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, l.Annotations[k], v)
		}
	}
	if *l.Spec.HolderIdentity != "gw-1" || !l.Spec.RenewTime.Equal(&metav1.MicroTime{Time: at}) {
		t.Errorf("spec %v/%v, want holder gw-1 renewed at %s", *l.Spec.HolderIdentity, l.Spec.RenewTime, at)
	}
}

func TestStale(t *testing.T) {
	now := time.Now()
	old, fresh := now.Add(-3*time.Minute), now.Add(-time.Minute)
	if !Stale(lease(nil, "gw", &old), now, 2*time.Minute) || Stale(lease(nil, "gw", &fresh), now, 2*time.Minute) || !Stale(lease(nil, "gw", nil), now, time.Hour) {
		t.Error("Stale: want a Lease renewed 3m ago stale at 2m, one renewed 1m ago not, one never renewed stale")
	}
}
