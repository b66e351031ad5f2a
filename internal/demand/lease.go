// Package demand shares a ProxyPool's measured demand through the API server, so that the
// autoscaler sizes the pool from what every measurer sees (each gateway replica, and
// discovery's picks), not from one process's memory.
//
// # The record: a Lease per measurer and pool
//
// Each measurer writes, per pool it sees demand for, one coordination.k8s.io/v1 Lease in
// the demand namespace (one namespace for every pool: the operator's own, the flag
// --demand-namespace of the manager and of the gateway, DefaultNamespace), named
// LeaseName(pool, source) ("<pool's namespace>.<pool>.demand.<source>"), with
//
//   - the labels egress.hrajfrisbee.cz/demand-for: <pool>,
//     egress.hrajfrisbee.cz/demand-namespace: <pool's namespace> and
//     egress.hrajfrisbee.cz/demand-source: <kind> (gateway or discovery);
//   - spec.holderIdentity: the source (the gateway pod's name, or discovery-<manager pod>);
//   - spec.renewTime: when the numbers were measured;
//   - the annotations egress.hrajfrisbee.cz/sessions (a decimal: open tunnels and live
//     sessions), egress.hrajfrisbee.cz/held (an integer: requests held waiting for a
//     child) and egress.hrajfrisbee.cz/requests-per-second (a decimal).
//
// The pool a Lease measures is named by its two labels alone (PoolOf), never by the Lease's
// own namespace: so the measurers need write access to Leases in the demand namespace
// only, not in every pool's namespace (where a cluster's own Leases live, kube-system's
// leader elections among them).
//
// Samples reads such Leases back as autoscale.Samples; a Lease whose renewTime is older
// than autoscale.DefaultStaleAfter (2m) counts for nothing there, so a measurer that is
// gone stops counting without deleting anything.
//
// # The write bound: Reporter
//
// A Reporter writes a measurer's numbers, at most once per ReportInterval (15 s) per pool,
// and only when the numbers changed or the last write is older than Refresh (60 s, half
// of the stale age, so that a live measurer's Lease never goes stale). A wake (held going
// from 0 to more) is written at once, but still at most once per WakeInterval (1 s) per
// pool. Nothing is written for a pool whose demand has been zero since the Reporter
// started; a zero after a nonzero is written (so that the pool can shrink).
package demand

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/autoscale"
)

// The Lease's labels and annotations.
const (
	// LabelFor names the pool the Lease measures (in the namespace of LabelNamespace).
	LabelFor = "egress.hrajfrisbee.cz/demand-for"
	// LabelNamespace is the namespace of the pool the Lease measures (the Lease itself is
	// in the demand namespace).
	LabelNamespace = "egress.hrajfrisbee.cz/demand-namespace"
	// LabelSource is the measurer's kind: KindGateway or KindDiscovery.
	LabelSource = "egress.hrajfrisbee.cz/demand-source"
	// AnnotationSessions: concurrent sessions (open tunnels, live sessions), a decimal.
	AnnotationSessions = "egress.hrajfrisbee.cz/sessions"
	// AnnotationHeld: requests held waiting for a child, an integer.
	AnnotationHeld = "egress.hrajfrisbee.cz/held"
	// AnnotationRequestsPerSecond: the request rate, a decimal.
	AnnotationRequestsPerSecond = "egress.hrajfrisbee.cz/requests-per-second"

	// KindGateway and KindDiscovery are the values of LabelSource.
	KindGateway   = "gateway"
	KindDiscovery = "discovery"
)

// maxName is the longest name a Lease may have (a DNS subdomain).
const maxName = 253

// Measure is one measurer's numbers for one pool.
type Measure struct {
	// Sessions is the concurrent sessions (open tunnels, live sessions) to the pool.
	Sessions float64
	// Held is the requests held waiting for a child (not counted in Sessions).
	Held int32
	// RequestsPerSecond is the request rate to the pool.
	RequestsPerSecond float64
}

// Zero reports whether m measures no demand at all.
func (m Measure) Zero() bool { return m.Sessions <= 0 && m.Held <= 0 && m.RequestsPerSecond <= 0 }

// rounded is m as written: negative numbers as 0, decimals to a thousandth. Two measures
// that round alike are the same for the write bound.
func (m Measure) rounded() Measure {
	return Measure{Sessions: round(m.Sessions), Held: max(m.Held, 0), RequestsPerSecond: round(m.RequestsPerSecond)}
}

