package bans

import (
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Bounds of the reports a Recorder holds between writes, counted in (proxy, site) pairs:
// the reports of one pair fold into one, so only a new pair takes room.
const (
	DefaultMaxPendingPairsPerProxy = 1000
	DefaultMaxPendingPairs         = 50000
)

// The reason label of droppedReports.
const (
	// DropInvalid: the API server refused the write as invalid; sending it again would
	// be refused again.
	DropInvalid = "invalid"
	// DropProxyFull, DropFull: a report for a new pair while its proxy already had
	// MaxPendingPairsPerProxy pairs waiting, or the recorder MaxPendingPairs.
	DropProxyFull = "proxy_full"
	DropFull      = "full"
)

// droppedReports counts the reports a Recorder took and never wrote, by reason.
var droppedReports = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "proxy_operator_feedback_dropped_total",
	Help: "Crawler reports taken and never written to a Proxy's status, by reason: invalid (the API server refused the write as invalid), proxy_full or full (the bound of pairs waiting for a write, per proxy or in all, was reached).",
}, []string{"reason"})

func init() {
	metrics.Registry.MustRegister(droppedReports)
}

// pendingPair is what the reports of one (proxy, site) pair taken since its last write
// amount to: at most four reports that CooldownsAfter turns into the entry the reports give one
// by one, as long as no cooldown, the pair's own or one the reports start (but a
// throttle's followed by an ok), ends between the first and the last of them (a write
// follows within about a second). A report of an outcome CooldownsAfter does not know counts and
// changes nothing.
//   - an ok forgets an ended cooldown, so it counts only before any ban, and after the
//     end of the throttles before it (as CooldownsAfter keeps it, rounded up to the second); then
//     it is all that counts so far, since it forgets what came before. An ok while a
//     reported ban or throttle cools changes nothing, as in CooldownsAfter.
//   - a ban while the pair cools from a ban changes nothing, so only the first counts.
//   - throttles only move the end later, so the throttles before the first ban fold into
//     one from the first of them to the latest end, and those after it into another.
//     They stay apart because a throttle before the ban makes the pair cool, and a ban
//     of a pair that cools with a streak is one seen in flight.
//
// Unreachable reports come with no site (the pair of site ""): they fold into the time of
// the first and their count.
type pendingPair struct {
	okAt          time.Time // zero: none
	before, after throttleSpan
	bannedAt      time.Time // the first ban; zero: none
	reports       int       // how many reports it folds
	// unreachableAt is the first unreachable report's time, unreachable their count.
	unreachableAt time.Time
	unreachable   int32
}

// throttleSpan folds throttles: the first one's time and the latest end.
type throttleSpan struct{ at, end time.Time }

func (s *throttleSpan) add(at time.Time, d time.Duration) {
	if d <= 0 {
		d = DefaultThrottle
	}
	if s.at.IsZero() {
		s.at = at
	}
	s.end = later(s.end, at.Add(d))
}

func (s throttleSpan) report(site string) (timedReport, bool) {
	return timedReport{Report: Report{Site: site, Outcome: Throttled, RetryAfter: s.end.Sub(s.at)}, at: s.at}, !s.at.IsZero()
}

// add folds the report r taken at at; reports of a pair come in the order they were taken.
func (p *pendingPair) add(r Report, at time.Time) { p.addN(r, at, 1) }

// addN is add for n reports r taken at at (n counts only for unreachable: the others
// fold to one).
func (p *pendingPair) addN(r Report, at time.Time, n int32) {
	p.reports++
	switch r.Outcome {
	case Unreachable:
		if p.unreachable == 0 {
			p.unreachableAt = at
		}
		p.unreachable += max(n, 1)
	case OK:
		if p.bannedAt.IsZero() && !at.Before(ceilSecond(p.before.end)) { // the end CooldownsAfter keeps
			*p = pendingPair{okAt: at, reports: p.reports}
		}
	case Throttled:
		if p.bannedAt.IsZero() {
			p.before.add(at, r.RetryAfter)
		} else {
			p.after.add(at, r.RetryAfter)
		}
	case Banned:
		if p.bannedAt.IsZero() {
			p.bannedAt = at
		}
	}
}

// fold returns the reports p folded, in the order they were taken.
func (p *pendingPair) fold(site string) []timedReport {
	var out []timedReport
	if !p.okAt.IsZero() {
		out = append(out, timedReport{Report: Report{Site: site, Outcome: OK}, at: p.okAt})
	}
	if t, ok := p.before.report(site); ok {
		out = append(out, t)
	}
	if !p.bannedAt.IsZero() {
		out = append(out, timedReport{Report: Report{Site: site, Outcome: Banned}, at: p.bannedAt})
	}
	if t, ok := p.after.report(site); ok {
		out = append(out, t)
	}
	if p.unreachable > 0 {
		out = append(out, timedReport{Report: Report{Site: site, Outcome: Unreachable}, at: p.unreachableAt, n: p.unreachable})
	}
	return out
}

// then folds newer, taken after p, into p.
func (p *pendingPair) then(newer *pendingPair, site string) {
	n := p.reports + newer.reports
	for _, t := range newer.fold(site) {
		p.addN(t.Report, t.at, t.n)
	}
	p.reports = n
}

// pendingProxy is the pairs of one Proxy waiting for a write, by site.
type pendingProxy map[string]*pendingPair

// reports is what the pairs fold to, in the order taken (by site within one instant).
func (pp pendingProxy) reports() []timedReport {
	var out []timedReport
	for site, p := range pp {
		out = append(out, p.fold(site)...)
	}
	slices.SortStableFunc(out, func(a, b timedReport) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return strings.Compare(a.Site, b.Site)
	})
	return out
}

// count is how many reports the pairs fold.
func (pp pendingProxy) count() int {
	n := 0
	for _, p := range pp {
		n += p.reports
	}
	return n
}
