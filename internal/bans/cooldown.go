// Package bans keeps what crawlers report about proxies and sites: a cooldown per
// (proxy, site) after a ban or a throttle, doubling with each further ban of the pair,
// stored in the Proxy's status.cooldowns so that every manager replica sees it.
package bans

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

// Defaults of the cooldown policy and of discovery's saturation guard.
const (
	DefaultCooldown          = 5 * time.Minute
	DefaultMaxCooldown       = 24 * time.Hour
	DefaultThrottle          = 60 * time.Second
	DefaultMaxCoolingPercent = 50
	DefaultRetireAfterSites  = 5
	DefaultRetireWindow      = time.Hour
	// MaxEntries bounds status.cooldowns of one Proxy.
	MaxEntries = 100
)

// Outcome is what a crawler saw through a proxy on a site.
type Outcome string

// The outcomes a report may carry.
const (
	Banned    Outcome = "banned"
	Throttled Outcome = "throttled"
	OK        Outcome = "ok"
	// Unreachable: the crawler could not reach the proxy at all (connection refused,
	// reset, or timed out before the proxy answered). It is about the proxy, not a site:
	// see unreachable.go.
	Unreachable Outcome = "unreachable"
)

// ErrBadDomain and ErrBadOutcome classify a report's faults.
var (
	ErrBadDomain  = errors.New("bad domain")
	ErrBadOutcome = errors.New("unknown outcome")
)

// ParseOutcome parses banned, throttled, ok or unreachable.
func ParseOutcome(s string) (Outcome, error) {
	switch o := Outcome(s); o {
	case Banned, Throttled, OK, Unreachable:
		return o, nil
	}
	return "", fmt.Errorf("%w %q: use banned, throttled, ok or unreachable", ErrBadOutcome, s)
}

// DNS limits a domain is held to: a name of at most MaxNameLength characters in its
// ASCII form (the trailing dot left out), of labels of at most MaxLabelLength. A domain
// longer than maxDomainBytes is refused before it is looked at: UTS #46 may map a longer
// input to a short name, but no crawler names a host that way.
const (
	MaxNameLength  = 253
	MaxLabelLength = 63
	maxDomainBytes = 4 * MaxNameLength
)

// Site is the registrable domain (eTLD+1) of domain, lower case, so that
// a.shop.example.com and shop.example.com are one site. IP literals, public suffixes
// (co.uk), names that are not valid host names and names over the DNS limits
// (MaxNameLength, MaxLabelLength) are refused; the error quotes at most the start of a
// long domain.
func Site(domain string) (string, error) {
	if len(domain) > maxDomainBytes {
		return "", fmt.Errorf("%w %s: %d bytes long; a DNS name has at most %d characters", ErrBadDomain, quoteDomain(domain), len(domain), MaxNameLength)
	}
	d := strings.TrimSuffix(strings.ToLower(domain), ".")
	if d == "" {
		return "", fmt.Errorf("%w: empty domain", ErrBadDomain)
	}
	if _, err := netip.ParseAddr(strings.Trim(d, "[]")); err == nil {
		return "", fmt.Errorf("%w %q: an IP address is not a site; report the host name the crawler asked for", ErrBadDomain, domain)
	}
	a, err := idna.Lookup.ToASCII(d)
	if err != nil {
		return "", fmt.Errorf("%w %s: %v", ErrBadDomain, quoteDomain(domain), err)
	}
	if err := checkDNSLengths(a); err != nil {
		return "", fmt.Errorf("%w %s: %v", ErrBadDomain, quoteDomain(domain), err)
	}
	site, err := publicsuffix.EffectiveTLDPlusOne(a)
	if err != nil {
		return "", fmt.Errorf("%w %q: a public suffix or a bare top-level name, not a site; report a domain under it, such as example.%s", ErrBadDomain, domain, a)
	}
	return site, nil
}

// checkDNSLengths checks a name in ASCII form against the DNS limits; IDNA look-up
// leaves them unchecked.
func checkDNSLengths(a string) error {
	if len(a) > MaxNameLength {
		return fmt.Errorf("%d characters in ASCII form; a DNS name has at most %d", len(a), MaxNameLength)
	}
	for label := range strings.SplitSeq(a, ".") {
		switch {
		case label == "":
			return errors.New("an empty label (two dots in a row, or a leading dot)")
		case len(label) > MaxLabelLength:
			return fmt.Errorf("label %s is %d characters in ASCII form; a DNS label has at most %d", quoteDomain(label), len(label), MaxLabelLength)
		}
	}
	return nil
}

