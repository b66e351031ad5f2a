package remediation

import (
	"fmt"
	"regexp"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// Defaults of a Policy; each can be overridden by the caller (a flag, a field).
const (
	// DefaultBootTimeout: emulated guests here answer their first probe 1–3 minutes
	// after their instance starts, cloud VMs in under one; ten minutes is well past the
	// slowest boot seen, so a slow boot is never taken for a dead one, and a guest whose
	// network never came up is mended within a quarter of an hour.
	DefaultBootTimeout = 10 * time.Minute
	// DefaultUnhealthyTimeout: the health engine needs 3 failed probes 30 s apart to take
	// a proxy out of rotation; five more minutes of failures rule out a blip of the
	// network or a restart of the proxy's process, while a dead proxy stays out of the
	// farm only a few minutes before it is mended.
	DefaultUnhealthyTimeout = 5 * time.Minute
	// DefaultFirstWait is the wait after the first attempt before it counts as failed:
	// a rebooted guest boots in 1–3 minutes under emulation, so three minutes let the
	// slowest of them answer a probe (the engine probes every second for two minutes
	// after a proxy turns Running).
	DefaultFirstWait = 3 * time.Minute
	// DefaultMaxWait caps the doubling waits (3, 6, 12, 24, 30, 30… minutes): a proxy
	// that no attempt mends costs at most two new VMs an hour, and one that could be
	// mended is not left dead for more than half an hour between attempts.
	DefaultMaxWait = 30 * time.Minute
	// DefaultResetAfter: a proxy healthy for this long again has been mended, and its
	// record is dropped (the next fault starts from a reboot and the first wait). It is
	// longer than the unhealthy timeout and the first wait together, so a proxy that
	// comes up only to fail again keeps climbing to replacement and longer waits instead
	// of being rebooted every few minutes.
	DefaultResetAfter = 10 * time.Minute
	// MaxWaitLimit bounds any wait given in a Policy.
	MaxWaitLimit = 24 * time.Hour
)

// DefaultMaxUnhealthy: a group with more than 40% of its proxies unhealthy at once
// (2 of 5, 4 of 10) is more likely suffering a host, network or probe-target outage
// than bad VMs, and rebooting or replacing its proxies would only add load to whatever
// is failing. Up to 40% (rounded up, so a group of one or two is still mended) are bad
// VMs, which remediation mends.
var DefaultMaxUnhealthy = intstr.FromString("40%")

// Policy is how remediation decides: the timeouts after which a proxy is remediated, the
// waits between attempts, and the default brake.
type Policy struct {
	// BootTimeout: a proxy whose instance has run this long without answering a probe is
	// remediated (reason BootTimeout). State.BootTimeout overrides it per proxy.
	BootTimeout time.Duration
	// UnhealthyTimeout: a proxy that answered since its instance started and has failed
	// its probes (Healthy=False) this long is remediated (reason Unhealthy).
	// State.UnhealthyTimeout overrides it per proxy.
	UnhealthyTimeout time.Duration
	// FirstWait is the wait after attempt 1; the wait after attempt n is FirstWait·2^(n-1),
	// at most MaxWait. A proxy still not healthy when its wait ends gets the next attempt.
	FirstWait, MaxWait time.Duration
	// ResetAfter: a proxy healthy this long after an attempt has its record dropped.
	ResetAfter time.Duration
	// MaxUnhealthy is the brake of a group without a GroupSpec of its own.
	MaxUnhealthy intstr.IntOrString
}

// DefaultPolicy is the Policy of the Default constants.
func DefaultPolicy() Policy {
	return Policy{BootTimeout: DefaultBootTimeout, UnhealthyTimeout: DefaultUnhealthyTimeout,
		FirstWait: DefaultFirstWait, MaxWait: DefaultMaxWait, ResetAfter: DefaultResetAfter,
		MaxUnhealthy: DefaultMaxUnhealthy}
}

// withDefaults fills the zero fields of p from DefaultPolicy.
func (p Policy) withDefaults() Policy {
	d := DefaultPolicy()
	for _, f := range []struct{ v, def *time.Duration }{{&p.BootTimeout, &d.BootTimeout},
		{&p.UnhealthyTimeout, &d.UnhealthyTimeout}, {&p.FirstWait, &d.FirstWait},
		{&p.MaxWait, &d.MaxWait}, {&p.ResetAfter, &d.ResetAfter}} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	if p.MaxUnhealthy == (intstr.IntOrString{}) {
		p.MaxUnhealthy = d.MaxUnhealthy
	}
	return p
}

// Validate checks p's durations (zero takes the default; negative or over a day is
// refused), naming the field.
func (p Policy) Validate() error {
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"BootTimeout", p.BootTimeout}, {"UnhealthyTimeout", p.UnhealthyTimeout}, {"FirstWait", p.FirstWait},
		{"MaxWait", p.MaxWait}, {"ResetAfter", p.ResetAfter}} {
		if f.v < 0 || f.v > MaxWaitLimit {
			return fmt.Errorf("remediation policy %s %v: give a duration from 0 (the default) to %v", f.name, f.v, MaxWaitLimit)
		}
	}
	if p.MaxWait != 0 && p.FirstWait > p.MaxWait {
		return fmt.Errorf("remediation policy FirstWait %v is longer than MaxWait %v", p.FirstWait, p.MaxWait)
	}
	if p.MaxUnhealthy != (intstr.IntOrString{}) {
		if _, err := MaxUnhealthyCount(p.MaxUnhealthy, 1); err != nil {
			return fmt.Errorf("remediation policy MaxUnhealthy: %w", err)
		}
	}
	return nil
}

