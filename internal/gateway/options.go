package gateway

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The username grammar. A proxy URL's user name is the caller's own name followed by
// options, each introduced by OptionSeparator:
//
//	USER+ns=crawlers+pool=news+session=abc123+sesstime=10m+strict+ip=4
//	USER+zone=europe-west1-b+labels=tier=gold,team!=x
//
// "+" and "=" need no percent-encoding in a URL's userinfo (RFC 3986 sub-delims) and no
// Kubernetes name (a DNS-1123 label or subdomain) nor a session id can contain them, so
// every option value round-trips as it is. An option's name ends at its first "="; the
// labels option's value, a label selector, may hold more (no label key or value has a
// "+").
const (
	OptionSeparator = "+"
	ValueSeparator  = "="
)

// The option names.
const (
	OptNamespace  = "ns"
	OptPool       = "pool"
	OptSession    = "session"
	OptSessionTTL = "sesstime"
	OptStrict     = "strict"
	OptSoft       = "soft"
	OptFamily     = "ip"
	OptProvider   = "provider"
	OptRegion     = "region"
	OptZone       = "zone"
	OptLabels     = "labels"
)

// MaxPlacementLength bounds a provider, region or zone value; MaxLabelsLength a labels
// selector.
const (
	MaxPlacementLength = 63
	MaxLabelsLength    = 512
)

const (
	// DefaultSessionTTL is a session's sliding idle lifetime when sesstime is not given.
	DefaultSessionTTL = 10 * time.Minute
	// MaxSessionTTL is the longest sesstime accepted.
	MaxSessionTTL = 24 * time.Hour
	// MaxSessionIDLength bounds a session id.
	MaxSessionIDLength = 128
	// MaxUserLength bounds the user part.
	MaxUserLength = 128
)

// Family is the IP family a caller asks its exit's egress address to have.
type Family int

// The families: FamilyAny (no ip option), FamilyIPv4 (ip=4), FamilyIPv6 (ip=6).
const (
	FamilyAny  Family = 0
	FamilyIPv4 Family = 4
	FamilyIPv6 Family = 6
)

// Options are what a caller asks for in its proxy user name.
type Options struct {
	// User is the part before the first option: the caller's own name, for the log. It
	// plays no part in authentication (the password does) nor in the choice.
	User string
	// Namespace limits the choice to exits in one namespace; empty: any namespace the
	// caller's credential may use.
	Namespace string
	// Pool limits the choice to one ProxyPool's exits; empty: any exit.
	Pool string
	// Provider, Region and Zone limit the choice to exits with that spec.provider,
	// spec.placement.region or spec.placement.zone, as pick's ?provider=, ?region= and
	// ?zone= do; empty: any.
	Provider, Region, Zone string
	// Labels is a Kubernetes label selector over the exits' Proxy labels, as pick's
	// ?labelSelector= and kubectl -l take it (tier=gold,team!=x, tier in (a,b), !canary);
	// empty: any.
	Labels string
	// Session makes the choice sticky: every request or tunnel with the same session goes
	// to the same exit while it is available. Empty: each new request or tunnel rotates.
	Session string
	// SessionTTL is the session's sliding idle lifetime; 0 means DefaultSessionTTL.
	SessionTTL time.Duration
	// Strict keeps a session on its exit: when that exit is unavailable the request fails
	// (502) instead of moving to another exit, as a soft session (the default) does.
	Strict bool
	// Family asks for an exit whose egress address is IPv4 or IPv6.
	Family Family
}

// TTL is the session's idle lifetime with the default applied.
func (o Options) TTL() time.Duration {
	if o.SessionTTL == 0 {
		return DefaultSessionTTL
	}
	return o.SessionTTL
}

// ErrBadOptions is the class of every error ParseOptions and Options.Validate return.
var ErrBadOptions = errors.New("bad proxy user name")

func optionError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadOptions, fmt.Sprintf(format, args...))
}