// quoteDomain quotes domain for an error, cut to its first 64 bytes when longer.
func quoteDomain(domain string) string {
	const keep = 64
	if len(domain) <= keep {
		return strconv.Quote(domain)
	}
	return strconv.Quote(strings.ToValidUTF8(domain[:keep], "")) + "..."
}

// Policy is how long a proxy cools for a site after a ban, and when it is retired.
type Policy struct {
	// Cooldown is a first ban's cooldown, doubled by each further ban up to MaxCooldown.
	Cooldown, MaxCooldown time.Duration
	// RetireAfterSites: a proxy banned on at least this many distinct sites within
	// RetireWindow is retired; 0 never retires.
	RetireAfterSites int
	RetireWindow     time.Duration
}

// DefaultPolicy is the policy with the default durations.
var DefaultPolicy = Policy{Cooldown: DefaultCooldown, MaxCooldown: DefaultMaxCooldown,
	RetireAfterSites: DefaultRetireAfterSites, RetireWindow: DefaultRetireWindow}

// withDefaults fills unset durations and keeps MaxCooldown at least Cooldown.
func (p Policy) withDefaults() Policy {
	if p.Cooldown <= 0 {
		p.Cooldown = DefaultCooldown
	}
	if p.MaxCooldown <= 0 {
		p.MaxCooldown = DefaultMaxCooldown
	}
	p.MaxCooldown = max(p.MaxCooldown, p.Cooldown)
	if p.RetireWindow <= 0 {
		p.RetireWindow = DefaultRetireWindow
	}
	return p
}

// BanCooldown is the cooldown of the bans-th ban in a streak (bans >= 1).
func (p Policy) BanCooldown(bans int32) time.Duration {
	p = p.withDefaults()
	d := p.Cooldown
	for i := int32(1); i < bans && d < p.MaxCooldown; i++ {
		d *= 2
	}
	return min(d, p.MaxCooldown)
}

// Report is one crawler report about a proxy on a site.
type Report struct {
	Site    string
	Outcome Outcome
	// RetryAfter is a throttle's cooldown; zero means DefaultThrottle.
	RetryAfter time.Duration
}

// expires is when the entry is forgotten: a ban streak is remembered for MaxCooldown
// after its cooldown ends (a ban within that time doubles the next cooldown), and its
// last ban for RetireWindow (retirement counts it that long); a throttle alone not past
// its end.
func expires(c *v1alpha1.ProxyCooldown, p Policy) time.Time {
	if c.Bans > 0 {
		end := c.Until.Add(p.MaxCooldown)
		if c.LastBanned != nil {
			end = later(end, c.LastBanned.Add(p.RetireWindow))
		}
		return end
	}
	return c.Until.Time
}

// CooldownsAfter returns cds after r, taken at now, and whether anything changed. cds is not
// modified.
//   - banned: a ban of a pair that is not cooling from a ban adds one to its streak and
//     cools it for BanCooldown(streak); a ban reported while the pair still cools from one
//     is the same ban seen by requests in flight and changes nothing.
//   - throttled: cools the pair for RetryAfter (DefaultThrottle when zero), or keeps a
//     later end it already has; the streak is not touched.
//   - ok: after the cooldown ended, forgets the pair (the streak starts over); while it
//     still cools, changes nothing (a request started before the ban).
func CooldownsAfter(cds []v1alpha1.ProxyCooldown, r Report, now time.Time, p Policy) ([]v1alpha1.ProxyCooldown, bool) {
	p = p.withDefaults()
	i := slices.IndexFunc(cds, func(c v1alpha1.ProxyCooldown) bool { return c.Site == r.Site })
	var cur v1alpha1.ProxyCooldown
	if i >= 0 {
		cur = cds[i]
		if !now.Before(expires(&cur, p)) { // forgotten already
			cur = v1alpha1.ProxyCooldown{}
		}
	}
	cooling := now.Before(cur.Until.Time)
	next := cur
	next.Site = r.Site
	switch r.Outcome {
	case Banned:
		if cooling && cur.Bans > 0 {
			return cds, false
		}
		next.Bans++
		next.Until = metav1.NewTime(later(cur.Until.Time, now.Add(p.BanCooldown(next.Bans))))
		next.LastOutcome = v1alpha1.CooldownBanned
		next.LastBanned = &metav1.Time{Time: now.Truncate(time.Second)}
	case Throttled:
		d := r.RetryAfter
		if d <= 0 {
			d = DefaultThrottle
		}
		end := now.Add(d)
		if cooling && !end.After(cur.Until.Time) {
			return cds, false
		}
		next.Until = metav1.NewTime(end)
		next.LastOutcome = v1alpha1.CooldownThrottled
	case OK:
		if i < 0 || cooling {
			return cds, false
		}
		return slices.Delete(slices.Clone(cds), i, i+1), true
	default:
		return cds, false
	}
	// The API server keeps times to the second: round up, so a cooldown never ends early.
	next.Until = metav1.NewTime(ceilSecond(next.Until.Time))
	out := slices.Clone(cds)
	if i >= 0 {
		out[i] = next
	} else {
		out = append(out, next)
	}
	return out, true
}