// Wait is how long after attempt n (1 for the first) the proxy must be healthy again
// before the attempt counts as failed: FirstWait doubled n-1 times, at most MaxWait.
func (p Policy) Wait(n int32) time.Duration {
	p = p.withDefaults()
	w := p.FirstWait
	for i := int32(1); i < n && w < p.MaxWait; i++ {
		w *= 2
	}
	return min(w, p.MaxWait)
}

var percentRE = regexp.MustCompile(`^[0-9]{1,3}%$`)

// ParseMaxUnhealthy parses a brake as a flag gives it: a count such as 2 or a
// percentage of the group's size from 0% to 100% such as 40%. field names the flag or
// field in the error.
func ParseMaxUnhealthy(field, s string) (intstr.IntOrString, error) {
	v := intstr.FromString(s)
	if n, err := strconv.Atoi(s); err == nil {
		v = intstr.FromInt(n)
	} else if !percentRE.MatchString(s) {
		return intstr.IntOrString{}, fmt.Errorf("%s %q: give a count of proxies such as 2 or a percentage of the group such as 40%%", field, s)
	}
	if _, err := MaxUnhealthyCount(v, 1); err != nil {
		return intstr.IntOrString{}, fmt.Errorf("%s: %w", field, err)
	}
	return v, nil
}

// MaxUnhealthyCount is how many unhealthy proxies a group of size may have before its
// brake holds remediation: v as a count, or as a percentage of size rounded UP (40% of 5
// is 2, of 3 is 2, of 1 is 1). cluster-api's MachineHealthCheck rounds down; rounding
// up here keeps a group of one or two proxies (a standalone Proxy alone on its host)
// mended under a percentage below 100%. A count of 0 holds every remediation.
func MaxUnhealthyCount(v intstr.IntOrString, size int) (int, error) {
	if v.Type == intstr.String && !percentRE.MatchString(v.StrVal) {
		return 0, fmt.Errorf("maxUnhealthy %q: give a count of proxies such as 2 or a percentage of the group such as 40%%", v.StrVal)
	}
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, size, true)
	if err != nil {
		return 0, fmt.Errorf("maxUnhealthy %s: %w", v.String(), err)
	}
	if v.Type == intstr.Int && n < 0 {
		return 0, fmt.Errorf("maxUnhealthy %d: give 0 or more proxies", v.IntVal)
	}
	if v.Type == intstr.String {
		if pct, _ := strconv.Atoi(v.StrVal[:len(v.StrVal)-1]); pct > 100 {
			return 0, fmt.Errorf("maxUnhealthy %s: give a percentage from 0%% to 100%%", v.StrVal)
		}
	}
	return n, nil
}
