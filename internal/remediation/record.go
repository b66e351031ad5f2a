package remediation

import (
	"encoding/json"
	"fmt"
	"time"
)

// RecordAnnotation is where a controller may keep a Proxy's Record, as Record.Encode
// writes it, until the API has a status field for it.
const RecordAnnotation = "egress.hrajfrisbee.cz/remediation"

// Reasons: why a proxy is remediated (a Record's and the Remediating condition's
// reason), or why it is not although it is due (the condition's reason, False).
const (
	// ReasonBootTimeout: the proxy has not answered a probe within the boot timeout after
	// its instance started.
	ReasonBootTimeout = "BootTimeout"
	// ReasonUnhealthy: the proxy answered once, then failed its probes for the unhealthy
	// timeout.
	ReasonUnhealthy = "Unhealthy"
	// ReasonTooManyUnhealthy: the proxy is due, but more of its group than maxUnhealthy
	// are unhealthy: the brake holds remediation (cluster-api's reason for the same).
	ReasonTooManyUnhealthy = "TooManyUnhealthy"
	// ReasonProbeTargetDown: the probe target itself is down, so failed probes say
	// nothing about the proxy: nothing is remediated.
	ReasonProbeTargetDown = "ProbeTargetDown"
)

// ConditionRemediating is the condition type a Decision's Condition carries: True (reason
// BootTimeout or Unhealthy) while remediation is under way, False (TooManyUnhealthy,
// ProbeTargetDown) while a due remediation is held, absent otherwise.
const ConditionRemediating = "Remediating"

// Action is what remediation does to a proxy's instance.
type Action string

const (
	// ActionReboot restarts the instance in place (the provider's Reboot).
	ActionReboot Action = "Reboot"
	// ActionReplace deletes the instance and builds a new one (a pool child: the pool's
	// surge-first replacement).
	ActionReplace Action = "Replace"
)

// Record is what remediation remembers of a proxy between passes: the last attempt made
// for the fault under way. A controller persists it (RecordAnnotation, or a status field
// of the same JSON) and gives it back in State.Record. Its times are UTC, whole seconds,
// so its JSON is the same after a round trip.
type Record struct {
	// Reason is ReasonBootTimeout or ReasonUnhealthy, of the last attempt.
	Reason string `json:"reason"`
	// Attempt counts the attempts for this fault, 1 for the first.
	Attempt int32 `json:"attempt"`
	// Action is the last attempt's.
	Action Action `json:"action"`
	// At is when the last attempt was decided.
	At time.Time `json:"at"`
	// FaultSince is when the fault began: the instance's start for BootTimeout, the
	// first failure the Healthy condition shows for Unhealthy. The time from it to the
	// proxy being healthy again is the fault-to-serving figure.
	FaultSince time.Time `json:"faultSince"`
}

// Encode is r as JSON, for RecordAnnotation.
func (r Record) Encode() string {
	b, err := json.Marshal(r)
	if err != nil { // a struct of strings, numbers and times always encodes
		panic(err)
	}
	return string(b)
}

// ParseRecord reads a record as Encode wrote it; "" is no record. The error names
// RecordAnnotation and what is wrong.
func ParseRecord(s string) (*Record, error) {
	if s == "" {
		return nil, nil
	}
	var r Record
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", RecordAnnotation, err)
	}
	switch {
	case r.Reason != ReasonBootTimeout && r.Reason != ReasonUnhealthy:
		return nil, fmt.Errorf("annotation %s: reason %q: want %s or %s", RecordAnnotation, r.Reason, ReasonBootTimeout, ReasonUnhealthy)
	case r.Action != ActionReboot && r.Action != ActionReplace:
		return nil, fmt.Errorf("annotation %s: action %q: want %s or %s", RecordAnnotation, r.Action, ActionReboot, ActionReplace)
	case r.Attempt < 1:
		return nil, fmt.Errorf("annotation %s: attempt %d: want 1 or more", RecordAnnotation, r.Attempt)
	case r.At.IsZero():
		return nil, fmt.Errorf("annotation %s: at is missing", RecordAnnotation)
	}
	return &r, nil
}

// stamp is t as a Record keeps it.
func stamp(t time.Time) time.Time { return t.UTC().Truncate(time.Second) }
