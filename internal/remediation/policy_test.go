package remediation

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// A percentage rounds up, so a group of one or two is still mended below 100%.
func TestMaxUnhealthyCount(t *testing.T) {
	for _, tc := range []struct {
		v    intstr.IntOrString
		size int
		want int
	}{
		{DefaultMaxUnhealthy, 5, 2}, {DefaultMaxUnhealthy, 3, 2}, {DefaultMaxUnhealthy, 2, 1},
		{DefaultMaxUnhealthy, 1, 1}, {DefaultMaxUnhealthy, 0, 0}, {DefaultMaxUnhealthy, 10, 4},
		{intstr.FromString("100%"), 7, 7}, {intstr.FromString("0%"), 7, 0},
		{intstr.FromInt32(2), 5, 2}, {intstr.FromInt32(2), 1, 2}, {intstr.FromInt32(0), 9, 0},
	} {
		if got, err := MaxUnhealthyCount(tc.v, tc.size); err != nil || got != tc.want {
			t.Errorf("MaxUnhealthyCount(%s, %d) = %d, %v; want %d", tc.v.String(), tc.size, got, err, tc.want)
		}
	}
}

func TestParseMaxUnhealthy(t *testing.T) {
	for in, want := range map[string]intstr.IntOrString{"0": intstr.FromInt(0), "3": intstr.FromInt(3), "40%": intstr.FromString("40%"), "100%": intstr.FromString("100%")} {
		if got, err := ParseMaxUnhealthy("--max-unhealthy", in); err != nil || got != want {
			t.Errorf("ParseMaxUnhealthy(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for in, msg := range map[string]string{
		"-1":   "--max-unhealthy: maxUnhealthy -1: give 0 or more proxies",
		"101%": "--max-unhealthy: maxUnhealthy 101%: give a percentage from 0% to 100%",
		"40":   "", // a count, valid
		"four": `--max-unhealthy "four": give a count of proxies such as 2 or a percentage of the group such as 40%`,
		"4 %":  `--max-unhealthy "4 %"`,
		"":     `--max-unhealthy ""`,
	} {
		_, err := ParseMaxUnhealthy("--max-unhealthy", in)
		if msg == "" {
			if err != nil {
				t.Errorf("ParseMaxUnhealthy(%q): %v", in, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseMaxUnhealthy(%q) = %v, want an error saying %q", in, err, msg)
		}
	}
}

// A group whose brake cannot be read is held, with an error naming the group and the
// field; the other groups are decided all the same.
func TestBadMaxUnhealthy(t *testing.T) {
	for _, tc := range []struct {
		v   intstr.IntOrString
		msg string
	}{
		{intstr.FromString("40"), `remediation group pool/default/news: spec.remediation.maxUnhealthy: maxUnhealthy "40": give a count of proxies such as 2 or a percentage of the group such as 40%`},
		{intstr.FromInt32(-2), "remediation group pool/default/news: spec.remediation.maxUnhealthy: maxUnhealthy -2: give 0 or more proxies"},
		{intstr.FromString("150%"), "remediation group pool/default/news: spec.remediation.maxUnhealthy: maxUnhealthy 150%: give a percentage from 0% to 100%"},
	} {
		in := Input{Now: at(2 * time.Hour), Proxies: []State{member("news", 0, false), member("shop", 0, false)},
			Groups: map[string]GroupSpec{PoolGroup("default", "news"): {MaxUnhealthy: tc.v, Field: "spec.remediation.maxUnhealthy"}}}
		res, err := Plan(in)
		if err == nil || err.Error() != tc.msg {
			t.Errorf("maxUnhealthy %s: error %v, want %q", tc.v.String(), err, tc.msg)
		}
		news, shop := res.Decisions[0], res.Decisions[1]
		wantCond := "group pool/default/news: 1 of 1 unhealthy; remediation held: " + strings.TrimPrefix(tc.msg, "remediation group pool/default/news: ")
		if news.Action != "" || !news.Held || news.Condition.Message != wantCond || res.Groups[0].Err == nil {
			t.Errorf("maxUnhealthy %s: the news child %+v, want held, saying %q", tc.v.String(), news, wantCond)
		}
		if shop.Action != ActionReboot {
			t.Errorf("maxUnhealthy %s on news: the shop child %+v, want rebooted", tc.v.String(), shop)
		}
	}
	in := Input{Now: t0, Policy: Policy{MaxUnhealthy: intstr.FromString("lots")}, Proxies: []State{member("news", 0, true), member("shop", 0, true)}}
	_, err := Plan(in)
	var msgs []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		msgs = append(msgs, e.Error())
	}
	if len(msgs) != 2 || !strings.Contains(msgs[0], "pool/default/news: default maxUnhealthy") || !strings.Contains(msgs[1], "pool/default/shop") {
		t.Errorf("a bad default brake: %q; want an error per group naming the default", msgs)
	}
}

func TestPolicyValidate(t *testing.T) {
	if err := DefaultPolicy().Validate(); err != nil {
		t.Errorf("the default policy: %v", err)
	}
	if err := (Policy{}).Validate(); err != nil {
		t.Errorf("the zero policy: %v", err)
	}
	for p, msg := range map[*Policy]string{
		{BootTimeout: -time.Second}:                     "remediation policy BootTimeout -1s: give a duration from 0 (the default) to 24h0m0s",
		{UnhealthyTimeout: 25 * time.Hour}:              "remediation policy UnhealthyTimeout 25h0m0s",
		{FirstWait: time.Hour, MaxWait: time.Minute}:    "remediation policy FirstWait 1h0m0s is longer than MaxWait 1m0s",
		{ResetAfter: -1}:                                "remediation policy ResetAfter",
		{MaxUnhealthy: intstr.FromString("x")}:          `remediation policy MaxUnhealthy: maxUnhealthy "x"`,
		{MaxWait: -time.Minute, FirstWait: time.Minute}: "remediation policy MaxWait -1m0s",
	} {
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("Validate(%+v) = %v, want an error saying %q", *p, err, msg)
		}
	}
}