// Prune drops the entries forgotten by now and, past MaxEntries, the soonest-expiring
// ones; it sorts the rest by site. It reports whether it dropped any.
func Prune(cds []v1alpha1.ProxyCooldown, now time.Time, p Policy) ([]v1alpha1.ProxyCooldown, bool) {
	p = p.withDefaults()
	out := slices.DeleteFunc(slices.Clone(cds), func(c v1alpha1.ProxyCooldown) bool { return !now.Before(expires(&c, p)) })
	if len(out) > MaxEntries {
		slices.SortStableFunc(out, func(a, b v1alpha1.ProxyCooldown) int { return expires(&b, p).Compare(expires(&a, p)) })
		out = out[:MaxEntries]
	}
	slices.SortFunc(out, func(a, b v1alpha1.ProxyCooldown) int { return strings.Compare(a.Site, b.Site) })
	return out, len(out) != len(cds)
}

// CoolingUntil is when the proxy with cds stops cooling for site, and whether it cools
// for it at now.
func CoolingUntil(cds []v1alpha1.ProxyCooldown, site string, now time.Time) (time.Time, bool) {
	for i := range cds {
		if cds[i].Site == site {
			return cds[i].Until.Time, now.Before(cds[i].Until.Time)
		}
	}
	return time.Time{}, false
}

// CoolingSites counts the sites the proxy with cds cools for at now.
func CoolingSites(cds []v1alpha1.ProxyCooldown, now time.Time) int {
	n := 0
	for i := range cds {
		if now.Before(cds[i].Until.Time) {
			n++
		}
	}
	return n
}

// NextEnd is the soonest cooldown end in cds after now; zero when none cools.
func NextEnd(cds []v1alpha1.ProxyCooldown, now time.Time) time.Time {
	var next time.Time
	for i := range cds {
		if u := cds[i].Until.Time; u.After(now) && (next.IsZero() || u.Before(next)) {
			next = u
		}
	}
	return next
}

// BannedSites are the sites of cds with a ban reported within p.RetireWindow before now
// (by LastBanned; one stamped after now, by a replica whose clock runs ahead, counts
// too), sorted, and the time the oldest of them leaves the window.
func BannedSites(cds []v1alpha1.ProxyCooldown, now time.Time, p Policy) ([]string, time.Time) {
	p = p.withDefaults()
	from := now.Add(-p.RetireWindow)
	var sites []string
	var leaves time.Time
	for i := range cds {
		if lb := cds[i].LastBanned; cds[i].Bans > 0 && lb != nil && lb.After(from) {
			sites = append(sites, cds[i].Site)
			if at := lb.Add(p.RetireWindow); leaves.IsZero() || at.Before(leaves) {
				leaves = at
			}
		}
	}
	slices.Sort(sites)
	return sites, leaves
}

// Retire reports whether a proxy with cds is to be retired at now by p: banned on at
// least p.RetireAfterSites distinct sites within p.RetireWindow. It returns those sites.
func Retire(cds []v1alpha1.ProxyCooldown, now time.Time, p Policy) ([]string, bool) {
	if p.RetireAfterSites <= 0 {
		return nil, false
	}
	sites, _ := BannedSites(cds, now, p)
	return sites, len(sites) >= p.RetireAfterSites
}

// Saturated is discovery's guard: a site is saturated when cooling of the matched
// proxies cool for it and that is more than pct percent of them, or all of them.
func Saturated(cooling, matched, pct int) bool {
	return cooling > 0 && (cooling*100 > pct*matched || cooling >= matched)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func ceilSecond(t time.Time) time.Time {
	if r := t.Truncate(time.Second); !r.Equal(t) {
		return r.Add(time.Second)
	}
	return t
}