// ParseOptions reads a proxy user name. Its errors wrap ErrBadOptions and name the option
// at fault.
func ParseOptions(username string) (Options, error) {
	parts := strings.Split(username, OptionSeparator)
	o := Options{User: parts[0]}
	seen := map[string]bool{}
	soft := false
	for _, part := range parts[1:] {
		name, value, hasValue := strings.Cut(part, ValueSeparator)
		if name == "" {
			return Options{}, optionError("empty option in %q (two %q in a row, or one at the end)", username, OptionSeparator)
		}
		if seen[name] {
			return Options{}, optionError("option %s given twice", name)
		}
		seen[name] = true
		flag := name == OptStrict || name == OptSoft
		if flag && hasValue {
			return Options{}, optionError("option %s takes no value", name)
		}
		if !flag && value == "" && isKnownOption(name) {
			return Options{}, optionError("option %s needs a value (%s%s...)", name, name, ValueSeparator)
		}
		switch name {
		case OptNamespace:
			o.Namespace = value
		case OptPool:
			o.Pool = value
		case OptProvider:
			o.Provider = value
		case OptRegion:
			o.Region = value
		case OptZone:
			o.Zone = value
		case OptLabels:
			o.Labels = value
		case OptSession:
			o.Session = value
		case OptSessionTTL:
			d, err := parseTTL(value)
			if err != nil {
				return Options{}, err
			}
			o.SessionTTL = d
		case OptStrict:
			o.Strict = true
		case OptSoft:
			soft = true
		case OptFamily:
			switch value {
			case "4":
				o.Family = FamilyIPv4
			case "6":
				o.Family = FamilyIPv6
			default:
				return Options{}, optionError("option %s must be 4 or 6, not %q", OptFamily, value)
			}
		default:
			return Options{}, optionError("unknown option %q (known: %s)", name, strings.Join(knownOptions, ", "))
		}
	}
	if o.Strict && soft {
		return Options{}, optionError("options %s and %s exclude each other", OptStrict, OptSoft)
	}
	if err := o.Validate(); err != nil {
		return Options{}, err
	}
	return o, nil
}

var knownOptions = []string{OptNamespace, OptPool, OptProvider, OptRegion, OptZone, OptLabels, OptSession, OptSessionTTL, OptStrict, OptSoft, OptFamily}

func isKnownOption(name string) bool {
	for _, k := range knownOptions {
		if k == name {
			return true
		}
	}
	return false
}

func parseTTL(value string) (time.Duration, error) {
	d, err := time.ParseDuration(value)
	if err != nil {
		return 0, optionError("option %s: %q is not a duration such as 90s, 10m or 1h", OptSessionTTL, value)
	}
	if d < time.Second {
		// 0 would read as "not given": refuse it here, where it was given.
		return 0, optionError("option %s: %s is not a whole number of seconds from 1s to %s", OptSessionTTL, value, formatTTL(MaxSessionTTL))
	}
	return d, nil
}