func round(v float64) float64 {
	if v <= 0 || math.IsNaN(v) {
		return 0
	}
	if math.IsInf(v, 1) {
		return math.MaxFloat64
	}
	return math.Round(v*1000) / 1000
}

func formatDecimal(v float64) string { return strconv.FormatFloat(round(v), 'f', -1, 64) }

// SourceID makes s a DNS-safe measurer id: lower case letters, digits, '-' and '.', every
// other character as '-', trimmed of leading and trailing '-' and '.'.
func SourceID(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '.' {
			b[i] = '-'
		}
	}
	return strings.Trim(string(b), "-.")
}

// LeaseName is the name of source's Lease for pool: "<namespace>.<pool>.demand.<source>",
// with the source shortened to fit 253 characters when it does not (its head, '-', and a
// hash of it).
func LeaseName(pool types.NamespacedName, source string) string {
	source = SourceID(source)
	prefix := pool.Namespace + "." + pool.Name + ".demand."
	name := prefix + source
	if len(name) <= maxName {
		return name
	}
	sum := sha256.Sum256([]byte(source))
	hash := hex.EncodeToString(sum[:])[:10]
	keep := max(maxName-len(prefix)-len(hash)-1, 0)
	return prefix + strings.TrimRight(source[:min(keep, len(source))], "-.") + "-" + hash
}

// PoolOf is the pool l measures, from its labels LabelNamespace and LabelFor (not from
// l's own namespace); false when either is missing.
func PoolOf(l metav1.Object) (types.NamespacedName, bool) {
	pool := types.NamespacedName{Namespace: l.GetLabels()[LabelNamespace], Name: l.GetLabels()[LabelFor]}
	return pool, pool.Namespace != "" && pool.Name != ""
}

// Selector is the label selector of pool's demand Leases (list them in the demand
// namespace).
func Selector(pool types.NamespacedName) map[string]string {
	return map[string]string{LabelFor: pool.Name, LabelNamespace: pool.Namespace}
}

// Parse reads one demand Lease as a Sample. It fails, naming the Lease and the field, when
// the Lease has no renewTime or an annotation is not a non-negative number.
func Parse(l *coordinationv1.Lease) (autoscale.Sample, error) {
	name := l.Namespace + "/" + l.Name
	s := autoscale.Sample{Source: l.Name}
	if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
		s.Source = *l.Spec.HolderIdentity
	}
	if l.Spec.RenewTime == nil {
		return s, fmt.Errorf("demand Lease %s: spec.renewTime is not set (when the demand was measured)", name)
	}
	s.At = l.Spec.RenewTime.Time
	var err error
	if s.Sessions, err = decimal(l, AnnotationSessions); err != nil {
		return s, err
	}
	if s.RequestsPerSecond, err = decimal(l, AnnotationRequestsPerSecond); err != nil {
		return s, err
	}
	if v, ok := l.Annotations[AnnotationHeld]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
		if err != nil || n < 0 {
			return s, fmt.Errorf("demand Lease %s: annotation %s is %q, want a non-negative integer", name, AnnotationHeld, v)
		}
		s.Held = int32(n)
	}
	return s, nil
}

func decimal(l *coordinationv1.Lease, key string) (float64, error) {
	v, ok := l.Annotations[key]
	if !ok {
		return 0, nil
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("demand Lease %s/%s: annotation %s is %q, want a non-negative decimal", l.Namespace, l.Name, key, v)
	}
	return f, nil
}

// Samples reads pool's demand Leases as Samples: those whose labels name pool (PoolOf;
// the Lease's own namespace plays no part), leaving out those that Parse refuses (Parse
// says why).
func Samples(pool types.NamespacedName, leases []coordinationv1.Lease) []autoscale.Sample {
	out := make([]autoscale.Sample, 0, len(leases))
	for i := range leases {
		if p, ok := PoolOf(&leases[i]); !ok || p != pool {
			continue
		}
		if s, err := Parse(&leases[i]); err == nil {
			out = append(out, s)
		}
	}
	return out
}

// Stale reports whether l was measured more than age before now (or never): such a Lease
// is no longer counted, and one stale for long may be deleted.
func Stale(l *coordinationv1.Lease, now time.Time, age time.Duration) bool {
	return l.Spec.RenewTime == nil || now.Sub(l.Spec.RenewTime.Time) > age
}
