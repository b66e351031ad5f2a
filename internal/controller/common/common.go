// Package common holds what several of the operator's controllers share: the kstatus
// conditions (kstatus.go), the Event actions and the reasons, conditions and annotations
// more than one controller writes or reads (events.go), and a few small rules.
package common

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ProbeTargetWatch is what remediation asks the health engine (health.Engine): whether
// the probe target itself is down now, since when, and when it last came back.
type ProbeTargetWatch interface {
	ProbeTargetDown() (down bool, since time.Time)
	ProbeTargetUpSince() time.Time
}

// MaxNamed is the most children (or Secrets, or addresses) a message names in each group.
const MaxNamed = 10

// NameList joins names, at most MaxNamed of them: "a, b and 3 more"; "none" when empty.
func NameList(names []string) string {
	switch {
	case len(names) == 0:
		return "none"
	case len(names) > MaxNamed:
		return strings.Join(names[:MaxNamed], ", ") + fmt.Sprintf(" and %d more", len(names)-MaxNamed)
	}
	return strings.Join(names, ", ")
}

// PoolGauge is a per-pool gauge: labelled with the pool's namespace and name only.
func PoolGauge(opts prometheus.GaugeOpts) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(opts, []string{"namespace", "name"})
}