// Validate checks every field as ParseOptions would; errors wrap ErrBadOptions and name
// the option.
func (o Options) Validate() error {
	if len(o.User) > MaxUserLength {
		return optionError("the user part is longer than %d characters", MaxUserLength)
	}
	if i := strings.IndexFunc(o.User, func(r rune) bool { return !isSessionRune(r) }); i >= 0 {
		return optionError("the user part %q has %q; use letters, digits, '-', '.', '_' or '~'", o.User, o.User[i])
	}
	if o.Namespace != "" {
		if errs := validation.IsDNS1123Label(o.Namespace); len(errs) > 0 {
			return optionError("option %s: %q is not a namespace name: %s", OptNamespace, o.Namespace, strings.Join(errs, "; "))
		}
	}
	if o.Pool != "" {
		if errs := validation.IsDNS1123Subdomain(o.Pool); len(errs) > 0 {
			return optionError("option %s: %q is not a pool name: %s", OptPool, o.Pool, strings.Join(errs, "; "))
		}
	}
	for _, p := range []struct{ name, value string }{{OptProvider, o.Provider}, {OptRegion, o.Region}, {OptZone, o.Zone}} {
		if len(p.value) > MaxPlacementLength {
			return optionError("option %s: longer than %d characters", p.name, MaxPlacementLength)
		}
		if i := strings.IndexFunc(p.value, func(r rune) bool { return !isSessionRune(r) }); i >= 0 {
			return optionError("option %s: %q has %q; use letters, digits, '-', '.', '_' or '~'", p.name, p.value, p.value[i])
		}
	}
	if o.Labels != "" {
		if len(o.Labels) > MaxLabelsLength {
			return optionError("option %s: longer than %d characters", OptLabels, MaxLabelsLength)
		}
		if strings.Contains(o.Labels, OptionSeparator) {
			return optionError("option %s: %q has %q, which separates options", OptLabels, o.Labels, OptionSeparator)
		}
		if _, err := labels.Parse(o.Labels); err != nil {
			return optionError("option %s: %q is not a label selector: %v", OptLabels, o.Labels, err)
		}
	}
	if len(o.Session) > MaxSessionIDLength {
		return optionError("option %s: longer than %d characters", OptSession, MaxSessionIDLength)
	}
	if i := strings.IndexFunc(o.Session, func(r rune) bool { return !isSessionRune(r) }); i >= 0 {
		return optionError("option %s: %q has %q; use letters, digits, '-', '.', '_' or '~'", OptSession, o.Session, o.Session[i])
	}
	if o.SessionTTL != 0 {
		if o.Session == "" {
			return optionError("option %s needs a %s", OptSessionTTL, OptSession)
		}
		if d := o.SessionTTL; d < time.Second || d > MaxSessionTTL || d%time.Second != 0 {
			return optionError("option %s: %s is not a whole number of seconds from 1s to %s", OptSessionTTL, d, formatTTL(MaxSessionTTL))
		}
	}
	if o.Strict && o.Session == "" {
		return optionError("option %s needs a %s", OptStrict, OptSession)
	}
	switch o.Family {
	case FamilyAny, FamilyIPv4, FamilyIPv6:
	default:
		return optionError("option %s must be 4 or 6, not %d", OptFamily, o.Family)
	}
	return nil
}

// isSessionRune: a session id and the user part take RFC 3986's unreserved characters,
// which need no percent-encoding anywhere in a URL.
func isSessionRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
		r == '-' || r == '.' || r == '_' || r == '~'
}

// Format writes o as a user name ParseOptions reads back to o. Options are written in a
// fixed order; soft (the default) and a default sesstime are left out.
func (o Options) Format() string {
	var b strings.Builder
	b.WriteString(o.User)
	opt := func(name, value string) {
		b.WriteString(OptionSeparator)
		b.WriteString(name)
		if value != "" {
			b.WriteString(ValueSeparator)
			b.WriteString(value)
		}
	}
	if o.Namespace != "" {
		opt(OptNamespace, o.Namespace)
	}
	if o.Pool != "" {
		opt(OptPool, o.Pool)
	}
	if o.Provider != "" {
		opt(OptProvider, o.Provider)
	}
	if o.Region != "" {
		opt(OptRegion, o.Region)
	}
	if o.Zone != "" {
		opt(OptZone, o.Zone)
	}
	if o.Labels != "" {
		opt(OptLabels, o.Labels)
	}
	if o.Session != "" {
		opt(OptSession, o.Session)
	}
	if o.SessionTTL != 0 {
		opt(OptSessionTTL, formatTTL(o.SessionTTL))
	}
	if o.Strict {
		opt(OptStrict, "")
	}
	if o.Family != FamilyAny {
		opt(OptFamily, strconv.Itoa(int(o.Family)))
	}
	return b.String()
}

// formatTTL writes d in its largest whole unit: 2h, 10m, 90s.
func formatTTL(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	default:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
}
